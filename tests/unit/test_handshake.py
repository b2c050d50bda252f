"""The start handshake's messages on a pipe (``ipc.handshake``; no child process)."""

from __future__ import annotations

import multiprocessing as mp
import os

from triton_mp.ipc.handshake import (
    Ready,
    StartFailed,
    read_handshake,
    report_ready,
    report_start_failed,
)


def test_ready_names_the_role_the_child_and_its_pid() -> None:
    recv, send = mp.Pipe(duplex=False)
    assert read_handshake(recv) is None  # nothing yet: no wait
    report_ready(send, "worker", "m_0")
    assert read_handshake(recv) == Ready(role="worker", name="m_0", pid=os.getpid())


def test_start_failed_carries_the_reason() -> None:
    recv, send = mp.Pipe(duplex=False)
    report_start_failed(send, "frontend", "1", "failed to bind gRPC address 0.0.0.0:1")
    msg = read_handshake(recv)
    assert isinstance(msg, StartFailed)
    assert (msg.role, msg.name, msg.reason) == (
        "frontend",
        "1",
        "failed to bind gRPC address 0.0.0.0:1",
    )


def test_a_closed_pipe_or_a_stray_message_is_no_handshake() -> None:
    recv, send = mp.Pipe(duplex=False)
    send.send_bytes(b"ready")  # the raw bytes of old: not a typed message
    assert read_handshake(recv) is None
    send.close()
    assert read_handshake(recv) is None
