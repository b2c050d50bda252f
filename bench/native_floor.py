"""The native floor as a bench side: ``bench/peers/native_floor/`` (a C++ KServe v2 server on
Debian's libgrpc++, async completion queue, add_sub_py computed inline) built on first use
into ``.peers/native-floor/`` and run with one completion queue. What a native gRPC frontend
costs per call before any work of its own: the peer of triton-mp's frontend CPU per
inference (bench_vs_triton.py's "frontend vs the native floor" line).

Build needs (Debian 12): g++ pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
protobuf-compiler (the same packages as the native gRPC frontend; ~45-150 s on 2 cores).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from common import BENCH, ROOT, BenchError, Floor

SOURCES = BENCH / "peers" / "native_floor"
BINARY = ROOT / ".peers" / "native-floor" / "native_floor"


def ensure_built(binary: Path = BINARY) -> Path:
    """The native floor's binary, built first when missing.

    Raises:
        BenchError: the build failed (its output's tail says why).
    """
    if binary.is_file():
        return binary
    out = subprocess.run(
        ["bash", str(SOURCES / "build.sh"), str(ROOT / "protos"), str(binary.parent)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0 or not binary.is_file():
        raise BenchError(f"native floor build failed: {(out.stdout + out.stderr)[-800:]}")
    return binary


class NativeFloor(Floor):
    """``native_floor --port P --cqs 1`` as our child in its own session (SIGTERM stops it:
    no handler, exit -15 is clean)."""

    kind = "native floor"

    def __init__(self, log_path: Path, start_timeout: float = 60.0, stop_timeout: float = 10.0):
        super().__init__(log_path, start_timeout, stop_timeout)
        self.cmd = [str(ensure_built()), "--port", str(self.grpc), "--cqs", "1"]
        self.info["cmd"] = " ".join(self.cmd)
