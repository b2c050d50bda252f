"""What reaches a frontend besides client requests: the inbox, and the supervisor's updates.

Imported by ``frontend.main``. The inbox's rings carry answers (``InferResponse``,
``AnswerBatch``, ``RequestFailed``, ``StatsReply``, ``QueueReply``) for the pending table, plus the
other frontends' client shared-memory changes and answers (``frontend.shm.peers``) and the
scheduler's news: whether a model version has a live instance. The supervisor's
``ModelTableUpdate`` (over the control pipe) adds and removes rings, replaces model entries
and drops the arenas of stopped workers. Both run on the event loop thread, between two requests.

Where the native answer thread runs (``frontend.native.answer_thread``), it reads the rings
instead of this loop: it serves the known calls' plain answers in C++, and every other record
comes here through its queue, in ring order, decoded by the same decoder
(``InboxHandler.read_through``); the loop then watches that queue instead of the inbox.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from triton_mp.frontend.dispatch.direct import DirectRoutes
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.dispatch.polling_loop import PollingSelector, Watched, WatchedWaiter
from triton_mp.frontend.model_table import ModelTable
from triton_mp.frontend.readiness import ReadinessChecks
from triton_mp.ipc import Inbox, SegmentCache
from triton_mp.ipc.protocol.control_messages import ModelTableUpdate
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate, apply_update
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    InferResponse,
    ModelAvailability,
    QueueReply,
    RequestFailed,
    ShmApplied,
    ShmRegistered,
    ShmUnregistered,
    StatsReply,
    ToFrontend,
    TraceSettingUpdate,
)
from triton_mp.ipc.protocol.ready_messages import InstanceReadiness, ReadyFanout

log = logging.getLogger(__name__)

_ANSWERS = (InferResponse, AnswerBatch, RequestFailed, StatsReply, QueueReply)
"""Inbox records that answer a request or a query (``PendingTable.deliver``)."""


class AnswerSource(Protocol):
    """The native answer thread's queue (``frontend.native.answer_thread.AnswerQueue``): the
    records it did not serve, decoded, in ring order."""

    @property
    def waiter(self) -> WatchedWaiter: ...
    def has_pending(self) -> bool: ...
    def drain(self) -> list[Any]: ...
    def add_ring(self, name: str) -> None: ...
    def remove_ring(self, name: str) -> None: ...
    def wake(self) -> None: ...


class _Loop(Protocol):
    """The event loop's reader registration (``asyncio.AbstractEventLoop``)."""

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None: ...
    def remove_reader(self, fd: int) -> bool: ...


