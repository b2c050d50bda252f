"""What a python model's inputs are, side by side with the real Triton 2.51 (``.peers/``;
where it is not installed, triton-mp alone is held to 2.51's answers, pinned here).

2.51's python backend copies every input into the stub's own shared memory, so a model may
write its inputs in place (``x /= 255``, ``x += 1``) without anyone else seeing it:

1. An ensemble tensor that two steps read (the ensemble's input, or a step's output) is each
   step's own: a step that writes its input in place changes neither the other step's input
   nor the tensor the client gets back.
2. An input read from a client's registered system shared memory is writable, and the
   client's region stays as the client wrote it: the next request reading it sees the
   client's bytes, also where a decoupled model's thread wrote its input after ``execute``
   returned; two requests of one batch reading one window each write their own.

And a batch's edges, and one control call:

3. Two requests batched together whose outputs are all empty (BYTES of shape [1, 0]) are both
   served.
4. A request without any input to a batching python model (its inputs all optional) is
   refused by the python backend, which reads the batch size from input 0
   (``python_be.cc`` ProcessRequests: "out of bounds index 0: request has 0 inputs"), and
   counted as a failure; the request batched with it runs.
5. A shared-memory window of 0 bytes at offset 0: 2.51 refuses it (its unsigned
   ``offset + byte_size - 1`` wraps), triton-mp takes it as upstream main does (a documented
   difference); at offset 8 both take it.
6. A response whose output has 0 bytes: 2.51's response cache fails to insert it ("Response
   buffer from output was nullptr" in its log), so each such request runs and misses;
   triton-mp stores it and answers the next one from the cache (a documented difference).
7. An HTTP unload whose body is not JSON unloads the model (2.51's HandleRepositoryControl
   overwrites the parse error with the unload's own answer, as it does for a non-boolean
   ``unload_dependents``).
"""

from __future__ import annotations

import json
import os
import queue
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import Ensemble, Models, PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

INC_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "W" data_type: TYPE_STRING dims: [ 1 ] }
]
"""
INC_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            try:
                x += 1
                how = "in place"
            except ValueError as e:
                x = x + 1
                how = str(e)
            w = np.array([[how.encode()]] * x.shape[0], dtype=np.object_)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("W", w)]))
        return out
"""
"""inc_py: OUTPUT0 = INPUT0 + 1, written into INPUT0 in place where it can be; W says how."""

PAIR_CONFIG = (
    INC_CONFIG
    + """
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 1000000 }
"""
)
"""inc_pair_py: inc_py whose batches close at two requests (or after 1 s)."""

AFTER_CONFIG = """
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "AFTER" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
AFTER_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().copy())])
            for r in requests]
"""
"""after_py: a copy of INPUT0, read once AFTER is there (the ensemble runs it after the
step that makes AFTER)."""

ENS_CONFIG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "A" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "C" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "D" data_type: TYPE_FP32 dims: [ -1 ] }
]
ensemble_scheduling { step [
  { model_name: "inc_py" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "A" } },
  { model_name: "after_py" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "AFTER" value: "A" }
    output_map { key: "OUTPUT0" value: "B" } },
  { model_name: "inc_py" model_version: -1
    input_map { key: "INPUT0" value: "B" } output_map { key: "OUTPUT0" value: "C" } },
  { model_name: "after_py" model_version: -1
    input_map { key: "INPUT0" value: "B" } input_map { key: "AFTER" value: "C" }
    output_map { key: "OUTPUT0" value: "D" } }
] }
"""
"""inc_ens: the ensemble's INPUT0 read by inc_py (A) and then by after_py (B); B, an output
the client gets, read by inc_py (C) and then by after_py (D)."""

BYTES_CONFIG = """
backend: "python"
max_batch_size: 8
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 1000000 }
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
BYTES_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            x = np.zeros((1, 0), dtype=np.object_) if t is None else t.as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""
"""opt_bytes_py: a BYTES identity whose batches close at two requests (or after 1 s); its one
input is optional."""

LATER_CONFIG = """
backend: "python"
max_batch_size: 8
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
LATER_MODEL = """
import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            seen = x.copy()
            threading.Thread(target=self._later, args=(r, x, seen)).start()
        return None

    def _later(self, request, x, seen):
        sender = request.get_response_sender()
        time.sleep(0.3)
        x += 1
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", seen)]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
"""inc_later_py: decoupled; answers INPUT0 as ``execute`` read it, after a thread started
there added 1 to it in place 0.3 s after ``execute`` returned."""

