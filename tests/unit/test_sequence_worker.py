"""The worker's side of the sequence batcher, piece by piece (no processes, no shared memory).

Control tensors per data type and kind, batch rows with null rows, row-aware gather and
scatter, initial implicit state (none / zero / data file), the per-sequence state store,
and the python backend's view of sequences (correlation ID, flags, control inputs, no
implicit state).
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from triton_mp.backends.base import BackendRequest, SequenceBatch, gather_rows, scatter
from triton_mp.backends.python.backend import PythonBackend
from triton_mp.common.errors import ConfigError, ErrorCode, TritonMPError
from triton_mp.common.numpy_tensors import serialize_bytes_tensor
from triton_mp.ipc.protocol.messages import SequenceFlags
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    ControlSpec,
    InstanceSpec,
    ModelVersionSpec,
    SequenceSpec,
    StateSpec,
    TensorSpec,
)
from triton_mp.workers.sequence_state import (
    SequenceStates,
    batch_rows,
    control_tensors,
    initial_state,
    sequence_batch,
)

START, END = SequenceFlags.START, SequenceFlags.END


def _req(
    sequence_id: int | str = 0,
    flags: int = 0,
    batch_size: int = 1,
    inputs: dict[str, np.ndarray] | None = None,
    outputs: tuple[str, ...] = (),
) -> BackendRequest:
    return BackendRequest(
        inputs or {},
        outputs,
        batch_size,
        sequence_id=sequence_id,
        sequence_flags=flags,
    )


def _model(
    *,
    max_batch_size: int = 4,
    controls: tuple[ControlSpec, ...] = (),
    states: tuple[StateSpec, ...] = (),
    inputs: tuple[TensorSpec, ...] = (TensorSpec(name="INPUT", datatype="FP32", dims=(2,)),),
    outputs: tuple[TensorSpec, ...] = (TensorSpec(name="OUTPUT", datatype="FP32", dims=(2,)),),
    backend: str = "onnxruntime",
    model_file: str = "/nonexistent/model.onnx",
    config_json: str = "{}",
) -> ModelVersionSpec:
    return ModelVersionSpec(
        model="seq",
        version=1,
        backend=backend,
        model_file=model_file,
        max_batch_size=max_batch_size,
        batching=BatchingSpec(kind="sequence", max_batch_size=max_batch_size),
        inputs=inputs,
        outputs=outputs,
        instance_ids=(0,),
        sequence=SequenceSpec(controls=controls, states=states),
        config_json=config_json,
    )


# --------------------------------------------------------------------------- batch rows


def test_rows_zero_means_one_row_per_request_row_in_order() -> None:
    reqs = [_req(1), _req(2, batch_size=2), _req(3)]
    assert batch_rows(reqs, 0, ()) == (4, (0, 1, 3))


def test_direct_rows_keep_the_scheduler_slots() -> None:
    assert batch_rows([_req(1), _req(2)], 4, (3, 1)) == (4, (3, 1))


@pytest.mark.parametrize(
    ("rows", "slots"),
    [(4, (1,)), (4, (1, 1)), (2, (0, 2)), (4, (-1, 0))],
    ids=["too-few-slots", "overlap", "outside", "negative"],
)
def test_rows_that_do_not_fit_the_requests_raise(rows: int, slots: tuple[int, ...]) -> None:
    with pytest.raises(TritonMPError) as exc:
        batch_rows([_req(1), _req(2)], rows, slots)
    assert exc.value.code == ErrorCode.INTERNAL


# --------------------------------------------------------------------------- controls


def _control(
    kind: Literal["START", "END", "READY", "CORRID"],
    datatype: str,
    false_value: float = 0.0,
    true_value: float = 1.0,
) -> ControlSpec:
    return ControlSpec(
        name=f"{kind}_{datatype}",
        kind=kind,
        datatype=datatype,
        false_value=false_value,
        true_value=true_value,
    )


@pytest.mark.parametrize(
    ("datatype", "false_value", "true_value", "dtype", "expect_false", "expect_true"),
    [
        ("INT32", -3.0, 7.0, np.int32, -3, 7),
        ("FP32", 0.5, 2.25, np.float32, 0.5, 2.25),
        ("BOOL", 0.0, 1.0, np.bool_, False, True),
        ("BOOL", 1.0, 0.0, np.bool_, True, False),
    ],
)
def test_start_end_ready_take_their_false_and_true_values_per_row(
    datatype: str,
    false_value: float,
    true_value: float,
    dtype: type,
    expect_false: object,
    expect_true: object,
) -> None:
    controls = [
        _control(kind, datatype, false_value, true_value) for kind in ("START", "END", "READY")
    ]
    # rows: 0 = START request, 1 = null, 2 = middle request, 3 = END request
    reqs = [_req(11, START), _req(12), _req(13, END)]
    out = control_tensors(controls, reqs, 4, (0, 2, 3), batched=True)
    f, t = expect_false, expect_true
    expected = {
        f"START_{datatype}": [t, f, f, f],
        f"END_{datatype}": [f, f, f, t],
        f"READY_{datatype}": [t, f, t, t],
    }
    for name, column in expected.items():
        arr = out[name]
        assert arr.dtype == np.dtype(dtype)
        assert arr.shape == (4, 1)
        np.testing.assert_array_equal(arr[:, 0], np.array(column, dtype=dtype))


def test_a_request_that_starts_and_ends_sets_both() -> None:
    controls = [_control("START", "INT32"), _control("END", "INT32")]
    out = control_tensors(controls, [_req(5, START | END)], 1, (0,), batched=True)
    assert out["START_INT32"].tolist() == [[1]]
    assert out["END_INT32"].tolist() == [[1]]


@pytest.mark.parametrize(
    ("datatype", "dtype", "sequence_id", "expected"),
    [
        ("UINT64", np.uint64, 2**64 - 5, 2**64 - 5),
        ("INT64", np.int64, 2**40 + 3, 2**40 + 3),
        ("UINT32", np.uint32, 2**32 + 9, 9),  # 32-bit types keep the low bits, as Triton
        ("INT32", np.int32, 2**32 - 1, -1),
        ("BYTES", np.object_, "sequence-a", b"sequence-a"),
        ("BYTES", np.object_, 42, b"42"),
    ],
)
def test_corrid_holds_the_correlation_id_in_its_type_and_zero_in_null_rows(
    datatype: str, dtype: type, sequence_id: int | str, expected: object
) -> None:
    control = _control("CORRID", datatype)
    out = control_tensors([control], [_req(sequence_id)], 3, (1,), batched=True)
    arr = out[control.name]
    assert arr.dtype == np.dtype(dtype)
    assert arr.shape == (3, 1)
    null = b"" if datatype == "BYTES" else 0
    assert arr[:, 0].tolist() == [null, expected, null]


def test_controls_of_a_model_without_batching_have_shape_1() -> None:
    controls = [_control("START", "BOOL"), _control("CORRID", "UINT64")]
    out = control_tensors(controls, [_req(9, START)], 1, (0,), batched=False)
    assert out["START_BOOL"].shape == (1,)
    assert out["START_BOOL"].tolist() == [True]
    assert out["CORRID_UINT64"].tolist() == [9]
    with pytest.raises(TritonMPError):
        control_tensors(controls, [_req(9)], 2, (1,), batched=False)


def test_sequence_batch_normalises_rows_and_builds_controls() -> None:
    model = _model(controls=(_control("READY", "INT32"),))
    batch = sequence_batch(model, [_req(1), _req(2)], 0, ())
    assert (batch.rows, batch.slots) == (2, (0, 1))
    assert batch.controls["READY_INT32"].tolist() == [[1], [1]]
    direct = sequence_batch(model, [_req(1)], 3, (2,))
    assert (direct.rows, direct.slots) == (3, (2,))
    assert direct.controls["READY_INT32"].tolist() == [[0], [0], [1]]


# --------------------------------------------------------------------------- gather / scatter


def test_gather_rows_fills_null_rows_with_a_real_row_and_scatter_drops_them() -> None:
    model = _model()
    a = np.array([[1.0, 2.0]], np.float32)
    b = np.array([[3.0, 4.0]], np.float32)
    state_a = np.array([[10.0]], np.float32)
    state_b = np.array([[20.0]], np.float32)
    reqs = [
        _req(1, inputs={"INPUT": a, "S": state_a}, outputs=("OUTPUT",)),
        _req(2, inputs={"INPUT": b, "S": state_b}, outputs=("OUTPUT",)),
    ]
    seq = SequenceBatch(rows=4, slots=(3, 1), controls={})
    feeds = gather_rows(model, reqs, seq, extra=("S",))
    np.testing.assert_array_equal(feeds["INPUT"], [[1, 2], [3, 4], [1, 2], [1, 2]])
    np.testing.assert_array_equal(feeds["S"], [[10], [20], [10], [10]])

    outputs = {"OUTPUT": np.arange(8, dtype=np.float32).reshape(4, 2)}
    results = scatter(model, reqs, outputs, seq.slots)
    assert isinstance(results[0], dict)
    assert isinstance(results[1], dict)
    np.testing.assert_array_equal(results[0]["OUTPUT"], [[6, 7]])
    np.testing.assert_array_equal(results[1]["OUTPUT"], [[2, 3]])


def test_gather_rows_refuses_an_input_only_some_requests_give() -> None:
    model = _model(
        inputs=(TensorSpec(name="INPUT", datatype="FP32", dims=(2,), optional=True),),
    )
    reqs = [_req(1, inputs={"INPUT": np.zeros((1, 2), np.float32)}), _req(2)]
    with pytest.raises(TritonMPError) as exc:
        gather_rows(model, reqs, SequenceBatch(rows=2, slots=(0, 1), controls={}))
    assert exc.value.code == ErrorCode.INVALID_ARG
    assert "given by 1 of the 2 requests" in exc.value.message


# --------------------------------------------------------------------------- initial state


def _state(
    initial: Literal["none", "zero", "file"] = "none",
    dims: tuple[int, ...] = (2, -1),
    datatype: str = "FP32",
    data_file: str = "",
) -> StateSpec:
    return StateSpec(
        input_name="STATE_IN",
        output_name="STATE_OUT",
        datatype=datatype,
        dims=dims,
        initial=initial,
        data_file=data_file,
    )


@pytest.mark.parametrize("initial", ["none", "zero"])
def test_initial_state_is_zeros_with_variable_dims_as_1(
    initial: Literal["none", "zero"],
) -> None:
    batched = initial_state("m", _state(initial), batched=True)
    assert batched.shape == (1, 2, 1)
    assert batched.dtype == np.float32
    assert not batched.any()
    assert not batched.flags.writeable
    assert initial_state("m", _state(initial), batched=False).shape == (2, 1)


def test_initial_state_of_bytes_is_empty_strings() -> None:
    arr = initial_state("m", _state("zero", dims=(2,), datatype="BYTES"), batched=True)
    assert arr.tolist() == [[b"", b""]]


def test_initial_state_from_a_data_file(tmp_path: Path) -> None:
    path = tmp_path / "init.bin"
    path.write_bytes(np.array([1, 2, 3, 4], "<i4").tobytes())
    arr = initial_state(
        "m", _state("file", dims=(2, 2), datatype="INT32", data_file=str(path)), True
    )
    np.testing.assert_array_equal(arr, [[[1, 2], [3, 4]]])
    # one variable dimension takes its size from the file
    arr = initial_state(
        "m", _state("file", dims=(-1,), datatype="INT32", data_file=str(path)), False
    )
    np.testing.assert_array_equal(arr, [1, 2, 3, 4])


def test_initial_bytes_state_from_a_data_file(tmp_path: Path) -> None:
    path = tmp_path / "init.bin"
    path.write_bytes(serialize_bytes_tensor(np.array([b"ab", b"c"], dtype=object)))
    state = _state("file", dims=(2,), datatype="BYTES", data_file=str(path))
    assert initial_state("m", state, batched=False).tolist() == [b"ab", b"c"]


def test_a_data_file_of_the_wrong_size_or_missing_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "init.bin"
    path.write_bytes(b"\0" * 12)
    with pytest.raises(ConfigError, match=r"is 12 bytes, expected 16 \(4 FP32 elements"):
        initial_state("m", _state("file", dims=(2, 2), data_file=str(path)), True)
    with pytest.raises(ConfigError, match="cannot read data file"):
        initial_state("m", _state("file", dims=(2,), data_file=str(tmp_path / "nope")), True)
    with pytest.raises(ConfigError, match="not supported"):
        initial_state("m", _state("zero", datatype="BF16"), True)


# --------------------------------------------------------------------------- state store


def test_states_carry_the_last_output_per_sequence_and_reset_on_start() -> None:
    states = SequenceStates(_model(states=(_state("zero", dims=(1,)),)))
    assert states.output_names == ("STATE_OUT",)
    first = states.inputs(7, START)["STATE_IN"]
    np.testing.assert_array_equal(first, [[0.0]])

    out = np.array([[5.0]], np.float32)
    states.update(7, {"STATE_OUT": out, "OUTPUT": out})
    out[0, 0] = -1.0  # the store keeps its own copy
    np.testing.assert_array_equal(states.inputs(7, 0)["STATE_IN"], [[5.0]])
    np.testing.assert_array_equal(states.inputs("7", 0)["STATE_IN"], [[0.0]])  # str != int
    assert 7 in states
    assert len(states) == 1

    np.testing.assert_array_equal(states.inputs(7, START)["STATE_IN"], [[0.0]])
    assert 7 not in states  # a START forgets the old state at once


def test_states_drop_and_missing_outputs() -> None:
    states = SequenceStates(_model(states=(_state("zero", dims=(1,)),)))
    states.update(1, {"STATE_OUT": np.ones((1, 1), np.float32)})
    states.update("b", {"STATE_OUT": np.ones((1, 1), np.float32)})
    states.drop([1, "unknown"])
    assert 1 not in states
    assert "b" in states
    with pytest.raises(TritonMPError, match="did not produce state output 'STATE_OUT'"):
        states.update(2, {"OUTPUT": np.ones((1, 1), np.float32)})


def test_for_model_is_none_without_state() -> None:
    assert SequenceStates.for_model(_model()) is None
    assert SequenceStates.for_model(_model(states=(_state(),))) is not None


# --------------------------------------------------------------------------- python backend

PY_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

SEEN = []


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            seen = {"id": r.correlation_id(), "flags": r.flags(), "inputs": {}}
            for name in ("INPUT", "START", "END", "READY", "CORRID"):
                t = pb_utils.get_input_tensor_by_name(r, name)
                if t is not None:
                    seen["inputs"][name] = (t.shape(), t.as_numpy().tolist())
            SEEN.append(seen)
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", x * 2)]))
        return out
"""

PY_CONTROLS = (
    ControlSpec(name="START", kind="START", datatype="INT32"),
    ControlSpec(name="END", kind="END", datatype="FP32"),
    ControlSpec(name="READY", kind="READY", datatype="BOOL"),
    ControlSpec(name="CORRID", kind="CORRID", datatype="BYTES"),
)
INSTANCE = InstanceSpec(instance_id=0, name="seq_0", model="seq", version=1)


@pytest.fixture
def py_model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(sys, "path", list(sys.path))
    version = tmp_path / "seq" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(textwrap.dedent(PY_MODEL))
    yield version / "model.py"
    for name in [n for n in sys.modules if n.startswith("_triton_mp_model_seq")]:
        del sys.modules[name]


def _py_spec(model_file: Path, max_batch_size: int = 4, **kw: object) -> ModelVersionSpec:
    return _model(
        backend="python",
        model_file=str(model_file),
        max_batch_size=max_batch_size,
        controls=PY_CONTROLS,
        config_json=json.dumps({"name": "seq", "max_batch_size": max_batch_size}),
        **kw,  # type: ignore[arg-type]
    )


def _seen(backend: PythonBackend) -> list[dict[str, object]]:
    module = sys.modules[type(backend._model).__module__]
    seen: list[dict[str, object]] = module.SEEN
    return seen


