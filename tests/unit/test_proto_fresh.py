"""The committed src/triton_mp/_proto/ matches what scripts/gen_protos.py makes from protos/.

Runs the script's --check mode in a subprocess (it compiles into a temporary directory and
compares); a failure prints which files are stale and how to regenerate them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_generated_protos_are_fresh() -> None:
    pytest.importorskip("grpc_tools.protoc")
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "gen_protos.py"), "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
