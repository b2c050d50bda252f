"""The start handshake: each child's first message to the supervisor (STYLE.md rule 7).

Imported by every role's entry point (to report) and by the supervisor
(``supervisor.processes.children``, to wait for it with a deadline). Every child process gets one
end of a pipe from the supervisor; the first and, for the scheduler and workers, only message on
it is ``Ready`` (the role can serve) or ``StartFailed`` (why it cannot; the child then
exits). A child that dies before either, or stays silent past ``--startup-timeout-secs``,
is reported by the supervisor from its exit code or the deadline. A frontend's pipe then
stays open as its control pipe (``ToSupervisor`` / ``FromSupervisor``, ``ipc.protocol.messages``).
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Literal

import msgspec

from triton_mp.ipc.recordio.codec import Decoder, encode

Role = Literal["frontend", "scheduler", "worker"]
"""The process roles the supervisor starts."""

CALLS_CUT_EXIT = 3
"""A frontend's exit status when its stop had to cancel calls whose answers were not sent
within ``--exit-timeout-secs`` (``frontend.main._drain``); the supervisor then logs 2.51's
"Exit timeout expired" and exits 1, as tritonserver does (``supervisor.main._stop_all``).
A clean drain exits 0; 1 is a failed start."""


class Ready(msgspec.Struct, frozen=True, kw_only=True, tag="ready"):
    """The child serves: its backend is loaded, its ports are bound, its rings attached."""

    role: Role
    name: str
    """The child's name: frontend id, ``scheduler``, or the instance name of a worker."""
    pid: int


class StartFailed(msgspec.Struct, frozen=True, kw_only=True, tag="start_failed"):
    """The child cannot serve and is about to exit."""

    role: Role
    name: str
    pid: int
    reason: str
    """Triton-like text for the log and a load call's answer, e.g. a backend's error."""


Handshake = Ready | StartFailed

_decoder: Decoder[Handshake] = Decoder(Handshake)


def report_ready(conn: Connection, role: Role, name: str) -> None:
    """Tell the supervisor that this process serves (once, after everything is up)."""
    conn.send_bytes(encode(Ready(role=role, name=name, pid=os.getpid())))


def report_start_failed(conn: Connection, role: Role, name: str, reason: str) -> None:
    """Tell the supervisor why this process cannot serve (then exit)."""
    conn.send_bytes(encode(StartFailed(role=role, name=name, pid=os.getpid(), reason=reason)))


def read_handshake(conn: Connection) -> Handshake | None:
    """The child's handshake, when one is waiting on ``conn`` (the supervisor's end).

    Returns:
        The message; None when none is waiting, the child closed the pipe (it died), or
        what arrived is not a handshake.
    """
    try:
        if not conn.poll():
            return None
        return _decoder.decode(conn.recv_bytes())
    except (EOFError, OSError, msgspec.DecodeError):
        return None