GONE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
"""gone_py: an identity that one test unloads (no other test uses it)."""

CACHED_CONFIG = """
backend: "python"
max_batch_size: 0
response_cache { enable: true }
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
"""cached_py: a BYTES identity whose responses the response cache keeps."""

SIDE_BY_SIDE_MODELS: Models = {
    "cached_py": PythonModel(CACHED_CONFIG),
    "gone_py": PythonModel(GONE_CONFIG),
    "inc_py": PythonModel(INC_CONFIG, INC_MODEL),
    "inc_later_py": PythonModel(LATER_CONFIG, LATER_MODEL),
    "inc_pair_py": PythonModel(PAIR_CONFIG, INC_MODEL),
    "after_py": PythonModel(AFTER_CONFIG, AFTER_MODEL),
    "inc_ens": Ensemble(ENS_CONFIG),
    "opt_bytes_py": PythonModel(BYTES_CONFIG, BYTES_MODEL),
}
"""tests/e2e/conftest.py's ``shared_side_by_side`` serves them (client shared memory on, as
2.51's default; explicit model control, every model loaded; a local response cache)."""


@pytest.fixture(scope="module")
def servers(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> dict[str, ServerProcess]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed."""
    return shared_side_by_side  # type: ignore[return-value]  # NOTE: same url fields


def _ordered(servers: dict[str, ServerProcess]) -> list[tuple[str, ServerProcess]]:
    """Triton first: where only triton-mp differs, Triton's half passes before it fails."""
    return sorted(servers.items(), key=lambda kv: kv[0] != "triton")


X = np.arange(4, dtype=np.float32)[None]
"""[[0, 1, 2, 3]]"""


def test_an_ensemble_step_writing_its_input_in_place_changes_no_other_tensor(
    servers: dict[str, ServerProcess],
) -> None:
    for name, server in _ordered(servers):
        with grpcclient.InferenceServerClient(server.url) as client:
            inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(X)
            r = client.infer("inc_ens", [inp])
        got = {k: r.as_numpy(k).tolist() for k in "ABCD"}
        assert got == {"A": [[1, 2, 3, 4]], "B": [[0, 1, 2, 3]], "C": [[1, 2, 3, 4]],
                       "D": [[0, 1, 2, 3]]}, name  # fmt: skip


def _unregister(client: grpcclient.InferenceServerClient, name: str) -> None:
    """Unregister ``name`` once no call holds it.

    NOTE: 2.51 drops a request's hold on its regions when the backend releases the request,
    which can come after the client has its answer: an unregister right after the answer
    then finds the region "currently in use" now and then (2 of 30 single calls, against 0 of
    90 for triton-mp, register / call / unregister in a loop). The calls here are about
    inputs, not about that race.
    """
    deadline = time.monotonic() + 5
    while True:
        try:
            client.unregister_system_shared_memory(name)
            return
        except InferenceServerException as e:
            if "currently in use" not in e.message() or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_an_input_from_client_shared_memory_is_the_models_to_write(
    servers: dict[str, ServerProcess],
) -> None:
    """Each call's model writes its input in place; the next call reading the same window
    sees the client's bytes, not the last write, and the client's later write too."""
    for name, server in _ordered(servers):
        key = f"/r14_inplace_{os.getpid()}_{server.url.rsplit(':', 1)[1]}"
        region = shm.create_shared_memory_region("r14_in", key, X.nbytes)
        answers = []
        try:
            shm.set_shared_memory_region(region, [X])
            with grpcclient.InferenceServerClient(server.url) as client:
                client.register_system_shared_memory("r14_in", key, X.nbytes)
                try:
                    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
                    inp.set_shared_memory("r14_in", X.nbytes)
                    for data in (X, X, X * 10):
                        shm.set_shared_memory_region(region, [data])
                        r = client.infer("inc_py", [inp])
                        answers.append((r.as_numpy("OUTPUT0").tolist(), r.as_numpy("W").tolist()))
                finally:
                    _unregister(client, "r14_in")
            seen = shm.get_contents_as_numpy(region, np.float32, [1, 4]).tolist()
        finally:
            shm.destroy_shared_memory_region(region)
        assert (answers, seen) == (
            [
                ([[1, 2, 3, 4]], [[b"in place"]]),
                ([[1, 2, 3, 4]], [[b"in place"]]),
                ([[1, 11, 21, 31]], [[b"in place"]]),
            ],
            [[0, 10, 20, 30]],
        ), name


def test_two_requests_of_a_batch_on_one_shm_window_each_write_their_own(
    servers: dict[str, ServerProcess],
) -> None:
    def one(url: str) -> tuple[list[list[float]], list[list[bytes]]]:
        with grpcclient.InferenceServerClient(url) as client:
            inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_shared_memory("r14_pair", X.nbytes)
            r = client.infer("inc_pair_py", [inp])
            return r.as_numpy("OUTPUT0").tolist(), r.as_numpy("W").tolist()

    for name, server in _ordered(servers):
        key = f"/r14_pair_{os.getpid()}_{server.url.rsplit(':', 1)[1]}"
        region = shm.create_shared_memory_region("r14_pair", key, X.nbytes)
        try:
            shm.set_shared_memory_region(region, [X])
            with grpcclient.InferenceServerClient(server.url) as client:
                client.register_system_shared_memory("r14_pair", key, X.nbytes)
                try:
                    # NOTE: preferred_batch_size 2 and a 1 s delay: the two form one batch
                    with ThreadPoolExecutor(2) as pool:
                        answers = list(pool.map(one, [server.url] * 2))
                finally:
                    _unregister(client, "r14_pair")
            seen = shm.get_contents_as_numpy(region, np.float32, [1, 4]).tolist()
        finally:
            shm.destroy_shared_memory_region(region)
        assert (answers, seen) == (
            [([[1, 2, 3, 4]], [[b"in place"]])] * 2,
            [[0, 1, 2, 3]],
        ), name


def test_a_decoupled_models_later_write_into_its_shm_input_stays_its_own(
    servers: dict[str, ServerProcess],
) -> None:
    for name, server in _ordered(servers):
        key = f"/r14_later_{os.getpid()}_{server.url.rsplit(':', 1)[1]}"
        region = shm.create_shared_memory_region("r14_later", key, X.nbytes)
        answers = []
        try:
            shm.set_shared_memory_region(region, [X])
            with grpcclient.InferenceServerClient(server.url) as client:
                client.register_system_shared_memory("r14_later", key, X.nbytes)
                try:
                    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
                    inp.set_shared_memory("r14_later", X.nbytes)
                    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
                    for _ in range(2):
                        client.start_stream(
                            callback=lambda result, error, q=got: q.put((result, error))
                        )
                        try:
                            client.async_stream_infer("inc_later_py", [inp])
                            result, error = got.get(timeout=30)
                        finally:
                            client.stop_stream()
                        assert error is None, name
                        answers.append(result.as_numpy("OUTPUT0").tolist())
                finally:
                    _unregister(client, "r14_later")
            seen = shm.get_contents_as_numpy(region, np.float32, [1, 4]).tolist()
        finally:
            shm.destroy_shared_memory_region(region)
        assert (answers, seen) == ([[[0, 1, 2, 3]], [[0, 1, 2, 3]]], [[0, 1, 2, 3]]), name


def test_a_batch_of_empty_outputs_is_served(servers: dict[str, ServerProcess]) -> None:
    empty = np.zeros((1, 0), dtype=np.object_)

    def one(url: str) -> list[int] | str:
        with grpcclient.InferenceServerClient(url) as client:
            inp = grpcclient.InferInput("INPUT0", [1, 0], "BYTES")
            inp.set_data_from_numpy(empty)
            try:
                return list(client.infer("opt_bytes_py", [inp]).as_numpy("OUTPUT0").shape)
            except InferenceServerException as e:
                return f"{e.status()}: {e.message()}"

    for name, server in _ordered(servers):
        # NOTE: preferred_batch_size 2 and a 1 s delay: the two form one batch
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(one, [server.url] * 2))
        assert answers == [[1, 0], [1, 0]], name