def test_python_requests_carry_correlation_id_flags_and_their_own_control_rows(
    py_model_file: Path,
) -> None:
    spec = _py_spec(py_model_file)
    backend = PythonBackend(spec, INSTANCE)
    x = np.ones((1, 2), np.float32)
    reqs = [
        _req("seq-a", START, inputs={"INPUT": x}, outputs=("OUTPUT",)),
        _req(2**63 + 1, END, inputs={"INPUT": 3 * x}, outputs=("OUTPUT",)),
    ]
    # Direct: 4 rows, the requests in rows 3 and 1; rows 0 and 2 are null and not passed
    results, _ = backend.execute(reqs, sequence_batch(spec, reqs, 4, (3, 1)))
    assert len(results) == 2
    assert isinstance(results[1], dict)
    np.testing.assert_array_equal(results[1]["OUTPUT"], 6 * x)
    first, second = _seen(backend)
    assert first == {
        "id": "seq-a",
        "flags": 1,
        "inputs": {
            "INPUT": ([1, 2], [[1.0, 1.0]]),
            "START": ([1, 1], [[1]]),
            "END": ([1, 1], [[0.0]]),
            "READY": ([1, 1], [[True]]),
            "CORRID": ([1, 1], [[b"seq-a"]]),
        },
    }
    assert second["id"] == 2**63 + 1
    assert second["flags"] == 2
    inputs = second["inputs"]
    assert isinstance(inputs, dict)
    assert inputs["START"] == ([1, 1], [[0]])
    assert inputs["END"] == ([1, 1], [[1.0]])
    assert inputs["CORRID"] == ([1, 1], [[str(2**63 + 1).encode()]])


