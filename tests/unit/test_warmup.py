"""Unit tests for workers.warmup (sample data and runs) and the planner's warmup specs.

No process is started: specs are built in memory, the backend is a fake.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from triton_mp._proto import model_config_pb2 as pb
from triton_mp.backends.base import RESPONDED, BackendRequest, PhaseTimes, Result, SequenceBatch
from triton_mp.common.errors import ConfigError, ErrorCode, TritonMPError
from triton_mp.common.numpy_tensors import serialize_bytes_tensor
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    ControlSpec,
    ModelVersionSpec,
    SequenceSpec,
    TensorSpec,
    WarmupInputSpec,
    WarmupSampleSpec,
)
from triton_mp.model_config.ensemble import validate_ensemble_scheduling
from triton_mp.model_config.loader import ModelVersion, RepositoryModel
from triton_mp.model_config.plan import plan_models
from triton_mp.workers.warmup import WarmupToken, build_samples, warm_up


def _spec(
    samples: tuple[WarmupSampleSpec, ...],
    max_batch_size: int = 4,
    inputs: tuple[TensorSpec, ...] = (TensorSpec(name="IN", datatype="FP32", dims=(3,)),),
    sequence: SequenceSpec | None = None,
) -> ModelVersionSpec:
    return ModelVersionSpec(
        model="m",
        version=1,
        backend="python",
        model_file="/x/model.py",
        max_batch_size=max_batch_size,
        batching=BatchingSpec(),
        inputs=inputs,
        outputs=(TensorSpec(name="OUT", datatype="FP32", dims=(3,)),),
        instance_ids=(0,),
        sequence=sequence,
        warmup=samples,
    )


def _input(source: str, name: str = "IN", datatype: str = "FP32", **kw: object) -> WarmupInputSpec:
    dims = kw.pop("dims", (3,))
    return WarmupInputSpec(name=name, datatype=datatype, dims=dims, source=source, **kw)  # type: ignore[arg-type]


def _sample(*inputs: WarmupInputSpec, batch_size: int = 1, count: int = 1) -> WarmupSampleSpec:
    return WarmupSampleSpec(name="s", batch_size=batch_size, count=count, inputs=inputs)


def test_zero_data_makes_batch_size_requests_of_batch_one() -> None:
    (sample,) = build_samples(_spec((_sample(_input("zero"), batch_size=3, count=2),)))
    assert sample.count == 2
    assert len(sample.requests) == 3
    for feeds in sample.requests:
        assert feeds["IN"].shape == (1, 3)
        assert feeds["IN"].dtype == np.float32
        assert not feeds["IN"].any()


def test_a_model_without_batching_gets_the_dims_as_they_are() -> None:
    (sample,) = build_samples(_spec((_sample(_input("zero")),), max_batch_size=0))
    assert sample.requests[0]["IN"].shape == (3,)


def test_batch_size_zero_skips_and_count_zero_runs_once() -> None:
    samples = build_samples(
        _spec((_sample(_input("zero"), batch_size=0), _sample(_input("zero"), count=0)))
    )
    assert [s.count for s in samples] == [1]


def test_random_data_is_random_of_the_right_type() -> None:
    spec = _spec(
        (
            _sample(
                _input("random", dims=(64,)),
                _input("random", name="B", datatype="BOOL", dims=(64,)),
                _input("random", name="S", datatype="BYTES", dims=(2,)),
            ),
        ),
        inputs=(TensorSpec(name="IN", datatype="FP32", dims=(64,)),),
    )
    (sample,) = build_samples(spec, seed=1)
    feeds = sample.requests[0]
    assert feeds["IN"].dtype == np.float32
    assert feeds["IN"].shape == (1, 64)
    raw = feeds["IN"].view(np.uint32)
    assert len(set(raw.reshape(-1).tolist())) > 32
    assert feeds["B"].dtype == np.bool_
    # NOTE: strings are zeros in Triton's form: empty elements.
    assert feeds["S"].tolist() == [b"", b""]


def test_data_files_are_raw_bytes_and_strings_length_prefixed(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(struct.pack("<4f", 1.0, 2.0, 3.0, 99.0))
    strings = np.array([b"ab", b"c"], dtype=np.object_)
    (tmp_path / "s.bin").write_bytes(serialize_bytes_tensor(strings))
    spec = _spec(
        (
            _sample(
                _input("file", data_file=str(tmp_path / "f.bin"), file_name="f.bin"),
                _input(
                    "file",
                    name="S",
                    datatype="BYTES",
                    dims=(2,),
                    data_file=str(tmp_path / "s.bin"),
                    file_name="s.bin",
                ),
            ),
        )
    )
    (sample,) = build_samples(spec)
    # NOTE: extra bytes past the tensor are ignored, as in Triton.
    assert sample.requests[0]["IN"].tolist() == [[1.0, 2.0, 3.0]]
    # NOTE: "S" is not a config input: no batch dimension is added (Triton's override inputs).
    assert sample.requests[0]["S"].tolist() == [b"ab", b"c"]


def _error(spec: ModelVersionSpec) -> str:
    with pytest.raises(TritonMPError) as info:
        build_samples(spec)
    assert info.value.code == ErrorCode.INVALID_ARG
    return info.value.message


def test_tritons_messages_for_bad_samples(tmp_path: Path) -> None:
    (tmp_path / "short.bin").write_bytes(b"\0" * 5)
    assert _error(_spec((_sample(_input("zero", dims=(-1,))),))) == (
        "warmup setting expects all variable-size dimensions are specified for input 'IN'"
    )
    assert _error(_spec((_sample(_input("")),))) == (
        "[request id: <id_unknown>] warmup setting expects input 'IN' to have input_data_type set"
    )
    short = _input("file", data_file=str(tmp_path / "short.bin"), file_name="short.bin")
    assert _error(_spec((_sample(short),))) == (
        "[request id: <id_unknown>] warmup setting expects 12 bytes, but the data provided "
        "from short.binonly has 5 bytes"
    )
    assert _error(_spec((_sample(_input("zero", datatype="INVALID")),))) == (
        "[request id: <id_unknown>] inference input 'IN' data-type is 'INVALID', but model "
        "'m' expects 'FP32'"
    )
    assert _error(_spec((_sample(_input("zero", dims=(4,))),))) == (
        "[request id: <id_unknown>] unexpected shape for input 'IN' for model 'm'. Expected "
        "[-1,3], got [1,4]. NOTE: Setting a non-zero max_batch_size in the model config "
        "requires a batch dimension to be prepended to each input shape. If you want to "
        "specify the full shape including the batch dim in your input dims config, try "
        "setting max_batch_size to zero. See the model configuration docs for more info on "
        "max_batch_size."
    )
    missing = _input("file", data_file=str(tmp_path / "nope.bin"), file_name="nope.bin")
    assert _error(_spec((_sample(missing),))).startswith(
        f"failed to open text file for read {tmp_path / 'nope.bin'}: "
    )


def test_sequence_control_inputs_become_control_tensors() -> None:
    seq = SequenceSpec(controls=(ControlSpec(name="START", kind="START", datatype="INT32"),))
    spec = _spec(
        (
            _sample(
                _input("zero"),
                _input("zero", name="START", datatype="INT32", dims=(1,)),
                batch_size=2,
            ),
        ),
        sequence=seq,
    )
    (sample,) = build_samples(spec)
    assert list(sample.requests[0]) == ["IN"]
    assert sample.controls[0]["START"].shape == (1, 1)


class _Fake:
    """A backend that records its batches and answers as told."""

    def __init__(self, answer: str = "ok") -> None:
        self.batches: list[tuple[int, SequenceBatch | None]] = []
        self.answer = answer
        self.responder = None

    def execute(
        self, requests: Sequence[BackendRequest], sequence: SequenceBatch | None = None
    ) -> tuple[list[Result], PhaseTimes]:
        self.batches.append((len(requests), sequence))
        if self.answer == "raise":
            raise RuntimeError("kaboom")
        if self.answer == "error":
            return [
                ErrorInfo(ErrorCode.INTERNAL, f"bad {i}", "x") for i in range(len(requests))
            ], PhaseTimes(0, 0)
        if self.answer == "decoupled":
            tokens = [r.token for r in requests]

            def later() -> None:
                for t in tokens:
                    assert isinstance(t, WarmupToken)
                    t.record({"OUT": np.zeros(3)}, False)
                    t.record(None, True)

            threading.Thread(target=later).start()
            return [RESPONDED] * len(requests), PhaseTimes(0, 0)
        return [{"OUT": r.inputs["IN"]} for r in requests], PhaseTimes(0, 0)

    def close(self) -> None:
        pass


def test_each_sample_runs_count_times_as_one_batch() -> None:
    spec = _spec((_sample(_input("zero"), batch_size=3, count=2), _sample(_input("zero"))))
    backend = _Fake()
    warm_up(backend, spec, "m_0_0", build_samples(spec))
    assert [n for n, _ in backend.batches] == [3, 3, 1]


def test_decoupled_samples_wait_for_their_final_responses() -> None:
    spec = _spec((_sample(_input("zero"), batch_size=2),))
    backend = _Fake("decoupled")
    warm_up(backend, spec, "m_0_0", build_samples(spec))
    assert [n for n, _ in backend.batches] == [2]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("error", "failed to run warmup sample 's': bad 0; bad 1; "),
        ("raise", "failed to run warmup sample 's': RuntimeError: kaboom; "),
    ],
)
def test_a_failing_sample_stops_the_warmup(answer: str, message: str) -> None:
    spec = _spec((_sample(_input("zero"), batch_size=2, count=3), _sample(_input("zero"))))
    backend = _Fake(answer)
    with pytest.raises(TritonMPError) as info:
        warm_up(backend, spec, "m_0_0", build_samples(spec))
    assert info.value.message == message
    assert len(backend.batches) == 1


def test_a_sequence_sample_gets_its_rows_and_controls() -> None:
    seq = SequenceSpec(controls=(ControlSpec(name="START", kind="START", datatype="INT32"),))
    spec = _spec(
        (
            _sample(
                _input("zero"),
                _input("zero", name="START", datatype="INT32", dims=(1,)),
                batch_size=2,
            ),
        ),
        sequence=seq,
    )
    backend = _Fake()
    warm_up(backend, spec, "m_0_0", build_samples(spec))
    ((n, batch),) = backend.batches
    assert n == 2
    assert batch is not None
    assert batch.rows == 2
    assert batch.slots == (0, 1)
    assert batch.controls["START"].shape == (2, 1)


def test_the_planner_turns_model_warmup_into_specs() -> None:
    text = """
    name: "m" backend: "python" max_batch_size: 2
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },
            { name: "B" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "O" data_type: TYPE_FP32 dims: [ 2 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
    model_warmup [ { name: "w" batch_size: 2 count: 3 inputs [
      { key: "B" value: { data_type: TYPE_INT32 dims: [ 1 ] random_data: true } },
      { key: "A" value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "a.bin" } } ] } ]
    """
    config = text_format.Parse(text, pb.ModelConfig())
    d = Path("/repo/m")
    m = RepositoryModel("m", d, config, (ModelVersion(1, d / "1", d / "1/model.py"),), None)
    plans, _ = plan_models([m])
    (w,) = plans[0].versions[0].warmup
    assert (w.name, w.batch_size, w.count) == ("w", 2, 3)
    assert w.inputs == (
        WarmupInputSpec(
            name="A",
            datatype="FP32",
            dims=(2,),
            source="file",
            data_file="/repo/m/warmup/a.bin",
            file_name="a.bin",
        ),
        WarmupInputSpec(name="B", datatype="INT32", dims=(1,), source="random"),
    )


def test_ensembles_refuse_warmup() -> None:
    config = text_format.Parse(
        'name: "e" platform: "ensemble" '
        'ensemble_scheduling { step [ { model_name: "m" model_version: -1 } ] } '
        'model_warmup [ { name: "w" batch_size: 1 } ]',
        pb.ModelConfig(),
    )
    with pytest.raises(ConfigError) as info:
        validate_ensemble_scheduling(config)
    assert info.value.message == "model_warmup can not be specified for ensemble 'e'"
