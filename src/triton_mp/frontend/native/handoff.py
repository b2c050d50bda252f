"""The Python side of the in-process handoff (``handoff.cc``, its twin): unary ModelInfer
calls that the native server took on the public port, served by the Python ModelInfer
handler without grpc.aio.

Imported by ``frontend.native.public_port``. The native completion-queue thread queues each
call's request bytes and metadata and makes an eventfd readable; this event loop takes
everything queued per wake-up (``_native.take``), runs ``InferenceServicer.ModelInfer`` on
each in a task with ``_Context`` in place of grpc.aio's context, and replies with the
serialized ModelInferResponse or the status it aborted with (``_native.reply``). A call the
client abandons (cancel, deadline, server stop) arrives as a cancellation and cancels the
task, as grpc.aio cancels a handler. So the handler, its checks, its words and its tracing
are the ones ``--grpc-frontend python`` runs; only grpc.aio's per-call machinery is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc

from triton_mp.frontend.grpc.wire import tolerant


class Native(Protocol):
    """The extension's handoff functions (``module.cc``)."""

    def handoff_fd(self) -> int: ...
    def take(self) -> list[tuple[int, bytes | None, Any]]: ...
    def reply(self, call_id: int, code: int, details: str, data: bytes) -> bool: ...


class Servicer(Protocol):
    """What the handoff needs of ``frontend.grpc.servicer.InferenceServicer``."""

    def parse_infer(self, data: bytes) -> Any: ...
    async def ModelInfer(self, request: Any, context: Any) -> bytes: ...  # noqa: N802


class Aborted(Exception):
    """``_Context.abort``: the handler ended the call with a status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class _Context:
    """The part of ``grpc.aio.ServicerContext`` ModelInfer uses: its metadata, abort, and a
    callback once the response is handed to the native server."""

    __slots__ = ("_metadata", "callbacks")

    def __init__(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self._metadata = metadata
        self.callbacks: list[Callable[[Any], None]] = []

    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: object) -> None:
        raise Aborted(code, details)

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self.callbacks.append(callback)


def _code(code: grpc.StatusCode) -> int:
    return int(code.value[0])


class Handoff:
    """Serves the native server's handed-off ModelInfer calls on this event loop.

    Args:
        native: the extension module (its handoff functions).
        servicer: the frontend's InferenceServicer.
    """

    def __init__(self, native: Native, servicer: Servicer) -> None:
        self._native = native
        self._servicer = servicer
        self._parse = tolerant(servicer.parse_infer)
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the native server's eventfd on ``loop`` (after the native server started)."""
        self._fd = self._native.handoff_fd()
        self._loop = loop
        loop.add_reader(self._fd, self.on_wakeup)

    def stop(self) -> None:
        """Stop watching (after the native server stopped: nothing more is queued)."""
        if self._loop is not None and self._fd >= 0:
            self._loop.remove_reader(self._fd)
        self._fd = -1

    def on_wakeup(self) -> None:
        """Take every queued call and cancellation; start or cancel their tasks."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)
        assert self._loop is not None
        for call_id, data, metadata in self._native.take():
            if data is None:
                task = self._tasks.pop(call_id, None)
                if task is not None:
                    task.cancel()
                continue
            self._tasks[call_id] = self._loop.create_task(self.serve(call_id, data, metadata))

    async def serve(
        self, call_id: int, data: bytes, metadata: Sequence[tuple[str, str | bytes]]
    ) -> None:
        """One call: the ModelInfer handler on ``data``, its answer replied."""
        context = _Context(metadata)
        try:
            response = await self._servicer.ModelInfer(self._parse(data), context)
            self._native.reply(call_id, 0, "", response)
        except Aborted as e:
            self._native.reply(call_id, _code(e.code), e.details, b"")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - grpc.aio's answer to a handler's exception
            details = f"Unexpected {type(e)}: {e}"
            self._native.reply(call_id, _code(grpc.StatusCode.UNKNOWN), details, b"")
        finally:
            self._tasks.pop(call_id, None)
        for callback in context.callbacks:
            callback(context)