def _fail_count(server: ServerProcess) -> int:
    url = f"http://{server.http_url}/v2/models/opt_bytes_py/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        stats = json.load(r)["model_stats"][0]["inference_stats"]
    return int(stats["fail"].get("count", 0))


def test_a_request_without_inputs_to_a_batching_python_model_is_refused(
    servers: dict[str, ServerProcess],
) -> None:
    data = np.array([[b"x"]], dtype=np.object_)

    def one(url: str, with_input: bool) -> list[list[bytes]] | str:
        inputs = []
        if with_input:
            inputs = [grpcclient.InferInput("INPUT0", [1, 1], "BYTES")]
            inputs[0].set_data_from_numpy(data)
        with grpcclient.InferenceServerClient(url) as client:
            try:
                return client.infer("opt_bytes_py", inputs).as_numpy("OUTPUT0").tolist()  # type: ignore[no-any-return]
            except InferenceServerException as e:
                return f"{e.status()}: {e.message()}"

    for name, server in _ordered(servers):
        before = _fail_count(server)
        # NOTE: preferred_batch_size 2: the two form one batch, where the other one runs
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(one, [server.url] * 2, [False, True]))
        assert answers == [
            "StatusCode.INVALID_ARGUMENT: [request id: <id_unknown>] out of bounds index 0: "
            "request has 0 inputs",
            [[b"x"]],
        ], name
        # NOTE: the python backend reports a request's statistics after its answer is sent
        deadline = time.monotonic() + 5
        while _fail_count(server) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _fail_count(server) - before == 1, name