def test_python_model_without_batching_gets_controls_of_shape_1(py_model_file: Path) -> None:
    spec = _py_spec(py_model_file, max_batch_size=0)
    backend = PythonBackend(spec, INSTANCE)
    req = _req(5, START | END, inputs={"INPUT": np.ones(2, np.float32)}, outputs=("OUTPUT",))
    backend.execute([req], sequence_batch(spec, [req], 0, ()))
    (seen,) = _seen(backend)
    inputs = seen["inputs"]
    assert isinstance(inputs, dict)
    assert inputs["START"] == ([1], [1])
    assert inputs["END"] == ([1], [1.0])
    assert inputs["READY"] == ([1], [True])


def test_python_requests_outside_sequences_keep_id_0_and_no_controls(
    py_model_file: Path,
) -> None:
    spec = _py_spec(py_model_file)
    backend = PythonBackend(spec, INSTANCE)
    backend.execute([_req(inputs={"INPUT": np.ones((1, 2), np.float32)}, outputs=("OUTPUT",))])
    (seen,) = _seen(backend)
    assert seen["id"] == 0
    assert seen["flags"] == 0
    inputs = seen["inputs"]
    assert isinstance(inputs, dict)
    assert set(inputs) == {"INPUT"}


def test_a_python_model_with_implicit_state_fails_to_load(py_model_file: Path) -> None:
    spec = _py_spec(py_model_file, states=(_state("zero"),))
    with pytest.raises(ConfigError) as exc:
        PythonBackend(spec, INSTANCE)
    assert exc.value.code == ErrorCode.UNSUPPORTED
    assert "implicit state is not supported by the python backend" in exc.value.message
    assert "'STATE_IN'" in exc.value.message
