"""Refuse to measure triton-mp's native gRPC frontend with a build that would not serve it.

Imported by the benchmarks that start triton-mp (``bench_vs_triton.py``, ``ab_interleaved.py``,
``ab_frontends.py``, ``ab_c1.py``). Where a ``src/``'s native extension is missing or was
built from older sources (``triton_mp.frontend.native``: the extension's ``ABI`` is not the
Python side's ``_ABI``), or ``TRITON_MP_NATIVE=0`` is set, the server logs one warning and
serves gRPC from Python: a run would then measure the Python frontend under the native one's
name. These tools refuse to start instead, unless ``--grpc-frontend python`` is what they
measure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from common import BenchError  # bench/ is on sys.path when a benchmark runs as a script

_PROBE = "import triton_mp.frontend.native as n; print(n.UNAVAILABLE)"
"""Prints why the native gRPC frontend is unavailable, as the server would decide it ("" when
it serves): the frontend's own check, in a process of that ``src/``."""


class NativeUnavailable(BenchError):
    """A ``src/`` whose native gRPC frontend would not serve; the message is one line."""


def native_unavailable(src: Path) -> str:
    """Why a server of ``src`` (a triton-mp ``src/`` folder) would not serve gRPC natively:
    the frontend's ``UNAVAILABLE`` text (no extension, an ABI other than its sources',
    ``TRITON_MP_NATIVE=0``); "" when it would."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines()
        return lines[-1] if lines else f"the probe exited {probe.returncode}"
    return probe.stdout.strip()


def require_native(src: Path, what: str) -> None:
    """Raise ``NativeUnavailable`` (one line: ``what``, ``src`` and why) unless a server of
    ``src`` would serve gRPC natively."""
    why = native_unavailable(src)
    if why:
        raise NativeUnavailable(
            f"refusing to measure {what}: the native gRPC frontend of {src} is unavailable "
            f"({why}); build it (python setup.py build_ext --inplace) or measure "
            "--grpc-frontend python"
        )
