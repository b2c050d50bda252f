"""Temporary directories a process makes for itself, named by its pid, so that the process
that outlives it can remove them when it died without cleaning up (``kill -9``).

Imported by the frontend (the native gRPC server's private socket directory,
``frontend.native.public_port``) and the supervisor, which removes a dead frontend's
directories by its pid (``supervisor.main``). A directory is
``<tempdir>/<kind>-<pid>-<random>``: ``tempfile.mkdtemp``'s, with the pid in its prefix.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

NATIVE_GRPC = "triton-mp-grpc"
"""The native gRPC server's private socket directory (``frontend.native.public_port``)."""


def make(kind: str) -> Path:
    """A new directory of this process, ``<tempdir>/<kind>-<pid>-<random>``."""
    return Path(tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-"))


def remove(kind: str, pid: int, root: Path | None = None) -> list[Path]:
    """Remove every ``kind`` directory of process ``pid`` (it is dead: its own cleanup never
    ran) under ``root`` (default: the temp directory); returns those removed."""
    base = Path(tempfile.gettempdir()) if root is None else root
    gone = []
    for path in base.glob(f"{kind}-{pid}-*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone
