"""End to end: BLS (``pb_utils.InferenceRequest.exec`` / ``async_exec``) through the scheduler.

One server with the project's ``add_sub`` (ONNX), ``add_sub_py`` (python) and
``repeat_int32`` (decoupled python), plus BLS models written here the way Triton's BLS
examples are written: ``bls_py`` forwards its inputs to the model named by its ``MODEL``
input with ``exec()`` and returns the callee's outputs or error; ``bls_async_py`` makes
several ``async_exec`` calls at once from an ``async def execute``; ``bls_decoupled_py``
iterates over ``exec(decoupled=True)`` on ``repeat_int32`` and sums what it got;
``bls_bytes_py`` is Triton's sync ``bls`` example (the callee's name passed on as bytes);
``ready_py`` asks ``pb_utils.is_model_ready``.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess, server_factory, wait_for
from triton_mp.ipc.memory.shm import list_objects

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BLS_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "MODEL" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
BLS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model = pb_utils.get_input_tensor_by_name(request, "MODEL").as_numpy()[0].decode()
            callee = pb_utils.InferenceRequest(
                model_name=model,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            answer = callee.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("BLS: " + answer.error().message())))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", pb_utils.get_output_tensor_by_name(
                    answer, "OUTPUT0").as_numpy()),
                pb_utils.Tensor("OUTPUT1", pb_utils.get_output_tensor_by_name(
                    answer, "OUTPUT1").as_numpy()),
            ]))
        return responses
"""
BYTES_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] }
]
"""
BYTES_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    # As Triton's bls example: the callee's name is the BYTES input's element, a bytes value,
    # passed on as it is (and so are the output names, which Triton also takes as bytes).
    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME")
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name.as_numpy()[0],
                requested_output_names=[b"OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            infer_response = infer_request.exec()
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())
            responses.append(
                pb_utils.InferenceResponse(output_tensors=infer_response.output_tensors())
            )
        return responses
"""
READY_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "VERSION" data_type: TYPE_STRING dims: [ 1 ] }
]
output [ { name: "READY" data_type: TYPE_BOOL dims: [ 1 ] } ]
"""
READY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    # The model loading API as Triton's documentation uses it: is_model_ready answers;
    # load_model outside explicit model control mode is refused.
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()[0]
            version = pb_utils.get_input_tensor_by_name(request, "VERSION").as_numpy()[0]
            if name == b"load":
                pb_utils.load_model(model_name="add_sub")
            ready = pb_utils.is_model_ready(model_name=name, model_version=version.decode())
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("READY", np.array([ready]))])
            )
        return responses
"""
ASYNC_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
"""
ASYNC_MODEL = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            calls = [
                pb_utils.InferenceRequest(
                    model_name=name,
                    requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x * k)],
                ).async_exec()
                for k, name in enumerate(["add_sub", "add_sub_py"] * 4)
            ]
            answers = await asyncio.gather(*calls)
            total = np.zeros_like(x)
            for a in answers:
                if a.has_error():
                    raise pb_utils.TritonModelException(a.error().message())
                total += pb_utils.get_output_tensor_by_name(a, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
        return responses
"""
DECOUPLED_CALLER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""
DECOUPLED_CALLER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="repeat_int32",
                requested_output_names=["OUT"],
                inputs=[
                    pb_utils.Tensor("IN", values),
                    pb_utils.Tensor("DELAY", np.zeros(values.shape, np.uint32)),
                    pb_utils.Tensor("WAIT", np.zeros((1,), np.uint32)),
                ],
            )
            total = count = 0
            for answer in call.exec(decoupled=True):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                out = pb_utils.get_output_tensor_by_name(answer, "OUT")
                if out is not None:
                    total += int(out.as_numpy()[0])
                    count += 1
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([total], np.int32)),
                pb_utils.Tensor("COUNT", np.array([count], np.int32)),
            ]))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    for name in ("add_sub", "add_sub_py", "repeat_int32"):
        shutil.copytree(
            PROJECT_REPOSITORY / name, repo / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    write_python_model(repo, "bls_py", BLS_CONFIG, BLS_MODEL)
    write_python_model(repo, "bls_async_py", ASYNC_CONFIG, ASYNC_MODEL)
    write_python_model(repo, "bls_bytes_py", BYTES_CONFIG, BYTES_MODEL)
    write_python_model(repo, "ready_py", READY_CONFIG, READY_MODEL)
    write_python_model(repo, "bls_decoupled_py", DECOUPLED_CALLER_CONFIG, DECOUPLED_CALLER_MODEL)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def _inputs(**arrays: np.ndarray) -> list[grpcclient.InferInput]:
    out = []
    for name, arr in arrays.items():
        dtype = "BYTES" if arr.dtype == np.object_ else "INT32" if arr.dtype == np.int32 else "FP32"
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


@pytest.mark.parametrize("callee", ["add_sub", "add_sub_py"])
def test_bls_exec_to_onnx_and_python(server: ServerProcess, callee: str) -> None:
    rng = np.random.default_rng(len(callee))
    a = rng.standard_normal((1, 16), dtype=np.float32)
    b = rng.standard_normal((1, 16), dtype=np.float32)
    client = server.client()
    try:
        res = client.infer(
            "bls_py",
            _inputs(MODEL=np.array([callee.encode()], dtype=np.object_), INPUT0=a, INPUT1=b),
        )
    finally:
        client.close()
    np.testing.assert_allclose(res.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(res.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


@pytest.mark.parametrize(
    ("callee", "message"),
    [
        ("no_such_model", "BLS: Request for unknown model: 'no_such_model' is not found"),
        ("bls_async_py", "BLS: "),  # wrong inputs for that model: the callee's error
        ("repeat_int32", "BLS: model 'repeat_int32' is decoupled: call exec(decoupled=True)"),
    ],
)
def test_bls_errors_are_error_responses(server: ServerProcess, callee: str, message: str) -> None:
    a = np.ones((1, 16), np.float32)
    client = server.client()
    try:
        with pytest.raises(InferenceServerException) as e:
            client.infer(
                "bls_py",
                _inputs(MODEL=np.array([callee.encode()], dtype=np.object_), INPUT0=a, INPUT1=a),
            )
        assert e.value.message().startswith(message), e.value.message()
        res = client.infer(
            "bls_py",
            _inputs(MODEL=np.array([b"add_sub"], dtype=np.object_), INPUT0=a, INPUT1=a),
        )
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + a)
    finally:
        client.close()


def test_bls_takes_the_model_name_as_bytes_as_tritons_example_does(server: ServerProcess) -> None:
    """Triton's bls example hands ``MODEL_NAME.as_numpy()[0]`` (bytes) to InferenceRequest;
    an unknown name comes back as the callee lookup's error, with the name decoded."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((1, 16), dtype=np.float32)
    b = rng.standard_normal((1, 16), dtype=np.float32)
    client = server.client()
    try:
        for callee in ("add_sub", "add_sub_py"):
            res = client.infer(
                "bls_bytes_py",
                _inputs(MODEL_NAME=np.array([callee.encode()], np.object_), INPUT0=a, INPUT1=b),
            )
            np.testing.assert_allclose(res.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
            np.testing.assert_allclose(res.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
        with pytest.raises(InferenceServerException) as e:
            client.infer(
                "bls_bytes_py",
                _inputs(MODEL_NAME=np.array([b"no_such_model"], np.object_), INPUT0=a, INPUT1=b),
            )
        assert "Request for unknown model: 'no_such_model' is not found" in e.value.message()
    finally:
        client.close()


def test_is_model_ready_sees_the_served_models(server: ServerProcess) -> None:
    client = server.client()
    try:
        for name, version, ready in (
            (b"add_sub", b"", True),
            (b"add_sub", b"1", True),
            (b"add_sub", b"7", False),
            (b"add_sub_py", b"", True),
            (b"no_such_model", b"", False),
        ):
            res = client.infer(
                "ready_py",
                _inputs(NAME=np.array([name], np.object_), VERSION=np.array([version], np.object_)),
            )
            assert bool(res.as_numpy("READY")[0]) is ready, (name, version)
        with pytest.raises(InferenceServerException) as e:
            client.infer(
                "ready_py",
                _inputs(NAME=np.array([b"load"], np.object_), VERSION=np.array([b""], np.object_)),
            )
        # NOTE: not in explicit model control mode: the core's refusal, as upstream wraps it
        # (then the stub's "\n\nAt:\n" and the model's frames, as test_r13_error_stats.py)
        assert (
            e.value.message()
            .split("\n\nAt:\n")[0]
            .endswith(
                "Failed to load model: Failed to process the request for model 'ready_py_0', "
                "message: explicit model load / unload is not allowed if polling is enabled"
            )
        )
    finally:
        client.close()


def test_async_exec_many_calls_at_once(server: ServerProcess) -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 16)

    def one(_: int) -> np.ndarray:
        client = server.client()
        try:
            return client.infer("bls_async_py", _inputs(INPUT0=x)).as_numpy("OUTPUT0")
        finally:
            client.close()

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(8)))
    expected = sum(x + x * k for k in range(8))
    for r in results:
        np.testing.assert_allclose(r, expected, rtol=1e-5)


def test_exec_decoupled_iterates_over_every_response(server: ServerProcess) -> None:
    client = server.client()
    try:
        values = np.array([3, 5, 7, 11], np.int32)
        res = client.infer("bls_decoupled_py", _inputs(IN=values))
        assert int(res.as_numpy("SUM")[0]) == 26
        assert int(res.as_numpy("COUNT")[0]) == 4
        res = client.infer("bls_decoupled_py", _inputs(IN=np.zeros((0,), np.int32)))
        assert int(res.as_numpy("COUNT")[0]) == 0
    finally:
        client.close()


def test_bls_requests_count_in_the_callee_statistics(server: ServerProcess) -> None:
    client = server.client()
    try:
        before = client.get_inference_statistics("add_sub_py", as_json=True)["model_stats"][0]
        a = np.ones((1, 16), np.float32)
        for _ in range(3):
            client.infer(
                "bls_py",
                _inputs(MODEL=np.array([b"add_sub_py"], dtype=np.object_), INPUT0=a, INPUT1=a),
            )
        deadline = time.monotonic() + 10
        while True:  # the callee's books are written just after its answer leaves
            after = client.get_inference_statistics("add_sub_py", as_json=True)["model_stats"][0]
            done = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
            if done >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert done == 3
    finally:
        client.close()


_INSTANCE_REF = re.compile(r"(?:^|_)[wc](\d+)")


def _instance_ids(server: ServerProcess) -> dict[str, set[int]]:
    """Per /dev/shm object of the server, the model instances it belongs to (its rings
    ``r_w<i>_c<j>``, ``r_s_c<j>``, ``r_w<i>_f<f>``, semaphores ``w<i>_bls``, arenas
    ``w<i>p<pid>_<n>``)."""
    prefix = f"triton_mp_{server.pid}_"
    out = {}
    for name in list_objects(str(server.pid)):
        rest = name.removeprefix("sem.").removeprefix(prefix)
        out[name] = {int(i) for i in _INSTANCE_REF.findall(rest)}
    return out


def _call(client: grpcclient.InferenceServerClient, caller: str, callee: str) -> np.ndarray:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    res = client.infer(
        caller, _inputs(MODEL=np.array([callee.encode()], dtype=np.object_), INPUT0=a, INPUT1=a)
    )
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + a)
    return res.as_numpy("OUTPUT0")


def _call_fails(
    client: grpcclient.InferenceServerClient, caller: str, callee: str, why: str = "is not found"
) -> None:
    a = np.ones((1, 16), np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer(
            caller,
            _inputs(MODEL=np.array([callee.encode()], dtype=np.object_), INPUT0=a, INPUT1=a),
        )
    assert e.value.message() == f"BLS: Request for unknown model: '{callee}' {why}"


def test_bls_reaches_models_loaded_and_unloaded_after_the_caller(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """Explicit model control: a BLS call to a model that is not loaded is an error
    response; once the model is loaded it works (ONNX and python callees), also from a BLS
    model loaded later than the callee; after an unload it fails again and nothing of the
    unloaded instances stays in /dev/shm; a reload works again."""
    repo = copy_models(tmp_path / "repo", "add_sub", "add_sub_py")
    write_python_model(repo, "bls_py", BLS_CONFIG, BLS_MODEL)
    write_python_model(repo, "bls_late_py", BLS_CONFIG, BLS_MODEL)
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=bls_py")
    client = server.client()
    try:
        _call_fails(client, "bls_py", "add_sub")
        assert client.is_server_live()
        before = set().union(*_instance_ids(server).values())

        client.load_model("add_sub")
        _call(client, "bls_py", "add_sub")
        client.load_model("add_sub_py")
        _call(client, "bls_py", "add_sub_py")
        # A BLS model loaded after its callees reaches them (the running callees answer
        # it on rings opened for it), and the older BLS model reaches the newer one's peers.
        client.load_model("bls_late_py")
        _call(client, "bls_late_py", "add_sub")
        _call(client, "bls_late_py", "add_sub_py")
        _call(client, "bls_py", "add_sub")
        objects = _instance_ids(server)
        bls_rings = [n for n in objects if re.search(r"_r_w\d+_c\d+$", n)]
        assert any(objects[n] - before for n in bls_rings), bls_rings

        client.unload_model("add_sub")
        # NOTE: as the frontend after an unload (core ModelLifeCycle::GetModel)
        _call_fails(client, "bls_py", "add_sub", "has no available versions")
        _call_fails(client, "bls_late_py", "add_sub", "has no available versions")
        _call(client, "bls_py", "add_sub_py")
        client.unload_model("bls_late_py")
        _call(client, "bls_py", "add_sub_py")
        client.unload_model("add_sub_py")
        _call_fails(client, "bls_py", "add_sub_py", "has no available versions")

        # NOTE: everything of the instances started since (all unloaded now) is gone once
        # they drained (an unload answers before, as Triton's does).
        def leftovers() -> dict[str, set[int]]:
            return {n: ids for n, ids in _instance_ids(server).items() if ids - before}

        wait_for(lambda: not leftovers(), 30, "the unloaded instances' objects to go")
        assert not leftovers(), leftovers()

        client.load_model("add_sub")
        _call(client, "bls_py", "add_sub")
        for _ in range(20):
            _call(client, "bls_py", "add_sub")
    finally:
        client.close()
