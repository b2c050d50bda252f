"""Known calls with a distinct request id on every call (tritonclient
``infer(..., request_id=...)``, as many real clients do), end to end: the native data path
serves them (a lesson is taught without the id: ``record_patch.h`` WithClientId writes each
call's id into its REQUEST record, ``known_answer.h`` into its response).

From 8 client threads at once, each call with its own id (empty, short, long, UTF-8): every
answer is right, each response's ``id`` is its request's, the model saw each call's own id
(``request_id()``, echoed as an output), and the native counters
(``triton_mp_frontend_native_known_calls_total``) show the calls sent and answered without
Python (before this, a lesson was per id: none of these calls took the native path).
"""

from __future__ import annotations

import hashlib
import re
import threading
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory
from triton_mp.frontend.native import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

ECHO = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "ID", data_type: TYPE_UINT8, dims: [ 64 ] }
]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [{ count: 1, kind: KIND_CPU }]
"""
ECHO_MODEL = """
import hashlib
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            digest = hashlib.sha256(r.request_id().encode()).hexdigest().encode()
            rid = np.frombuffer(digest, np.uint8).reshape(1, 64).repeat(x.shape[0], 0)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x * 2), pb_utils.Tensor("ID", rid)]))
        return out
"""
THREADS = 8
CALLS = 40  # per thread


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("request_ids") / "repo"
    write_python_model(repo, "id_echo_py", ECHO, ECHO_MODEL)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def _known(server: ServerProcess) -> dict[str, float]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    pattern = r'^triton_mp_frontend_native_known_calls_total\{outcome="(\w+)"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}


def request_id(t: int, i: int) -> str:
    """Call i of thread t's id: empty, short, long or UTF-8 by turns, each distinct."""
    kind = i % 4
    if kind == 0 and t == 0:
        return ""  # NOTE: no id at all (thread 0's every fourth call)
    if kind == 1:
        return f"{t}-{i}"
    if kind == 2:
        return f"{t}-{i}-" + "x" * 300  # NOTE: a two-byte length varint
    return f"请求-{t}-{i}-\U0001f600"


def _call(client: grpcclient.InferenceServerClient, rid: str, seed: int) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4) + seed
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    res = client.infer("id_echo_py", [inp], request_id=rid)
    assert res.get_response().id == rid
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x * 2)
    digest = hashlib.sha256(rid.encode()).hexdigest().encode()
    assert res.as_numpy("ID").tobytes() == digest  # NOTE: the model saw this call's own id


def test_calls_with_distinct_ids_take_the_native_path(server: ServerProcess) -> None:
    client = server.client()
    for i in range(4):  # NOTE: the first calls teach (Python answers them)
        _call(client, f"warm-{i}", i)
    before = _known(server)
    errors: list[BaseException] = []

    def client_thread(t: int) -> None:
        try:
            c = server.client()
            for i in range(CALLS):
                _call(c, request_id(t, i), t * 100 + i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client_thread, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    after = _known(server)
    total = THREADS * CALLS
    sent = after["sent"] - before.get("sent", 0)
    answered = after["answered"] - before.get("answered", 0)
    # NOTE: every call's form is known; a few may find no ids or room and go to Python
    assert sent >= total * 9 // 10, (before, after)
    assert answered >= total * 3 // 4, (before, after)
