"""End to end: Triton python models (``backend: "python"``) through ``triton-mp start``.

One server for the module. The bench's add_sub_py and identity_py are copied unchanged from
bench/model_repository (the directories Triton itself serves in the bench); the
other models are written here the way Triton's python-backend examples are written:
per-request errors, a raising execute, auto_complete_config with no config.pbtxt, BYTES in
and out, an initialize that raises, an auto_complete_config that raises,
and a model that reports how many requests each execute received.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import BYTES_PY_CONFIG, BYTES_PY_MODEL, write_python_model
from tests.helpers.server import REPO_ROOT, ServerProcess, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BENCH_REPOSITORY = REPO_ROOT / "bench" / "model_repository"
BENCH_MODELS = ("add_sub_py", "identity_py")

# A model whose execute answers each request on its own: a request whose INPUT0 holds a
# negative number gets an INVALID_ARG error; 999 makes execute raise; 777 makes it return
# one response too few. COUNT tells how many requests the execute call received.
ERRORS_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 300000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
ERRORS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x == 999).any():
                raise pb_utils.TritonModelException("the model cannot take 999")
            if (x < 0).any():
                error = pb_utils.TritonError(
                    "negative values are not allowed", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            count = np.full((x.shape[0], 1), len(requests), np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", x * 2), pb_utils.Tensor("COUNT", count)]
                )
            )
        if any((pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() == 777).any()
               for r in requests):
            return responses[:-1]
        return responses
"""

AUTO_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config.as_dict()
        names = {i["name"] for i in config["input"]}
        if "INPUT0" not in names:
            auto_complete_model_config.add_input(
                {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3]}
            )
        auto_complete_model_config.add_output(
            {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]}
        )
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        print("auto-completed", flush=True)
        return auto_complete_model_config

    def initialize(self, args):
        import json
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + 1)]))
        return out
"""

SIMPLE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
INIT_FAILS_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights file missing for " + args["model_name"])

    def execute(self, requests):
        return []
"""
AUTO_FAILS_MODEL = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(2)  # the config file says 8: too large
        return auto_complete_model_config

    def execute(self, requests):
        return []
"""

# add_sub with a COUNT output: how many requests the execute call that answered received.
COUNT_CONFIG = """
backend: "python"
max_batch_size: 16
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
COUNT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            count = np.full((a.shape[0], 1), len(requests), np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", a + b),
                pb_utils.Tensor("OUTPUT1", a - b),
                pb_utils.Tensor("COUNT", count),
            ]))
        return responses
