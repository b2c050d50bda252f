"""``TorchBackend`` in-process on CPU: TorchScript models built here, compared with torch
run directly; Triton's load-time refusals and run-time errors."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.helpers.torch_models import (  # noqa: E402
    Accumulate,
    AddSub,
    DictIn,
    Mlp,
    Raises,
    Upper,
    WrongType,
    save,
)
from triton_mp.backends.base import BackendRequest, SequenceBatch  # noqa: E402
from triton_mp.backends.pytorch.backend import TorchBackend  # noqa: E402
from triton_mp.common.errors import ConfigError, ErrorCode, TritonMPError  # noqa: E402
from triton_mp.ipc.protocol.specs import (  # noqa: E402
    BatchingSpec,
    ControlSpec,
    InstanceSpec,
    ModelVersionSpec,
    SequenceSpec,
    StateSpec,
    TensorSpec,
)

CPU = InstanceSpec(instance_id=0, name="m_0", model="m", version=1, kind="KIND_CPU")


def _spec(
    path: Path,
    inputs: list[tuple[str, str, tuple[int, ...]]],
    outputs: list[tuple[str, str, tuple[int, ...]]],
    *,
    mbs: int = 8,
    parameters: dict[str, str] | None = None,
    platform: str = "pytorch_libtorch",
) -> ModelVersionSpec:
    config = {
        "platform": platform,
        "parameters": {k: {"string_value": v} for k, v in (parameters or {}).items()},
    }
    return ModelVersionSpec(
        model="m",
        version=1,
        backend="pytorch",
        model_file=str(path),
        max_batch_size=mbs,
        batching=BatchingSpec(kind="dynamic", max_batch_size=mbs),
        inputs=tuple(TensorSpec(name=n, datatype=d, dims=s) for n, d, s in inputs),
        outputs=tuple(TensorSpec(name=n, datatype=d, dims=s) for n, d, s in outputs),
        instance_ids=(0,),
        config_json=json.dumps(config),
    )


def _req(outputs: tuple[str, ...], **inputs: np.ndarray) -> BackendRequest:
    first = next(iter(inputs.values()))
    return BackendRequest(inputs=inputs, outputs=outputs, batch_size=len(first))


def test_forward_names_and_output_indices_over_a_batch(tmp_path: Path) -> None:
    path = save(AddSub(), tmp_path / "m.pt")
    spec = _spec(
        path,
        [("y", "FP32", (4,)), ("x", "FP32", (4,))],
        [("OUTPUT__1", "FP32", (4,)), ("OUTPUT__0", "FP32", (4,))],
    )
    backend = TorchBackend(spec, CPU)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((n, 4), dtype=np.float32) for n in (1, 3)]
    ys = [rng.standard_normal((n, 4), dtype=np.float32) for n in (1, 3)]
    reqs = [_req(("OUTPUT__0", "OUTPUT__1"), x=x, y=y) for x, y in zip(xs, ys, strict=True)]
    results, times = backend.execute(reqs)
    direct = torch.jit.load(str(path))
    for r, x, y in zip(results, xs, ys, strict=True):
        want_sum, want_diff = direct(torch.from_numpy(x), torch.from_numpy(y))
        assert isinstance(r, dict)
        np.testing.assert_array_equal(r["OUTPUT__0"], want_sum.numpy())
        np.testing.assert_array_equal(r["OUTPUT__1"], want_diff.numpy())
    assert times.compute_infer_ns > 0
    backend.close()


def test_mlp_matches_torch_and_parameters_apply(tmp_path: Path) -> None:
    path = save(Mlp(width=16), tmp_path / "m.pt")
    spec = _spec(
        path,
        [("INPUT__0", "FP32", (16,))],
        [("OUTPUT__0", "FP32", (16,))],
        parameters={"INTRA_OP_THREAD_COUNT": "1", "DISABLE_OPTIMIZED_EXECUTION": "true"},
    )
    backend = TorchBackend(spec, CPU)
    assert torch.get_num_threads() == 1
    assert not torch._C._get_graph_executor_optimize()
    x = np.random.default_rng(1).standard_normal((5, 16), dtype=np.float32)
    (out,), _ = backend.execute([_req(("OUTPUT__0",), INPUT__0=x)])
    assert isinstance(out, dict)
    with torch.no_grad():
        want = torch.jit.load(str(path))(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out["OUTPUT__0"], want, rtol=1e-6)
    torch._C._set_graph_executor_optimize(True)


def test_dict_input_and_string_lists(tmp_path: Path) -> None:
    d = TorchBackend(
        _spec(
            save(DictIn(), tmp_path / "d.pt"),
            [("a", "FP32", (2,)), ("b", "FP32", (2,))],
            [("out", "FP32", (2,))],
        ),
        CPU,
    )
    a = np.array([[1, 2]], dtype=np.float32)
    b = np.array([[10, 20]], dtype=np.float32)
    (r,), _ = d.execute([_req(("out",), a=a, b=b)])
    assert isinstance(r, dict)
    np.testing.assert_array_equal(r["out"], [[12, 24]])
    u = TorchBackend(
        _spec(
            save(Upper(), tmp_path / "u.pt"),
            [("words", "BYTES", (-1,))],
            [("OUTPUT__0", "BYTES", (-1,))],
            mbs=0,
        ),
        CPU,
    )
    words = np.array([b"triton", b"mp"], dtype=np.object_)
    (r,), _ = u.execute(
        [BackendRequest(inputs={"words": words}, outputs=("OUTPUT__0",), batch_size=1)]
    )
    assert isinstance(r, dict)
    assert list(r["OUTPUT__0"]) == [b"TRITON", b"MP"]


def test_run_time_errors_have_tritons_words(tmp_path: Path) -> None:
    wrong = TorchBackend(
        _spec(save(WrongType(), tmp_path / "w.pt"), [("x", "FP32", (1,))], [("y", "FP32", (1,))]),
        CPU,
    )
    x = np.ones((1, 1), dtype=np.float32)
    with pytest.raises(TritonMPError) as e:
        wrong.execute([_req(("y",), x=x)])
    assert e.value.message == (
        "configuration expects datatype TYPE_FP32 for output 'y', model provides TYPE_INT64"
    )
    raises = TorchBackend(
        _spec(save(Raises(), tmp_path / "r.pt"), [("x", "FP32", (1,))], [("y", "FP32", (1,))]),
        CPU,
    )
    with pytest.raises(TritonMPError) as e:
        raises.execute([_req(("y",), x=-x)])
    assert e.value.code == ErrorCode.INTERNAL
    assert e.value.message.startswith("PyTorch execute failure: ")
    assert "negative input" in e.value.message


def test_load_time_refusals(tmp_path: Path) -> None:
    path = save(AddSub(), tmp_path / "m.pt")
    io = ([("x", "FP32", (4,)), ("y", "FP32", (4,))], [("OUTPUT__0", "FP32", (4,))])
    with pytest.raises(ConfigError, match="unsupported datatype TYPE_UINT32 for input 'x'"):
        TorchBackend(_spec(path, [("x", "UINT32", (4,)), ("y", "FP32", (4,))], io[1]), CPU)
    with pytest.raises(ConfigError, match="failed to convert 'sure' to boolean"):
        TorchBackend(_spec(path, *io, parameters={"INFERENCE_MODE": "sure"}), CPU)
    with pytest.raises(ConfigError, match="configuration expects 1 inputs, model provides 2"):
        TorchBackend(_spec(path, io[0][:1], io[1]), CPU)
    with pytest.raises(ConfigError, match="platform torch_aoti"):
        TorchBackend(_spec(path, *io, platform="torch_aoti"), CPU)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a torchscript file")
    with pytest.raises(ConfigError, match="failed to load model 'm'"):
        TorchBackend(_spec(broken, *io), CPU)


def test_sequence_controls_and_state_are_arguments(tmp_path: Path) -> None:
    path = save(Accumulate(), tmp_path / "acc.pt")
    base = _spec(path, [("INPUT__0", "FP32", (1,))], [("OUTPUT__0", "FP32", (1,))], mbs=2)
    spec = msgspec.structs.replace(
        base,
        sequence=SequenceSpec(
            controls=(ControlSpec(name="START__1", kind="START", datatype="FP32"),),
            states=(
                StateSpec(
                    input_name="STATE__2", output_name="STATE_OUT__1", datatype="FP32", dims=(1,)
                ),
            ),
        ),
    )
    backend = TorchBackend(spec, CPU)
    one = np.array([[2.0]], dtype=np.float32)
    reqs = [
        BackendRequest(
            inputs={"INPUT__0": one * (k + 1), "STATE__2": np.array([[10.0]], dtype=np.float32)},
            outputs=("OUTPUT__0", "STATE_OUT__1"),
            batch_size=1,
        )
        for k in range(2)
    ]
    start = np.array([[1.0], [0.0]], dtype=np.float32)
    results, _ = backend.execute(
        reqs, SequenceBatch(rows=2, slots=(0, 1), controls={"START__1": start})
    )
    assert [r["OUTPUT__0"].item() for r in results] == [2.0, 14.0]  # type: ignore[index]
    assert [r["STATE_OUT__1"].item() for r in results] == [2.0, 14.0]  # type: ignore[index]


def test_kind_gpu_without_cuda_fails_to_load(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    path = save(AddSub(), tmp_path / "m.pt")
    gpu = InstanceSpec(instance_id=0, name="m_0", model="m", version=1, kind="KIND_GPU", gpu_id=0)
    spec = _spec(path, [("x", "FP32", (4,)), ("y", "FP32", (4,))], [("OUTPUT__0", "FP32", (4,))])
    with pytest.raises(ConfigError) as e:
        TorchBackend(spec, gpu)
    assert e.value.code == ErrorCode.UNAVAILABLE
    assert "is KIND_GPU (GPU 0) but PyTorch sees no CUDA device" in e.value.message
