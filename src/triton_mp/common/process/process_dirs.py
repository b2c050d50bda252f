"""Temporary directories a process makes for itself, named by its pid, so that the process
that outlives it can remove them when it died without cleaning up (``kill -9``).

Imported by the frontend (the native gRPC server's private socket directory,
``frontend.native.public_port``) and the supervisor, which removes a dead frontend's
directories by its pid (``supervisor.main``) and, as it starts, those of processes that died
with their supervisor (``sweep``: a ``kill -9`` of the whole server leaves them). A directory
is ``<tempdir>/<kind>-<pid>-<random>``: ``tempfile.mkdtemp``'s, with the pid in its prefix,
holding a ``pidns`` file with its process's pid namespace (``pid_namespace``): a pid means
something only in its namespace, and containers may share a temp directory.
Also imported by ``ipc.memory.shm`` (``pid_namespace``, ``pid_alive``, for its own sweep).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

NATIVE_GRPC = "triton-mp-grpc"
"""The native gRPC server's private socket directory (``frontend.native.public_port``)."""


MARKER = "pidns"
"""The file in each directory that holds its process's ``pid_namespace`` (decimal)."""


def pid_namespace() -> int | None:
    """The inode of this process's pid namespace (``/proc/self/ns/pid``), or None where
    ``/proc`` does not tell."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def make(kind: str) -> Path:
    """A new directory of this process, ``<tempdir>/<kind>-<pid>-<random>``, marked with its
    pid namespace (``MARKER``)."""
    path = Path(tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-"))
    namespace = pid_namespace()
    if namespace is not None:
        (path / MARKER).write_text(str(namespace))
    return path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this pid namespace runs (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # NOTE: another user's process: alive
    return True


def sweep(kind: str, root: Path | None = None) -> list[Path]:
    """Remove every ``kind`` directory under ``root`` (default: the temp directory) whose
    process no longer runs, judged only for directories marked with this process's pid
    namespace (an unmarked one, or another namespace's, is left alone); returns those
    removed."""
    base = Path(tempfile.gettempdir()) if root is None else root
    own = pid_namespace()
    if own is None:
        return []
    gone = []
    for path in base.glob(f"{kind}-*-*"):
        pid_text = path.name.removeprefix(f"{kind}-").split("-", 1)[0]
        if not pid_text.isdigit() or path.is_symlink() or not path.is_dir():
            continue
        try:
            marked = int((path / MARKER).read_text())
        except (OSError, ValueError):
            continue
        if marked == own and not pid_alive(int(pid_text)):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


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
