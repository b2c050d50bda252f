"""``PythonBackend`` in-process on small model.py files (no processes, no shared memory)."""

from __future__ import annotations

import gc
import json
import re
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from triton_mp.backends.base import (
    RESCHEDULED,
    RESPONDED,
    BackendRequest,
    Outputs,
    ReturnedError,
)
from triton_mp.backends.python import pb_utils
from triton_mp.backends.python.autocomplete import may_auto_complete
from triton_mp.backends.python.backend import PythonBackend
from triton_mp.backends.python.model_module import PB_UTILS_MODULE
from triton_mp.backends.registry import BACKENDS, load_backend
from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    InstanceSpec,
    ModelVersionSpec,
    SequenceSpec,
    TensorSpec,
)

IO = (TensorSpec(name="INPUT0", datatype="FP32", dims=(4,)),)
OUT = (
    TensorSpec(name="OUTPUT0", datatype="FP32", dims=(4,)),
    TensorSpec(name="OUTPUT1", datatype="FP32", dims=(4,)),
)

# Doubles INPUT0 into OUTPUT0 and negates it into OUTPUT1; value 9 -> per-request
# INVALID_ARG error, 99 -> execute raises, 5 -> returns None for the request, 7 -> one
# response too few.
MODEL = """
import json
import triton_python_backend_utils as pb_utils

from helper import SCALE
from .sibling import OFFSET

FINALIZED = []


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if (x == 99).any():
                raise ValueError("ninety-nine")
            if (x == 9).any():
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("no nines", pb_utils.TritonError.INVALID_ARG)))
            elif (x == 5).any():
                out.append(None)
            elif (x == 3).any():
                out.append("three")
            else:
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", x * SCALE + OFFSET),
                    pb_utils.Tensor("OUTPUT1", -x),
                ]))
        if any((pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() == 7).any()
               for r in requests):
            return out[:-1]
        return out

    def finalize(self):
        FINALIZED.append(self.args["model_instance_name"])
"""


def _write(root: Path, source: str, name: str = "m") -> Path:
    version = root / name / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(textwrap.dedent(source))
    (version / "helper.py").write_text("SCALE = 2\n")
    (version / "sibling.py").write_text("OFFSET = 0\n")
    return version / "model.py"


def _spec(
    model_file: Path, config: dict[str, object] | None = None, **kw: object
) -> ModelVersionSpec:
    fields: dict[str, object] = {
        "model": model_file.parent.parent.name,
        "version": 1,
        "backend": "python",
        "model_file": str(model_file),
        "max_batch_size": 8,
        "batching": BatchingSpec(kind="dynamic", max_batch_size=8),
        "inputs": IO,
        "outputs": OUT,
        "instance_ids": (0,),
        "config_json": json.dumps(config or {"name": "m", "max_batch_size": 8}),
    }
    fields.update(kw)
    return ModelVersionSpec(**fields)  # type: ignore[arg-type]


INSTANCE = InstanceSpec(instance_id=0, name="m_0", model="m", version=1)


def _req(value: float, outputs: tuple[str, ...] = ("OUTPUT0", "OUTPUT1")) -> BackendRequest:
    return BackendRequest({"INPUT0": np.full((1, 4), value, np.float32)}, outputs, 1)


@pytest.fixture(autouse=True)
def _import_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test's model directories leave sys.path and sys.modules as they were."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [n for n in sys.modules if n in ("helper", "sibling") or n.startswith("_triton")]:
        del sys.modules[name]


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[PythonBackend]:
    b = PythonBackend(_spec(_write(tmp_path, MODEL)), INSTANCE)
    yield b
    b.close()


def test_registry_knows_python() -> None:
    assert BACKENDS["python"].runs


def test_pb_utils_is_installed_for_user_models(backend: PythonBackend) -> None:
    assert sys.modules[PB_UTILS_MODULE] is pb_utils


def test_initialize_gets_tritons_args(tmp_path: Path) -> None:
    model_file = _write(tmp_path, MODEL)
    config = {"name": "m", "max_batch_size": 8}
    b = load_backend(_spec(model_file, config), INSTANCE)
    args = b._model.args  # type: ignore[attr-defined]
    b.close()
    assert args == {
        "model_config": json.dumps(config),
        "model_instance_kind": "CPU",
        "model_instance_name": "m_0",
        "model_instance_device_id": "0",
        "model_repository": str(model_file.parent.parent),
        "model_version": "1",
        "model_name": "m",
    }