class InboxHandler:
    """Applies what arrives for one frontend.

    Args:
        inbox: the frontend's inbox (its rings and its wakeup FIFO).
        pending: where answers go.
        on_shm: applies the other frontends' client shared-memory records
            (``frontend.shm.peers.ShmPeers.on_record``).
        models: the model table.
        cache: attached arenas (a stopped worker's are dropped).
        direct: the routes to idle instances (``frontend.dispatch.direct``), which the supervisor's
            updates change.
    """

    def __init__(
        self,
        inbox: Inbox[ToFrontend],
        pending: PendingTable,
        on_shm: Callable[[ShmRegistered | ShmUnregistered | ShmApplied], None],
        models: ModelTable,
        cache: SegmentCache,
        direct: DirectRoutes | None = None,
    ) -> None:
        self._inbox = inbox
        self._direct = direct
        self._pending = pending
        self._on_shm = on_shm
        self._models = models
        self._cache = cache
        self.on_trace_setting: Callable[[TraceSettingUpdate], None] = lambda _msg: None
        """Applies another frontend's trace settings update (``Tracer.apply_peer``)."""
        self.readiness: ReadinessChecks | None = None
        """Takes the answers to python models' readiness checks (``frontend.readiness``)."""
        self.resend_shm: Callable[[int], None] = lambda _frontend_id: None
        """Sends every registered client region to one other frontend (``frontend.main``)."""
        self.frontend_restarts: dict[int, int] = {}
        """The frontends' restart counts, updated in place (``StatsApi.frontend_restarts``)."""
        self.on_table_change: Callable[[], None] | None = None
        """Called before a model table update applies (models, versions, direct routes):
        the native known path un-learns (``frontend.native.known_teach``)."""
        self._read: Callable[[memoryview], Any] | None = None
        self._settle: Callable[[], None] = lambda: None
        self._queue: AnswerSource | None = None
        """The native answer thread's queue, read instead of the rings (``read_through``)."""
        self._watching: tuple[_Loop, PollingSelector, Callable[[], int]] | None = None

    @property
    def decode_buffer(self) -> Callable[[Any], Any]:
        """The inbox's decoder of one record (``Inbox.decode_buffer``)."""
        return self._inbox.decode_buffer

    def fifo(self) -> tuple[str, tuple[str, ...]] | None:
        """The inbox's wake-up name and its rings' names, for the native answer thread;
        None: not a FIFO wake-up (a loop's)."""
        wakeup = self._inbox.wakeup
        if wakeup.kind != "fifo":
            return None
        return wakeup.name, self._inbox.ring_names()

    def watch(self, loop: _Loop, selector: PollingSelector, outstanding: Callable[[], int]) -> None:
        """Drain on ``loop`` whenever the inbox (or, while the answer thread reads it, its
        queue) has records, and let ``selector`` poll it (``PollingSelector.watch``;
        ``outstanding``: the answers awaited while the loop reads the rings itself)."""
        self._watching = (loop, selector, outstanding)
        source = self._source()
        loop.add_reader(source.waiter.fileno(), self.on_wakeup)
        selector.watch(source, outstanding if self._queue is None else self._pending.__len__)

    def unwatch(self) -> None:
        """Stop ``watch``."""
        if self._watching is not None:
            loop, selector, _ = self._watching
            self._watching = None
            selector.watch(None)
            loop.remove_reader(self._source().waiter.fileno())

    def _source(self) -> Watched:
        return self._inbox if self._queue is None else self._queue

    def read_through(self, queue: AnswerSource | None, settle: Callable[[], None]) -> None:
        """Read the native answer thread's ``queue`` instead of the rings (the thread
        reads them, started), or the rings again (None: the thread stopped; what it queued
        is applied first). ``settle`` runs after every drain of the queue."""
        watching = self._watching
        self.unwatch()
        if queue is None and self._queue is not None:
            self.on_wakeup()  # NOTE: before the rings' next records, in ring order
        self._queue = queue
        self._settle = settle
        if watching is not None:
            self.watch(*watching)

    def serve_answers_with(
        self,
        serve: Callable[[Callable[[Any], Any], memoryview], Any] | None,
        settle: Callable[[], None] = lambda: None,
    ) -> None:
        """Let ``serve(decode, record)`` read every record of a drain first (the native
        answer side, ``frontend.native.known_answers``): it serves the answers of the calls
        it owns and gives None for those, or returns ``decode(record)``; ``settle`` runs
        after a drain in which it served some. None: the decoder reads every record."""
        self._read = None if serve is None else partial(serve, self._inbox.decode_buffer)
        self._settle = settle

    def on_wakeup(self) -> None:
        """The inbox has records (the loop's ``PollingSelector`` saw them, and read the FIFO
        when it was woken): drain every ring (loop thread)."""
        answers: list[InferResponse | AnswerBatch | RequestFailed | StatsReply | QueueReply] = []
        queue = self._queue
        served = queue is not None
        for msg in self._inbox.drain(self._read) if queue is None else queue.drain():
            if isinstance(msg, _ANSWERS):  # NOTE: nearly every record: tested first
                answers.append(msg)
            elif msg is None:  # NOTE: served natively (serve_answers_with)
                served = True
            elif isinstance(msg, ShmRegistered | ShmUnregistered | ShmApplied):
                self._on_shm(msg)
            elif isinstance(msg, ModelAvailability):
                self._models.set_available(msg.model, msg.version, msg.ready)
            elif isinstance(msg, TraceSettingUpdate):
                self.on_trace_setting(msg)
            elif isinstance(msg, LogSettingsUpdate):
                apply_update(msg)
            elif isinstance(msg, ReadyFanout | InstanceReadiness):
                if self.readiness is not None:
                    self.readiness.deliver(msg)
            else:
                log.warning("unexpected inbox record %s", type(msg).__name__)
        if served:
            self._settle()
        if answers:
            self._pending.deliver(answers)

    def on_table_update(self, update: ModelTableUpdate) -> None:
        """Apply a supervisor's model change between two requests (loop thread)."""
        if self.on_table_change is not None:
            self.on_table_change()
        queue = self._queue
        for ring in update.add_rings:
            self._inbox.add_ring(ring)
            if queue is not None:
                queue.add_ring(ring)
        if self._direct is not None and (update.add_routes or update.remove_routes):
            self._direct.update(update.add_routes, update.remove_routes)
        self._models.update(update.models)
        for ring in update.remove_rings:
            if queue is not None:
                # NOTE: the thread reads what the ring holds; its queue is applied now,
                # before the worker's arenas are dropped below.
                queue.remove_ring(ring)
                self.on_wakeup()
            # NOTE: answers a stopped worker left are delivered, not dropped.
            left = self._inbox.remove_ring(ring)
            if left:
                self._pending.deliver(
                    [m for m in left if isinstance(m, InferResponse | AnswerBatch | RequestFailed)]
                )
        for prefix in update.drop_segments:
            self._cache.drop(prefix)
        if update.resend_shm_to >= 0:
            self.resend_shm(update.resend_shm_to)
        if update.frontend_restarts is not None:
            self.frontend_restarts.clear()
            self.frontend_restarts.update(update.frontend_restarts)
        for e in update.models:
            state = "unloaded" if e.unloaded else e.transition or f"versions {e.ready_versions}"
            log.info("model table: '%s' %s", e.name, state, extra={"model": e.name})
        if update.add_rings:
            # NOTE: answers may already wait in a new ring; nothing else would wake us.
            if queue is not None:
                queue.wake()
            else:
                self._inbox.waiter.wake()
