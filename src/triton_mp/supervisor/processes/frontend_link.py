"""The supervisor's end of the frontends' control pipes.

Imported by ``supervisor.models.model_control``. Each frontend's duplex pipe (after its start
handshake, ``ipc.handshake``) carries ``ToSupervisor`` up (RepositoryModelLoad/Unload calls,
acknowledgements of model table updates) and ``FromSupervisor`` down (the calls' replies,
``ModelTableUpdate``). One reader thread per frontend hands calls to model control's change
thread and records acknowledgements; ``update`` sends one table update to every frontend and,
when asked, waits until each applied it (from then on no frontend routes by the old table).
A frontend that died is ``detach``-ed (updates skip it and nobody waits for its
acknowledgement); the one restarted in its place is ``attach_one``-ed with a spec built on
model control's change thread, the only thread that sends updates, so it misses none.

Only a pipe's reader thread closes it. ``multiprocessing``'s ``recv_bytes`` reads the
descriptor number it took at the start of a message: a pipe closed under it by another
thread frees that number for the next pipe opened (a restarted frontend's), and the old
thread would then read part of the new pipe's messages. ``detach`` shuts the socket down
instead, which ends the reader's read with EOF, and the reader closes it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import msgspec

from triton_mp.common.process.fd_sockets import socket_over
from triton_mp.ipc import encode
from triton_mp.ipc.protocol.control_messages import (
    ControlReply,
    ModelLoadCall,
    ModelTableUpdate,
    ModelUnloadCall,
    TableAck,
    ToSupervisor,
)
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate, apply_update
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.ipc.recordio.codec import Decoder

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 30.0
"""How long a frontend may take to apply a model table update."""

Call = ModelLoadCall | ModelUnloadCall
OnCall = Callable[[int, Call], None]
"""Called (on a reader thread) with the frontend id and each call it forwards."""


@dataclass
class _Pipe:
    conn: Connection
    lock: threading.Lock = field(default_factory=threading.Lock)


class FrontendLink:
    """The control pipes of every frontend (see the module docstring).

    Args:
        stopping: whether the server is shutting down (an update stops waiting for acks).
    """

    def __init__(self, stopping: Callable[[], bool]) -> None:
        self._stopping = stopping
        self._pipes: dict[int, _Pipe] = {}
        self._seq = 0
        self._acks: dict[int, set[int]] = {}
        self._ack_cv = threading.Condition()
        self._closed = False
        self._on_call: OnCall | None = None

    def attach(self, conns: dict[int, Connection], on_call: OnCall) -> list[threading.Thread]:
        """Start one reader thread per frontend's pipe; returns the threads."""
        self._on_call = on_call
        return [self.attach_one(i, c) for i, c in conns.items()]

    def attach_one(self, frontend_id: int, conn: Connection) -> threading.Thread:
        """Serve the pipe of a frontend started in a dead one's place (after ``attach``)."""
        assert self._on_call is not None
        pipe = _Pipe(conn)
        with self._ack_cv:
            self._pipes[frontend_id] = pipe
        t = threading.Thread(
            target=self._read,
            args=(frontend_id, pipe, self._on_call),
            name=f"control-f{frontend_id}",
            daemon=True,
        )
        t.start()
        return t

    def detach(self, frontend_id: int) -> None:
        """Forget a dead frontend's pipe: no update goes to it, nobody waits for it."""
        with self._ack_cv:
            pipe = self._pipes.pop(frontend_id, None)
            self._ack_cv.notify_all()
        if pipe is not None:
            with pipe.lock:
                _end_reads(pipe.conn)

    def attached(self) -> frozenset[int]:
        """The frontends whose pipes are served now."""
        with self._ack_cv:
            return frozenset(self._pipes)

    def close(self) -> None:
        """Stop reading (server shutdown)."""
        self._closed = True

    def _read(self, frontend_id: int, pipe: _Pipe, on_call: OnCall) -> None:
        """The reader thread of one frontend's pipe: serves it until EOF, then closes it."""
        try:
            self._serve(frontend_id, pipe.conn, on_call)
        finally:
            with pipe.lock, contextlib.suppress(OSError):
                pipe.conn.close()

    def _serve(self, frontend_id: int, conn: Connection, on_call: OnCall) -> None:
        decoder: Decoder[ModelLoadCall | ModelUnloadCall | TableAck | LogSettingsUpdate] = Decoder(
            ToSupervisor
        )
        while not self._closed:
            try:
                msg = decoder.decode(conn.recv_bytes())
            except (EOFError, OSError):
                return
            except Exception:  # noqa: BLE001 - a bad message must not end the thread
                log.exception("bad control message from frontend %d", frontend_id)
                continue
            if isinstance(msg, LogSettingsUpdate):
                apply_update(msg)  # the supervisor's own lines follow the client's settings
            elif isinstance(msg, TableAck):
                with self._ack_cv:
                    self._acks.setdefault(msg.seq, set()).add(frontend_id)
                    self._ack_cv.notify_all()
            else:
                on_call(frontend_id, msg)

    def reply(self, frontend_id: int, call_id: int, error: ErrorInfo | None) -> None:
        """Answer one call of a frontend (None: success)."""
        with self._ack_cv:
            pipe = self._pipes.get(frontend_id)
        if pipe is None:
            return
        with pipe.lock, contextlib.suppress(OSError):
            pipe.conn.send_bytes(encode(ControlReply(call_id=call_id, error=error)))

    def update(self, update: ModelTableUpdate, ack: bool) -> None:
        """Send one update to every frontend; with ``ack``, wait (up to ``ACK_TIMEOUT_S``)
        until each applied it. Nothing happens before the frontends are attached."""
        self.update_each({i: update for i in self.attached()}, ack)

    def update_each(self, updates: Mapping[int, ModelTableUpdate], ack: bool) -> None:
        """Send each frontend its own update (by frontend id: the rings from new workers
        to that frontend, which no other frontend may read); with ``ack``, wait (up to
        ``ACK_TIMEOUT_S``) until each applied its own. A frontend missing from ``updates``
        gets nothing and is not waited for."""
        with self._ack_cv:
            pipes = {i: p for i, p in self._pipes.items() if i in updates}
        if not pipes:
            return
        seq = 0
        if ack:
            self._seq += 1
            seq = self._seq
        for i, pipe in pipes.items():
            u = updates[i]
            data = encode(msgspec.structs.replace(u, seq=seq) if ack else u)
            with pipe.lock, contextlib.suppress(OSError):
                pipe.conn.send_bytes(data)
        if not ack:
            return
        deadline = time.monotonic() + ACK_TIMEOUT_S
        with self._ack_cv:
            # NOTE: a frontend that died meanwhile (detached) is not waited for.
            while not self._all_acked(seq, pipes):
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping():
                    log.warning("frontends did not acknowledge model table update %d", seq)
                    break
                self._ack_cv.wait(min(left, 0.5))
            self._acks.pop(seq, None)

    def _all_acked(self, seq: int, pipes: Mapping[int, _Pipe]) -> bool:
        """Whether every frontend of ``pipes`` still attached acknowledged ``seq`` (with
        ``_ack_cv`` held)."""
        acked = self._acks.get(seq, set())
        return all(i in acked or self._pipes.get(i) is not p for i, p in pipes.items())


def _end_reads(conn: Connection) -> None:
    """End the reads of ``conn``'s reader thread (EOF) without closing its descriptor; the
    frontend's side of the socket sees EOF too. A pipe that is not a socket (none is: a
    frontend's pipe is duplex) is left to end when the frontend's side closes."""
    try:
        sock = socket_over(conn.fileno())
    except OSError:
        return  # NOTE: the connection is closed already
    if sock is None:
        return
    with sock, contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
