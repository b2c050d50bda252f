"""tune_malloc: applied on glibc, and the operator's own glibc malloc variables win."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

import triton_mp
from triton_mp.common.process.platform import tune_malloc

SRC = os.path.dirname(os.path.dirname(triton_mp.__file__))

CHILD = "from triton_mp.common.process.platform import tune_malloc; print(tune_malloc())"


def _run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("GLIBC_TUNABLES", None)
    env["PYTHONPATH"] = SRC
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_applied_on_glibc() -> None:
    assert _run({}) == "True"


def test_operator_environment_wins() -> None:
    assert _run({"MALLOC_MMAP_THRESHOLD_": "131072"}) == "False"
    assert _run({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}) == "False"


def test_never_raises_in_this_process() -> None:
    assert tune_malloc() in (True, False)