def test_an_unload_whose_body_is_not_json_unloads_the_model(
    servers: dict[str, ServerProcess],
) -> None:
    for name, server in _ordered(servers):
        url = f"http://{server.http_url}/v2/repository/models/gone_py/unload"
        request = urllib.request.Request(url, data=b"{", method="POST")
        with urllib.request.urlopen(request, timeout=30) as r:
            assert (r.status, r.read()) == (200, b""), name
        ready = f"http://{server.http_url}/v2/models/gone_py/ready"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(ready, timeout=10)
        assert e.value.code == 400, name


def test_an_empty_window_at_offset_0_is_refused_by_251_only(
    servers: dict[str, ServerProcess],
) -> None:
    expected = {
        "triton": "StatusCode.INVALID_ARGUMENT: Invalid offset + byte size for shared memory "
        "region: 'r14_empty'",
        "triton-mp": [1, 0],
    }
    for name, server in _ordered(servers):
        key = f"/r14_empty_{os.getpid()}_{server.url.rsplit(':', 1)[1]}"
        region = shm.create_shared_memory_region("r14_empty", key, 16)
        answers: list[list[int] | str] = []
        try:
            with grpcclient.InferenceServerClient(server.url) as client:
                client.register_system_shared_memory("r14_empty", key, 16)
                try:
                    for offset in (0, 8):
                        inp = grpcclient.InferInput("INPUT0", [1, 0], "FP32")
                        inp.set_shared_memory("r14_empty", 0, offset=offset)
                        try:
                            r = client.infer("inc_py", [inp])
                            answers.append(list(r.as_numpy("OUTPUT0").shape))
                        except InferenceServerException as e:
                            answers.append(f"{e.status()}: {e.message()}")
                finally:
                    client.unregister_system_shared_memory("r14_empty")
        finally:
            shm.destroy_shared_memory_region(region)
        assert answers == [expected[name], [1, 0]], name


def test_a_response_of_no_bytes_is_cached_by_triton_mp_only(
    servers: dict[str, ServerProcess],
) -> None:
    def hits(server: ServerProcess) -> int:
        url = f"http://{server.http_url}/v2/models/cached_py/stats"
        with urllib.request.urlopen(url, timeout=10) as r:
            stats = json.load(r)["model_stats"][0]["inference_stats"]
        return int(stats["cache_hit"].get("count", 0))

    for name, server in _ordered(servers):
        before = hits(server)
        with grpcclient.InferenceServerClient(server.url) as client:
            for _ in range(3):
                inp = grpcclient.InferInput("INPUT0", [0], "BYTES")
                inp.set_data_from_numpy(np.zeros(0, dtype=np.object_))
                assert client.infer("cached_py", [inp]).as_numpy("OUTPUT0").shape == (0,)
        assert hits(server) - before == {"triton": 0, "triton-mp": 2}[name], name