"""


META_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "META" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
META_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            meta = {"id": r.request_id(), "parameters": json.loads(r.parameters())}
            text = np.array([json.dumps(meta, sort_keys=True).encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("META", text)]))
        return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    for name in BENCH_MODELS:
        shutil.copytree(
            BENCH_REPOSITORY / name, repo / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    write_python_model(repo, "errors_py", ERRORS_CONFIG, ERRORS_MODEL)
    write_python_model(repo, "auto_py", None, AUTO_MODEL)
    write_python_model(repo, "bytes_py", BYTES_PY_CONFIG, BYTES_PY_MODEL)
    write_python_model(repo, "init_fails_py", SIMPLE_CONFIG, INIT_FAILS_MODEL)
    write_python_model(
        repo, "auto_fails_py", 'backend: "python"\nmax_batch_size: 8\n', AUTO_FAILS_MODEL
    )
    write_python_model(repo, "count_py", COUNT_CONFIG, COUNT_MODEL)
    write_python_model(repo, "meta_py", META_CONFIG, META_MODEL)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = server.client()
    yield c
    c.close()


def _input(name: str, arr: np.ndarray, dtype: str = "FP32") -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(arr.shape), dtype)
    t.set_data_from_numpy(arr)
    return t


@pytest.mark.parametrize("batch", [1, 4])
def test_bench_add_sub_py(client: grpcclient.InferenceServerClient, batch: int) -> None:
    rng = np.random.default_rng(batch)
    a = rng.standard_normal((batch, 16), dtype=np.float32)
    b = rng.standard_normal((batch, 16), dtype=np.float32)
    res = client.infer("add_sub_py", [_input("INPUT0", a), _input("INPUT1", b)])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    cfg = client.get_model_config("add_sub_py", as_json=True)["config"]
    assert cfg["backend"] == "python"
    assert [g["count"] for g in cfg["instance_group"]] == [2]


@pytest.mark.parametrize("nbytes", [1024, 1 << 20])
def test_bench_identity_py(client: grpcclient.InferenceServerClient, nbytes: int) -> None:
    x = np.random.default_rng(nbytes).standard_normal(nbytes // 4, dtype=np.float32)
    res = client.infer("identity_py", [_input("INPUT0", x)])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x)


def test_requested_output_subset(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((2, 16), np.float32)
    res = client.infer(
        "add_sub_py",
        [_input("INPUT0", a), _input("INPUT1", a)],
        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
    )
    assert [o.name for o in res.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - a)


def _two_in_one_batch(
    client: grpcclient.InferenceServerClient, first: np.ndarray, second: np.ndarray
) -> list[object]:
    """Send two requests at once; the 300 ms queue delay puts them in one execute."""
    done = threading.Semaphore(0)
    results: list[object] = [None, None]

    def callback(i: int, result: object, error: object) -> None:
        results[i] = error if error is not None else result
        done.release()

    for i, x in enumerate((first, second)):
        client.async_infer(
            "errors_py",
            [_input("INPUT0", x)],
            callback=lambda result, error, i=i: callback(i, result, error),
        )
    for _ in results:
        assert done.acquire(timeout=60), "no answer within 60 s"
    return results


def test_per_request_error_fails_only_that_request(
    client: grpcclient.InferenceServerClient,
) -> None:
    good = np.ones((1, 4), np.float32)
    bad = -np.ones((1, 4), np.float32)
    ok, err = _two_in_one_batch(client, good, bad)
    assert isinstance(ok, grpcclient.InferResult), ok
    np.testing.assert_array_equal(ok.as_numpy("OUTPUT0"), good * 2)
    assert ok.as_numpy("COUNT")[0, 0] == 2, "the two requests shared one execute call"
    assert isinstance(err, InferenceServerException)
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "negative values are not allowed" in err.message()


def test_execute_raising_fails_the_batch_and_the_server_goes_on(
    client: grpcclient.InferenceServerClient,
) -> None:
    good = np.ones((1, 4), np.float32)
    poison = np.full((1, 4), 999, np.float32)
    first, second = _two_in_one_batch(client, good, poison)
    for err in (first, second):
        assert isinstance(err, InferenceServerException), err
        assert err.status() == "StatusCode.INTERNAL"
        assert "Failed to process the request(s) for model 'errors_py_0_0'" in err.message()
        assert "TritonModelException: the model cannot take 999" in err.message()
    res = client.infer("errors_py", [_input("INPUT0", good)])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), good * 2)


def test_too_few_responses_fail_the_batch(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.infer("errors_py", [_input("INPUT0", np.full((1, 4), 777, np.float32))])
    assert e.value.status() == "StatusCode.INTERNAL"
    assert "Number of InferenceResponse objects do not match" in e.value.message()


def test_auto_complete_config_without_config_pbtxt(
    client: grpcclient.InferenceServerClient, server: ServerProcess
) -> None:
    cfg = client.get_model_config("auto_py", as_json=True)["config"]
    assert cfg["max_batch_size"] == 4
    assert "dynamic_batching" in cfg
    assert [(i["name"], i["data_type"], [int(d) for d in i["dims"]]) for i in cfg["input"]] == [
        ("INPUT0", "TYPE_FP32", [3])
    ]
    assert [o["name"] for o in cfg["output"]] == ["OUTPUT0"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    res = client.infer("auto_py", [_input("INPUT0", x)])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + 1)
    assert "auto-completed" in server.log(), "the model's print reaches the server log"


def test_bytes_in_and_out(client: grpcclient.InferenceServerClient) -> None:
    text = np.array([b"hello", b"", b"\xff\x00binary", "caf\u00e9".encode()], dtype=np.object_)
    res = client.infer("bytes_py", [_input("TEXT", text, "BYTES")])
    assert list(res.as_numpy("UPPER")) == [t.upper() for t in text]
    np.testing.assert_array_equal(res.as_numpy("LENGTH"), [len(t) for t in text])


def test_failed_python_models_are_unavailable_with_reasons(
    client: grpcclient.InferenceServerClient, server: ServerProcess
) -> None:
    index = {m.name: m for m in client.get_model_repository_index().models}
    for name in ("add_sub_py", "identity_py", "errors_py", "auto_py", "bytes_py", "count_py"):
        assert index[name].state == "READY", (name, index[name].reason)
    assert index["init_fails_py"].state == "UNAVAILABLE"
    assert "RuntimeError: weights file missing for init_fails_py" in index["init_fails_py"].reason
    assert index["auto_fails_py"].state == "UNAVAILABLE"
    assert "auto_complete_config" in index["auto_fails_py"].reason
    assert "ValueError" in index["auto_fails_py"].reason
    assert not client.is_model_ready("init_fails_py")
    log = server.log()
    assert "Traceback" in log, "initialize's traceback is logged"
    assert 'raise RuntimeError("weights file missing for "' in log
    a = np.ones((1, 16), np.float32)
    res = client.infer("add_sub_py", [_input("INPUT0", a), _input("INPUT1", a)])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + a)


def test_16_clients_batches_hold_several_requests(server: ServerProcess) -> None:
    """Each execute receives the list the dynamic batcher formed, with >1 requests."""
    counts: list[int] = []
    lock = threading.Lock()

    def client_main(k: int) -> None:
        c = server.client()
        try:
            for j in range(6):
                a = np.full((1, 16), k, np.float32)
                b = np.full((1, 16), j, np.float32)
                res = c.infer("count_py", [_input("INPUT0", a), _input("INPUT1", b)])
                np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
                with lock:
                    counts.append(int(res.as_numpy("COUNT")[0, 0]))
        finally:
            c.close()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client_main, range(16)))
    assert len(counts) == 96
    assert max(counts) > 1, counts


def test_request_id_and_custom_parameters_reach_the_model(
    client: grpcclient.InferenceServerClient,
) -> None:
    res = client.infer(
        "meta_py",
        [_input("INPUT0", np.ones(4, np.float32))],
        request_id="abc-1",
        parameters={"temperature": 0.5, "mode": "fast", "steps": 3, "flag": True},
    )
    meta = json.loads(res.as_numpy("META")[0])
    assert meta == {
        "id": "abc-1",
        "parameters": {"flag": True, "mode": "fast", "steps": 3, "temperature": 0.5},
    }
