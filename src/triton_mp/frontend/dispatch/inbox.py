"""What reaches a frontend besides client requests: the inbox, and the supervisor's updates.

Imported by ``frontend.main``. The inbox's rings carry answers (``InferResponse``,
``AnswerBatch``, ``RequestFailed``, ``StatsReply``, ``QueueReply``) for the pending table, plus the
scheduler's news: another frontend's client shared-memory registrations and whether a model
version has a live instance. The supervisor's ``ModelTableUpdate`` (over the control pipe)
adds and removes rings, replaces model entries and drops the arenas of stopped workers.
Both run on the event loop thread, between two requests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from triton_mp.frontend.dispatch.direct import DirectRoutes
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.model_table import ModelTable
from triton_mp.frontend.readiness import ReadinessChecks
from triton_mp.frontend.shm.system import Region, SystemShmRegistry
from triton_mp.ipc import Inbox, SegmentCache
from triton_mp.ipc.protocol.control_messages import ModelTableUpdate
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate, apply_update
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    InferResponse,
    ModelAvailability,
    QueueReply,
    RequestFailed,
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


class InboxHandler:
    """Applies what arrives for one frontend.

    Args:
        inbox: the frontend's inbox (its rings and its wakeup FIFO).
        pending: where answers go.
        shm: the registered client shared-memory regions.
        models: the model table.
        cache: attached arenas (a stopped worker's are dropped).
        direct: the routes to idle instances (``frontend.dispatch.direct``), which the supervisor's
            updates change.
    """

    def __init__(
        self,
        inbox: Inbox[ToFrontend],
        pending: PendingTable,
        shm: SystemShmRegistry,
        models: ModelTable,
        cache: SegmentCache,
        direct: DirectRoutes | None = None,
    ) -> None:
        self._inbox = inbox
        self._direct = direct
        self._pending = pending
        self._shm = shm
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
        served = False
        for msg in self._inbox.drain(self._read):
            if isinstance(msg, _ANSWERS):  # NOTE: nearly every record: tested first
                answers.append(msg)
            elif msg is None:  # NOTE: served natively (serve_answers_with)
                served = True
            elif isinstance(msg, ShmRegistered):
                for r in msg.regions:
                    self._shm.add(Region(r.name, r.key, r.offset, r.byte_size, r.region_id))
            elif isinstance(msg, ShmUnregistered):
                self._shm.drop(list(msg.names))
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
        for ring in update.add_rings:
            self._inbox.add_ring(ring)
        if self._direct is not None and (update.add_routes or update.remove_routes):
            self._direct.update(update.add_routes, update.remove_routes)
        self._models.update(update.models)
        for ring in update.remove_rings:
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
            self._inbox.waiter.wake()