def test_each_request_gets_its_own_response(backend: PythonBackend) -> None:
    results, times = backend.execute([_req(1), _req(9), _req(2, ("OUTPUT1",)), _req(5)])
    assert isinstance(results[0], dict)
    np.testing.assert_array_equal(results[0]["OUTPUT0"], np.full((1, 4), 2, np.float32))
    # the model's own error: answered as any error, counted as executed
    assert results[1] == ReturnedError(ErrorCode.INVALID_ARG, "no nines", "worker m_0")
    assert isinstance(results[2], dict)
    assert list(results[2]) == ["OUTPUT1"], "only requested outputs"
    assert isinstance(results[3], ErrorInfo)
    assert results[3].code == ErrorCode.INTERNAL
    assert "NoneType" in results[3].message
    assert times.compute_infer_ns > 0


def test_execute_raising_fails_the_whole_batch(backend: PythonBackend) -> None:
    results, _ = backend.execute([_req(1), _req(99)])
    assert len(results) == 2
    for r in results:
        assert isinstance(r, ErrorInfo)
        assert r.code == ErrorCode.INTERNAL
        # the stub's words (pybind11's error_already_set::what()): the model's frames,
        # the innermost first, up to execute
        first, at = r.message.split("\n\nAt:\n")
        assert first == (
            "Failed to process the request(s) for model 'm_0', message: ValueError: ninety-nine"
        )
        assert re.fullmatch(r"  \S+/model\.py\(\d+\): execute\n", at), at
    ok, _ = backend.execute([_req(1)])
    assert isinstance(ok[0], dict), "the instance goes on"


def test_wrong_number_of_responses_fails_the_batch(backend: PythonBackend) -> None:
    results, _ = backend.execute([_req(1), _req(7)])
    for r in results:
        assert isinstance(r, ErrorInfo)
        assert r.message == (
            "Failed to process the request(s) for model 'm_0', message: Number of "
            "InferenceResponse objects do not match the number of InferenceRequest objects. "
            "InferenceRequest(s) size is:2, and InferenceResponse(s) size is:1\n"
        )
    assert len(results) == 2


def test_an_entry_that_is_no_response_fails_the_whole_batch(backend: PythonBackend) -> None:
    # pb_stub.cc ProcessReturnedResponses throws at the entry: every request gets its words
    results, _ = backend.execute([_req(1), _req(3), _req(2)])
    assert (
        results
        == [
            ErrorInfo(
                ErrorCode.INTERNAL,
                "Failed to process the request(s) for model 'm_0', message: Expected an "
                "'InferenceResponse' object in the execute function return list, found type "
                "'<class 'str'>'.",
                "worker m_0",
            )
        ]
        * 3
    )


def test_close_calls_finalize(tmp_path: Path) -> None:
    b = PythonBackend(_spec(_write(tmp_path, MODEL)), INSTANCE)
    module = sys.modules[type(b._model).__module__]
    b.close()
    assert module.FINALIZED == ["m_0"]


def test_inputs_are_not_copied(tmp_path: Path) -> None:
    source = """
    import triton_python_backend_utils as pb_utils
    SEEN = []

    class TritonPythonModel:
        def execute(self, requests):
            SEEN.extend(r.inputs()[0].as_numpy() for r in requests)
            return [pb_utils.InferenceResponse([]) for r in requests]
    """
    b = PythonBackend(_spec(_write(tmp_path, source)), INSTANCE)
    arr = np.ones((1, 4), np.float32)
    b.execute([BackendRequest({"INPUT0": arr}, (), 1)])
    seen = sys.modules[type(b._model).__module__].SEEN
    assert seen[0] is arr
    b.close()


