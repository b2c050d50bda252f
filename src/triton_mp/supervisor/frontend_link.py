"""The supervisor's end of the frontends' control pipes.

Imported by ``supervisor.model_control``. Each frontend's duplex pipe (after its start
handshake, ``ipc.handshake``) carries ``ToSupervisor`` up (RepositoryModelLoad/Unload calls,
acknowledgements of model table updates) and ``FromSupervisor`` down (the calls' replies,
``ModelTableUpdate``). One reader thread per frontend hands calls to model control's change
thread and records acknowledgements; ``update`` sends one table update to every frontend and,
when asked, waits until each applied it (from then on no frontend routes by the old table).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import msgspec

from triton_mp.ipc import encode
from triton_mp.ipc.codec import Decoder
from triton_mp.ipc.control_messages import (
    ControlReply,
    ModelLoadCall,
    ModelTableUpdate,
    ModelUnloadCall,
    TableAck,
    ToSupervisor,
)
from triton_mp.ipc.log_messages import LogSettingsUpdate, apply_update
from triton_mp.ipc.messages import ErrorInfo

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

    def attach(self, conns: dict[int, Connection], on_call: OnCall) -> list[threading.Thread]:
        """Start one reader thread per frontend's pipe; returns the threads."""
        self._pipes = {i: _Pipe(c) for i, c in conns.items()}
        threads = []
        for i, pipe in self._pipes.items():
            t = threading.Thread(
                target=self._read, args=(i, pipe.conn, on_call), name=f"control-f{i}", daemon=True
            )
            t.start()
            threads.append(t)
        return threads

    def close(self) -> None:
        """Stop reading (server shutdown)."""
        self._closed = True

    def _read(self, frontend_id: int, conn: Connection, on_call: OnCall) -> None:
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
        pipe = self._pipes.get(frontend_id)
        if pipe is None:
            return
        with pipe.lock, contextlib.suppress(OSError):
            pipe.conn.send_bytes(encode(ControlReply(call_id=call_id, error=error)))

    def update(self, update: ModelTableUpdate, ack: bool) -> None:
        """Send one update to every frontend; with ``ack``, wait (up to ``ACK_TIMEOUT_S``)
        until each applied it. Nothing happens before the frontends are attached."""
        self.update_each({i: update for i in self._pipes}, ack)

    def update_each(self, updates: Mapping[int, ModelTableUpdate], ack: bool) -> None:
        """Send each frontend its own update (by frontend id: the rings from new workers
        to that frontend, which no other frontend may read); with ``ack``, wait (up to
        ``ACK_TIMEOUT_S``) until each applied its own. A frontend missing from ``updates``
        gets nothing and is not waited for."""
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
            while len(self._acks.get(seq, set()) & pipes.keys()) < len(pipes):
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping():
                    log.warning("frontends did not acknowledge model table update %d", seq)
                    break
                self._ack_cv.wait(min(left, 0.5))
            self._acks.pop(seq, None)
