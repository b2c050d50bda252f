"""ipc.memory.cuda_ipc loads no CUDA at import and fails clearly where CUDA is absent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc.memory import cuda_ipc


def test_import_loads_no_cuda() -> None:
    code = "import sys, triton_mp.ipc.memory.cuda_ipc; print('cuda.bindings' in sys.modules)"
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "False"


def test_bad_handles_and_missing_cuda() -> None:
    with pytest.raises(TritonMPError) as e:
        cuda_ipc.open_handle(b"short")
    assert e.value.code == ErrorCode.INVALID_ARG
    if cuda_ipc.available():
        pytest.skip("this host has CUDA")
    with pytest.raises(TritonMPError) as e:
        cuda_ipc.HandleCache().pointer(bytes(64))
    assert e.value.code in (ErrorCode.UNAVAILABLE, ErrorCode.INVALID_ARG)
    cuda_ipc.HandleCache().forget(bytes(64))  # never opened: nothing to do
