"""Unit tests for backends.registry: the one table of supported backends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from triton_mp.backends.registry import BACKENDS, BackendInfo, load_backend
from triton_mp.common.errors import ConfigError, ErrorCode
from triton_mp.ipc.protocol.specs import BatchingSpec, InstanceSpec, ModelVersionSpec

SRC = Path(__file__).resolve().parents[2] / "src"


def _spec(backend: str) -> ModelVersionSpec:
    return ModelVersionSpec(
        model="m",
        version=1,
        backend=backend,
        model_file="/nowhere",
        max_batch_size=0,
        batching=BatchingSpec(kind="default", max_batch_size=0),
        inputs=(),
        outputs=(),
        instance_ids=(0,),
    )


INSTANCE = InstanceSpec(instance_id=0, name="m_0", model="m", version=1)


def test_supported_backends() -> None:
    assert sorted(BACKENDS) == ["onnxruntime", "python", "pytorch", "tensorrt"]
    runs = sorted(name for name, info in BACKENDS.items() if info.runs)
    assert runs == ["onnxruntime", "python", "pytorch"]
    for name, info in BACKENDS.items():
        assert info.name == name
        assert info.default_model_filename.startswith("model.")


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_loaders_and_hooks_resolve(name: str) -> None:
    info = BACKENDS[name]
    if info.runs:
        assert callable(info.backend_class())
    hook = info.auto_complete_hook()
    assert (hook is None) == (name == "tensorrt")
    assert hook is None or callable(hook)


def test_missing_optional_package_is_named_without_importing_it() -> None:
    info = BackendInfo("x", (), "model.x", requires="no_such_package_here", extra="x")
    assert info.missing() == (
        "the x backend needs the 'no_such_package_here' package (pip install 'triton-mp[x]')"
    )
    assert BACKENDS["onnxruntime"].missing() == ""
    pytest.importorskip("torch")
    assert BACKENDS["pytorch"].missing() == ""


@pytest.mark.parametrize("backend", ["tensorrt", "tensorflow", ""])
def test_load_backend_refuses_what_no_worker_runs(backend: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_backend(_spec(backend), INSTANCE)
    assert info.value.code == ErrorCode.UNSUPPORTED
    assert info.value.message == (f"backend '{backend}' of model 'm' is not supported by triton-mp")


def test_importing_the_registry_loads_no_backend_library() -> None:
    code = (
        "import sys, triton_mp.backends.registry, triton_mp.model_config.loader;"
        "print(','.join(m for m in ('onnx', 'onnxruntime') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == ""
