"""The frontend's control pipe to the supervisor: repository load/unload calls out, model
table updates in.

Imported by the frontend only. The pipe is the frontend's ready pipe (a duplex
``multiprocessing`` connection), kept open after start. Calls (``ModelLoadCall``,
``ModelUnloadCall``) are answered by a ``ControlReply`` with the same ``call_id``; the
supervisor serialises them, as Triton serialises model changes. Updates
(``ModelTableUpdate``) are applied on the event loop between two requests, then
acknowledged, so the supervisor knows no request of this frontend will use the old table
after the ack.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from multiprocessing.connection import Connection

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc import encode
from triton_mp.ipc.protocol.control_messages import (
    ControlReply,
    FromSupervisor,
    ModelLoadCall,
    ModelTableUpdate,
    ModelUnloadCall,
    TableAck,
)
from triton_mp.ipc.recordio.codec import Decoder

log = logging.getLogger(__name__)


class SupervisorLink:
    """Calls to the supervisor and the updates it pushes, over one pipe.

    Args:
        conn: the frontend's end of its duplex pipe to the supervisor.
        on_update: applies a ``ModelTableUpdate`` (loop thread; must not block).
    """

    def __init__(self, conn: Connection, on_update: Callable[[ModelTableUpdate], None]) -> None:
        self._conn = conn
        self._on_update = on_update
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[ControlReply]] = {}
        self._decoder: Decoder[ControlReply | ModelTableUpdate] = Decoder(FromSupervisor)
        self._send_lock = asyncio.Lock()
        self._closed = False
        self._tasks: set[asyncio.Future[None]] = set()

    async def _send(self, data: bytes) -> None:
        """Write one message; every write holds ``_send_lock`` so two never interleave.

        NOTE: a call may carry model files (megabytes): it is written in a thread so the
        loop keeps serving meanwhile.
        """
        async with self._send_lock:
            if len(data) < 65536:
                self._conn.send_bytes(data)
            else:
                await asyncio.get_running_loop().run_in_executor(None, self._conn.send_bytes, data)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the pipe from the event loop."""
        loop.add_reader(self._conn.fileno(), self._on_readable)

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop watching; pending calls fail with UNAVAILABLE."""
        if not self._closed:
            self._closed = True
            loop.remove_reader(self._conn.fileno())
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(TritonMPError("server is stopping", ErrorCode.UNAVAILABLE))
        self._calls.clear()

    def _on_readable(self) -> None:
        try:
            while self._conn.poll():
                msg = self._decoder.decode(self._conn.recv_bytes())
                if isinstance(msg, ControlReply):
                    fut = self._calls.pop(msg.call_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                else:
                    self._on_update(msg)
                    if msg.seq:
                        task = asyncio.ensure_future(self._send(encode(TableAck(seq=msg.seq))))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
        except (EOFError, OSError):
            log.error("the supervisor's control pipe closed")
            self.stop(asyncio.get_running_loop())

    def notify(self, data: bytes) -> None:
        """Send one encoded message that has no reply (loop thread; written in order with
        the calls)."""
        if self._closed:
            return
        task = asyncio.ensure_future(self._send(data))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def call(self, make: Callable[[int], ModelLoadCall | ModelUnloadCall]) -> None:
        """Send a call built by ``make(call_id)`` and wait for its reply.

        Raises:
            TritonMPError: the supervisor's error for the call (its code and message), or
                UNAVAILABLE when the pipe is closed.
        """
        if self._closed:
            raise TritonMPError("server is stopping", ErrorCode.UNAVAILABLE)
        call_id = next(self._ids)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ControlReply] = loop.create_future()
        self._calls[call_id] = fut
        data = encode(make(call_id))
        try:
            await self._send(data)
        except OSError:
            self._calls.pop(call_id, None)
            raise TritonMPError("server is stopping", ErrorCode.UNAVAILABLE) from None
        reply = await fut
        if reply.error is not None:
            raise TritonMPError(reply.error.message, reply.error.code)
