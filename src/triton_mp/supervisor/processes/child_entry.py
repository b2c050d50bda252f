"""The spawn target of every child process: set the process up, then run its role.

Imported by ``supervisor.processes.children`` (in the supervisor) and, through ``multiprocessing``'s
spawn, by every child first. So this module imports only what every child needs
(``common.process.platform``, ``ipc.memory.heartbeat``) and the role's entry point
lazily: the scheduler never loads the repository loader, protobuf, numpy or a backend, a
worker never loads grpc, a frontend never loads onnxruntime (tests/unit/test_layering.py and
tests/e2e/test_lifecycle.py check it).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
from multiprocessing.connection import Connection

from triton_mp.common.process.platform import die_with_parent, set_process_title, tune_malloc
from triton_mp.ipc.handshake import Role
from triton_mp.ipc.memory.heartbeat import start_beating


def _end_without_teardown(status: list[int]) -> None:
    """The child's last exit handler: once its role returned ``status[0]`` and every exit
    handler registered since the role started has run, flush the logs and end the process
    without the interpreter's teardown (nothing when the role raised instead).

    NOTE: the role has closed and unlinked what it owns by then; the teardown only frees
    memory that exiting frees anyway, and its final garbage collection over numpy,
    onnxruntime, protobuf... took 0.3-0.5 s of CPU in each worker: with ten workers and the
    scheduler doing it at once on a busy 2-core machine, Ctrl-C waited 6-12 s and the
    supervisor killed the last workers as "did not stop" (issue 36).
    """
    if status:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status[0])


def _await_role(role: Role, conn: Connection) -> bytes:
    """A spare (``supervisor.processes.frontend_restart``): its imports are done; wait for the name
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
            start (``ipc.memory.heartbeat``), so a child whose interpreter stops responding is
            found; None when heartbeats are off.
    """
    die_with_parent(parent_pid)
    # NOTE: registered first, it runs last (atexit is LIFO): after the handlers the role's
    # code registered (weakref finalizers, a model's own), before the interpreter teardown.
    # The two registered earlier, at import, are logging's (run by it) and multiprocessing's
    # (which the child's bootstrap ran already).
    status: list[int] = []
    atexit.register(_end_without_teardown, status)
    if heartbeat is not None:
        start_beating(*heartbeat)
    if role == "frontend" and not spec_bytes:
        set_process_title("spare", role)  # NOTE: "frontend <id>" once it takes a place
    else:
        set_process_title(role, name)
    os.environ.update(env)
    tune_malloc()
    if role == "frontend":
        from triton_mp.frontend.http.aiohttp_import import import_aiohttp_without_client_tls

        import_aiohttp_without_client_tls()  # NOTE: first: the frontend's modules import it
        from triton_mp.frontend.main import run_frontend as run

        if not spec_bytes:
            spec_bytes = _await_role(role, conn)
    elif role == "scheduler":
        from triton_mp.scheduler.main import run_scheduler as run
    else:
        from triton_mp.workers.main import run_worker as run
    status.append(run(spec_bytes, conn))
    raise SystemExit(status[0])