def test_reshape_is_applied_both_ways(tmp_path: Path) -> None:
    source = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = r.inputs()[0].as_numpy()
                assert x.shape[1:] == (2, 2), x.shape
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            return out
    """
    spec = _spec(
        _write(tmp_path, source),
        inputs=(TensorSpec(name="INPUT0", datatype="FP32", dims=(4,), reshape=(2, 2)),),
        outputs=(TensorSpec(name="OUTPUT0", datatype="FP32", dims=(4,), reshape=(2, 2)),),
    )
    b = PythonBackend(spec, INSTANCE)
    results, _ = b.execute(
        [BackendRequest({"INPUT0": np.ones((3, 4), np.float32)}, ("OUTPUT0",), 3)]
    )
    assert isinstance(results[0], dict)
    assert results[0]["OUTPUT0"].shape == (3, 4)
    b.close()


def test_async_execute(tmp_path: Path) -> None:
    source = """
    import asyncio
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.sleep(0)
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests
            ]
    """
    b = PythonBackend(_spec(_write(tmp_path, source)), INSTANCE)
    results, _ = b.execute([_req(3, ("OUTPUT0",))])
    assert isinstance(results[0], dict)
    np.testing.assert_array_equal(results[0]["OUTPUT0"], np.full((1, 4), 3, np.float32))
    b.close()


DECOUPLED_MODEL = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            n = int(x[0, 0])
            sender = r.get_response_sender()
            assert sender is r.get_response_sender()
            if n < 0:
                continue  # the thread below never runs: the sender is dropped unclosed
            def later(sender=sender, x=x, n=n):
                for i in range(n):
                    sender.send(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUTPUT0", x + i), pb_utils.Tensor("OUTPUT1", -x)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            threading.Thread(target=later).start()
        return None
"""


def test_decoupled_responses_go_through_the_responder(tmp_path: Path) -> None:
    config = {"name": "m", "model_transaction_policy": {"decoupled": True}}
    b = PythonBackend(_spec(_write(tmp_path, DECOUPLED_MODEL), config), INSTANCE)
    sent: list[tuple[object, object, bool]] = []
    done = threading.Event()

    def responder(token: object, result: object, final: bool) -> None:
        sent.append((token, result, final))
        if final and token == "a":
            done.set()

    b.bind_responder(responder, lambda token: token == "a")
    reqs = [
        BackendRequest({"INPUT0": np.full((1, 4), 3, np.float32)}, ("OUTPUT0",), 1, token="a"),
        BackendRequest({"INPUT0": np.full((1, 4), -1, np.float32)}, ("OUTPUT0",), 1, token="b"),
    ]
    results, _ = b.execute(reqs)
    assert results == [RESPONDED, RESPONDED]
    assert done.wait(10)
    mine = [(r, f) for t, r, f in sent if t == "a"]
    assert [f for _, f in mine] == [False, False, False, True]
    for i, (r, _) in enumerate(mine[:3]):
        assert isinstance(r, dict)
        assert list(r) == ["OUTPUT0"]  # only the requested output
        np.testing.assert_array_equal(r["OUTPUT0"], np.full((1, 4), 3 + i, np.float32))
    assert mine[3][0] is None
    gc.collect()
    # the dropped sender of "b" ended its request with a flags-only final response
    assert [(r, f) for t, r, f in sent if t == "b"] == [(None, True)]
    b.close()


