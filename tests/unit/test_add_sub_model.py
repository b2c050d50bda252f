"""The committed add_sub model computes sum and difference, and its generator reproduces it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL_PATH = ROOT / "model_repository/add_sub/1/model.onnx"
SCRIPT_PATH = ROOT / "scripts/make_add_sub_onnx.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_add_sub_onnx", SCRIPT_PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return ort.InferenceSession(str(MODEL_PATH), providers=["CPUExecutionProvider"])


def test_signature(session: ort.InferenceSession) -> None:
    inputs = {i.name: (i.shape, i.type) for i in session.get_inputs()}
    outputs = {o.name: (o.shape, o.type) for o in session.get_outputs()}
    expected = (["batch", 16], "tensor(float)")
    assert inputs == {"INPUT0": expected, "INPUT1": expected}
    assert outputs == {"OUTPUT0": expected, "OUTPUT1": expected}


@pytest.mark.parametrize("batch", [1, 5])
def test_sum_and_difference(session: ort.InferenceSession, batch: int) -> None:
    rng = np.random.default_rng(batch)
    a = rng.standard_normal((batch, 16)).astype(np.float32)
    b = rng.standard_normal((batch, 16)).astype(np.float32)
    out0, out1 = session.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    assert (out0.dtype, out0.shape) == (np.float32, (batch, 16))
    assert (out1.dtype, out1.shape) == (np.float32, (batch, 16))
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)


def test_generator_reproduces_committed_model(tmp_path: Path) -> None:
    script = _load_script()
    out = tmp_path / "model.onnx"
    assert script.main(["--output", str(out)]) == 0
    built = onnx.load(out)
    committed = onnx.load(MODEL_PATH)
    assert built.graph == committed.graph
    assert list(built.opset_import) == list(committed.opset_import)
    assert built.ir_version == committed.ir_version
