"""The frontend's inbox read by the native answer thread (``frontend/native/answer_thread.h``),
end to end with tritonclient: the known calls' plain answers are served and handed to gRPC
by the C++ thread, and everything else still reaches Python through its queue.

With add_sub_py (the bench's model: dynamic batching, so batched answers) and a model that
fails every request with a negative input (errors: Python's words), from 8 client threads at
once: every answer is right, the errors are the model's, most calls were answered by the
thread (``thread_served``) while the metrics' own ``StatsReply`` and the errors reached
Python through its queue (``thread_to_python``), the statistics count every call, the tensor
bytes counted equal the calls' (settled exactly), and the server stops cleanly (the thread
stopped, its owned calls handed back).
"""

from __future__ import annotations

import re
import shutil
import threading
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import REPO_ROOT, ServerProcess, counted, server_factory
from triton_mp.frontend.native import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

PICKY = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
PICKY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0] < 0:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative")))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return out
"""
THREADS = 8
CALLS = 30  # per thread and model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("answer_thread") / "repo"
    write_python_model(repo, "picky_py", PICKY, PICKY_MODEL)
    shutil.copytree(REPO_ROOT / "bench" / "model_repository" / "add_sub_py", repo / "add_sub_py")
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def _samples(server: ServerProcess, metric: str, label: str) -> dict[str, float]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    pattern = rf'^{metric}\{{{label}="(\w+)"\}} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}


def _add_sub(client: grpcclient.InferenceServerClient, seed: int) -> None:
    a = np.full((1, 16), seed, np.float32)
    b = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
              grpcclient.InferInput("INPUT1", [1, 16], "FP32")]  # fmt: skip
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    res = client.infer("add_sub_py", inputs, request_id=str(seed))
    assert res.get_response().id == str(seed)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def _picky(client: grpcclient.InferenceServerClient, value: float) -> None:
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    if value < 0:
        with pytest.raises(InferenceServerException, match="negative"):
            client.infer("picky_py", [x])
    else:
        assert float(client.infer("picky_py", [x]).as_numpy("OUTPUT0")[0]) == value * 2


def test_the_thread_serves_known_answers_and_python_gets_the_rest(server: ServerProcess) -> None:
    errors: list[BaseException] = []

    def client_thread(t: int) -> None:
        try:
            client = server.client()
            for i in range(CALLS):
                _add_sub(client, t * 1000 + i)
                _picky(client, -1.0 if i % 5 == 4 else float(i))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client_thread, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    total = THREADS * CALLS
    known = _samples(server, "triton_mp_frontend_native_known_calls_total", "outcome")
    assert known["thread_served"] >= total // 2, known  # NOTE: the first few teach
    assert known["answered"] >= known["thread_served"], known
    assert known["thread_to_python"] >= THREADS * CALLS // 5, known  # NOTE: the errors at least
    client = server.client()
    for model, want in (("add_sub_py", total), ("picky_py", total)):
        st = counted(
            lambda m=model: client.get_inference_statistics(m).model_stats[0],  # type: ignore[misc]
            lambda s, w=want: s.inference_stats.success.count + s.inference_stats.fail.count >= w,  # type: ignore[misc]
            f"{want} counted",
        )
        assert st.inference_stats.success.count + st.inference_stats.fail.count == want
    tensor = _samples(server, "triton_mp_frontend_tensor_bytes_total", "direction")
    # NOTE: add_sub_py: 2 x 64 B in, picky_py: 4 B in, for every call (either path)
    assert tensor["in"] == total * (2 * 64 + 4), tensor
    # NOTE: outputs: add_sub_py's 2 x 64 B, picky_py's successes' 4 B
    assert tensor["out"] + tensor.get("out_in_place", 0) == total * 128 + (total * 4 // 5) * 4
