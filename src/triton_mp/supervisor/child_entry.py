"""The spawn target of every child process: set the process up, then run its role.

Imported by ``supervisor.children`` (in the supervisor) and, through ``multiprocessing``'s
spawn, by every child first. So this module imports only what every child needs
(``common.platform``, ``ipc.heartbeat``) and the role's entry point
lazily: the scheduler never loads the repository loader, protobuf, numpy or a backend, a
worker never loads grpc, a frontend never loads onnxruntime (tests/unit/test_layering.py and
tests/e2e/test_lifecycle.py check it).
"""

from __future__ import annotations

import os
import signal
from multiprocessing.connection import Connection

from triton_mp.common.platform import die_with_parent, set_process_title, tune_malloc
from triton_mp.ipc.handshake import Role
from triton_mp.ipc.heartbeat import start_beating


def _await_role(role: Role, conn: Connection) -> bytes:
    """A spare (``supervisor.frontend_restart``): its imports are done; wait for the name
    and the spec of the frontend it replaces. Returns the spec."""
    # NOTE: Ctrl-C reaches the whole group; the supervisor drains, a spare just waits.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        name = conn.recv_bytes().decode()
        spec_bytes = conn.recv_bytes()
    except (EOFError, OSError):
        raise SystemExit(0) from None  # NOTE: the server stopped; it was never needed.
    set_process_title(role, name)
    return spec_bytes


def child_main(
    role: Role,
    name: str,
    parent_pid: int,
    spec_bytes: bytes,
    conn: Connection,
    env: dict[str, str],
    heartbeat: tuple[str, int, float] | None = None,
) -> None:
    """Entry of every child process: import only the role's own module, then run it.

    Args:
        role: which entry point to run.
        name: the child's name (process title ``triton-mp: <role> <name>``).
        parent_pid: the supervisor's pid (the child dies with it).
        spec_bytes: the role's encoded spec; empty for a spare frontend, which imports its
            role's code and then reads its name and spec from ``conn``.
        conn: the child's end of its pipe (``ipc.handshake``; a frontend's control pipe).
        env: environment variables to set first (``CUDA_VISIBLE_DEVICES``).
        heartbeat: ``(board name, slot, interval_s)``: a thread beats the slot from the
            start (``ipc.heartbeat``), so a child whose interpreter stops responding is
            found; None when heartbeats are off.
    """
    die_with_parent(parent_pid)
    if heartbeat is not None:
        start_beating(*heartbeat)
    if role == "frontend" and not spec_bytes:
        set_process_title("spare", role)  # NOTE: "frontend <id>" once it takes a place
    else:
        set_process_title(role, name)
    os.environ.update(env)
    tune_malloc()
    if role == "frontend":
        from triton_mp.frontend.main import run_frontend as run

        if not spec_bytes:
            spec_bytes = _await_role(role, conn)
    elif role == "scheduler":
        from triton_mp.scheduler.main import run_scheduler as run
    else:
        from triton_mp.workers.main import run_worker as run
    raise SystemExit(run(spec_bytes, conn))
