"""``triton-mp stat`` run as a user runs it, with this checkout's code, for the e2e tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.helpers.server import REPO_ROOT


def run_stat(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m triton_mp stat ARGS`` with this checkout's ``src`` first on the path;
    its exit status is the caller's to check."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, "-m", "triton_mp", "stat", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=REPO_ROOT,
        check=False,
    )


def stat_models(url: str) -> dict[str, dict[str, Any]]:
    """``triton-mp stat --url URL --json``'s models by name (the command must succeed)."""
    out = run_stat("--url", url, "--json")
    assert out.returncode == 0, out.stderr
    return {m["model"]: m for m in json.loads(out.stdout)["models"]}