def test_decoupled_execute_raising_ends_open_requests(tmp_path: Path) -> None:
    source = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            requests[0].get_response_sender().send(
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            raise RuntimeError("late")
    """
    config = {"name": "m", "model_transaction_policy": {"decoupled": True}}
    b = PythonBackend(_spec(_write(tmp_path, source), config), INSTANCE)
    sent: list[tuple[object, object, bool]] = []
    b.bind_responder(lambda t, r, f: sent.append((t, r, f)), lambda t: False)
    reqs = [
        BackendRequest({"INPUT0": np.zeros((1, 4), np.float32)}, ("OUTPUT0",), 1, token=k)
        for k in ("a", "b")
    ]
    results, _ = b.execute(reqs)
    assert results[0] is RESPONDED
    assert isinstance(results[1], ErrorInfo)
    assert "RuntimeError: late" in results[1].message
    assert sent == [("a", None, True)]
    b.close()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("x = 1\n", "AttributeError: module '1.model' has no attribute 'TritonPythonModel'"),
        ("import no_such_module_here\n", "ModuleNotFoundError"),
        (
            "class TritonPythonModel:\n    def initialize(self, args):\n"
            "        raise KeyError('weights')\n    def execute(self, r):\n        return []\n",
            "KeyError: 'weights'\n\nAt:\n  ",
        ),
    ],
)
def test_load_failures_say_why(tmp_path: Path, source: str, message: str) -> None:
    with pytest.raises(TritonMPError) as e:
        PythonBackend(_spec(_write(tmp_path, source)), INSTANCE)
    assert message in e.value.message


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("class TritonPythonModel:\n    def execute(self, r):\n        return []\n", False),
        ("class TritonPythonModel(object):\n    pass\n", False),
        ("x = 1\n", False),  # no model class at all: the worker reports that
        ("class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(c):\n", True),
        ("class TritonPythonModel:\n    auto_complete_config = staticmethod(f)\n", True),
        ("from base import Base\nclass TritonPythonModel(Base):\n    pass\n", True),
        ("@decorate\nclass TritonPythonModel:\n    pass\n", True),
        ("class TritonPythonModel(metaclass=M):\n    pass\n", True),
        ("from elsewhere import TritonPythonModel\n", True),
        ("def broken(:\n", True),  # the child reports the syntax error as Triton would
    ],
)
def test_which_sources_need_the_auto_complete_child(
    tmp_path: Path, source: str, expected: bool
) -> None:
    path = tmp_path / "model.py"
    path.write_text(source)
    assert may_auto_complete(path) is expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("return True", (True, "")),
        ("return False", (False, "Model 'm_0' is not ready (user-defined check failed).")),
        ("return 1", (False, "is_ready() must return a boolean value")),
        ("raise RuntimeError('db down')", (False, "RuntimeError: db down")),
    ],
)
def test_is_ready_answers_as_upstreams_stub(tmp_path: Path, body: str, expected: object) -> None:
    """pb_stub.cc ProcessUserModelReadinessRequest and python_be.cc's message for False."""
    source = f"""
        class TritonPythonModel:
            {"async " if "True" in body else ""}def is_ready(self):
                {body}

            def execute(self, requests):
                return []
    """
    backend = PythonBackend(_spec(_write(tmp_path, source)), INSTANCE)
    try:
        assert backend.has_ready_check
        assert backend.check_ready() == expected
    finally:
        backend.close()


RESCHEDULING = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0, 0] > 0:
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append(None)
            else:
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("OUTPUT1", x)]))
        return out
"""


@pytest.mark.parametrize("iterative", [True, False])
def test_a_request_released_with_reschedule_is_rescheduled_only_under_iterative_sequence(
    tmp_path: Path, iterative: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """python_be.cc drops the response of a request released with RESCHEDULE; the core
    takes the flag only from an iterative sequence model, else refuses it (logged as
    python_be.cc does, and answered here)."""
    seq = SequenceSpec(iterative=iterative)
    b = PythonBackend(_spec(_write(tmp_path, RESCHEDULING), sequence=seq), INSTANCE)
    try:
        results, _ = b.execute([_req(1.0), _req(0.0)])
    finally:
        b.close()
    assert isinstance(results[1], dict)
    if iterative:
        assert results[0] is RESCHEDULED
        assert "Failed to release request" not in caplog.text
        return
    assert isinstance(results[0], ErrorInfo)
    assert results[0].code == ErrorCode.INVALID_ARG
    assert results[0].message == (
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is "
        "not configured to handle such a flag."
    )
    assert "Failed to release request: Request is released with" in caplog.text


def test_release_flags_are_stored_as_given() -> None:
    request = pb_utils.InferenceRequest(model_name="m")
    assert request.release_flags() == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert request.release_flags() == 2


def test_a_rescheduled_request_with_a_response_fails_the_batch(tmp_path: Path) -> None:
    """pb_stub.cc ProcessReturnedResponses: the response of a rescheduled request must be
    None; otherwise the whole batch fails with its message."""
    source = RESCHEDULING.replace("out.append(None)", "out.append(pb_utils.InferenceResponse())")
    seq = SequenceSpec(iterative=True)
    b = PythonBackend(_spec(_write(tmp_path, source), sequence=seq), INSTANCE)
    try:
        results, _ = b.execute([_req(1.0), _req(0.0)])
    finally:
        b.close()
    assert all(isinstance(r, ErrorInfo) for r in results)
    assert results[0].message == (  # type: ignore[union-attr]
        "Failed to process the request(s) for model 'm_0', message: Expected a None object in "
        "the execute function return list for reschduled request, found type "
        "'<class 'triton_mp.backends.python.pb_utils.InferenceResponse'>'."
    )


PER_REQUEST_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            flag = np.full_like(x, 1.0 if r.is_cancelled() else 0.0)
            response = pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("OUTPUT1", flag)])
            if int(x[0, 0]) % 2:
                r.get_response_sender().send(
                    response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                out.append(None)
            else:
                out.append(response)
        return out
"""


