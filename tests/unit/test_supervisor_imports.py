"""The supervisor's module graph stays free of the frontend's serving libraries and numpy.

The supervisor sits on every server start's critical path; ``supervisor.models.bls_control``
imports ``frontend.admin.repository`` for its load rules, and that module must not pull in
``asyncio`` (through ``frontend.admin.control.SupervisorLink``, ~30 ms CPU per start), nor
grpc or aiohttp; the config checks' ``common.datatypes`` and the wiring's response cache
must not pull in numpy (0.1-0.16 s), nor anything onnx. One fresh interpreter (~0.3 s), no
server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import triton_mp

FORBIDDEN = ("asyncio", "grpc", "aiohttp", "numpy", "onnx")
SRC = str(Path(triton_mp.__file__).resolve().parents[1])
"""This checkout's ``src`` (the venv may hold another checkout's editable install)."""


def test_supervisor_main_imports_no_asyncio_grpc_aiohttp_or_numpy() -> None:
    code = (
        "import sys, triton_mp.supervisor.main\n"
        f"print(' '.join(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, (SRC, os.environ.get("PYTHONPATH"))))
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    assert out.stdout.strip() == "", f"the supervisor imports {out.stdout.strip()}"