def test_each_request_asks_its_own_cancellation_and_sender(tmp_path: Path) -> None:
    """The backend hands every request of a batch the same two callables and the request's
    own key: ``is_cancelled()`` and ``get_response_sender()`` still answer for that
    request only (cancelled tokens: requests 1 and 2; odd values answer by their sender)."""
    b = PythonBackend(_spec(_write(tmp_path, PER_REQUEST_MODEL)), INSTANCE)
    b.bind_responder(lambda token, result, final: None, lambda token: token in ("t1", "t2"))
    reqs = [
        BackendRequest(
            {"INPUT0": np.full((1, 4), v, np.float32)}, ("OUTPUT0", "OUTPUT1"), 1, token=f"t{v}"
        )
        for v in range(4)
    ]
    results, _ = b.execute(reqs)
    for v, res in enumerate(results):
        assert isinstance(res, dict), res
        assert res["OUTPUT0"].tolist() == [[float(v)] * 4]
        assert res["OUTPUT1"].tolist() == [[1.0 if v in (1, 2) else 0.0] * 4]
    b.close()


SHAPED_RESPONSES = """
import numpy as np
import triton_python_backend_utils as pb_utils
class Mine(pb_utils.Tensor):
    pass
class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0, 0] == 1:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)],
                                                      parameters={"k": 1}))
            elif x[0, 0] == 2:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x), -x]))
            elif x[0, 0] == 3:
                out.append(pb_utils.InferenceResponse([Mine("OUTPUT1", -x)]))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def test_responses_with_parameters_strangers_or_tensor_subclasses_read_as_before(
    tmp_path: Path,
) -> None:
    # NOTE: the backend reads a plain response itself (_returned_results); anything else
    # goes to ResponseReader as before: parameters, a non-Tensor entry, a Tensor subclass.
    b = PythonBackend(_spec(_write(tmp_path, SHAPED_RESPONSES)), INSTANCE)
    results, _ = b.execute([_req(1), _req(2), _req(3), _req(4)])
    with_parameters, stranger, subclass, plain = results
    assert isinstance(with_parameters, Outputs)
    assert json.loads(with_parameters.parameters_json) == {"k": 1}
    assert list(with_parameters) == ["OUTPUT0"]
    assert isinstance(stranger, ErrorInfo)
    assert stranger.code == ErrorCode.INTERNAL
    assert "ndarray among the output tensors" in stranger.message
    assert type(subclass) is dict
    np.testing.assert_array_equal(subclass["OUTPUT1"], np.full((1, 4), -3, np.float32))
    assert type(plain) is dict
    assert list(plain) == ["OUTPUT0"]
    b.close()


def test_a_model_without_execute_loads_and_fails_each_batch(tmp_path: Path) -> None:
    """2.51 loads it; pb_stub fails every batch with its words."""
    model_file = _write(tmp_path, "class TritonPythonModel:\n    pass\n")
    b = PythonBackend(_spec(model_file), INSTANCE)
    req = BackendRequest({"INPUT0": np.zeros((1, 4), np.float32)}, ("OUTPUT0",), 1)
    results, _ = b.execute([req, req])
    expected = (
        "Failed to process the request(s) for model 'm_0', message: Python model "
        f"{model_file} does not implement `execute` method."
    )
    assert [(r.code, r.message) for r in results] == [(ErrorCode.INTERNAL, expected)] * 2  # type: ignore[union-attr]
    b.close()
