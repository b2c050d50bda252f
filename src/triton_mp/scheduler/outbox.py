"""What the scheduler core says to others: outbound messages with typed destinations.

Imported by the scheduler core and its lifecycle, which append to one ``Outbox`` while they
handle a message; the process shell (``scheduler.main``) takes the items and sends each on
its ring, in order. Destinations: one worker (``ToInstance``), a request's or a query's
requester (``Reply``: a frontend or a python worker's BLS client,
``ipc.protocol.messages.ReplyTo``),
every frontend (``Broadcast``), the shell's own wiring (``Attach`` / ``Detach`` an
instance's rings), and ``Free`` (an ensemble step's output block no consumer needs any more).
Answers addressed to ``Requester.ENSEMBLE`` never leave the process: they go to ``loopback``
(``scheduler.ensembles``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate
from triton_mp.ipc.protocol.messages import (
    QUEUED_ORIGIN,
    BatchAssign,
    BatchDue,
    BlockRef,
    CancelRequest,
    ErrorInfo,
    Handoff,
    InferResponse,
    InstanceWiring,
    ModelAvailability,
    QueueReply,
    ReadyCheck,
    ReadyFanout,
    ReplyTo,
    Requester,
    RequestFailed,
    Shutdown,
    StatsReply,
)
from triton_mp.ipc.recordio.records import Request
from triton_mp.scheduler.stats import StatsBook


class ToInstance(NamedTuple):
    """A message for one worker, on the scheduler's ring to it."""

    instance_id: int
    msg: BatchAssign | BatchDue | CancelRequest | Shutdown | ReadyCheck | LogSettingsUpdate


class Reply(NamedTuple):
    """An answer for whoever sent a request or a query."""

    to: ReplyTo
    msg: RequestFailed | StatsReply | QueueReply | InferResponse | ReadyFanout


class Broadcast(NamedTuple):
    """A message for every frontend (never for BLS clients)."""

    msg: ModelAvailability


class Attach(NamedTuple):
    """Open the channels of a new instance (before anything is sent to it)."""

    wiring: InstanceWiring


class Detach(NamedTuple):
    """Close the channels of an instance that is gone for good."""

    instance_id: int


class Free(NamedTuple):
    """Mark a worker's output block FREE (``ipc.tensor_pool.free_block``): the last step
    of an ensemble that reads it has finished."""

    block: BlockRef


class Unmap(NamedTuple):
    """Unmap the attached arenas whose names start with ``prefix`` (a dead worker
    process's, or a removed instance's): nothing frees a block in them any more."""

    prefix: str


Outbound = ToInstance | Reply | Broadcast | Attach | Detach | Free | Unmap


class Outbox:
    """The outbound items of one step of the core, in the order they must be sent.

    Args:
        stats: the books a failed request is counted in (``fail``).
    """

    def __init__(self, stats: StatsBook) -> None:
        self._items: list[Outbound] = []
        self._stats = stats
        self.loopback: Callable[[ReplyTo, RequestFailed], None] | None = None
        """Takes the failures of composing requests (``Requester.ENSEMBLE``)."""

    def take(self) -> Sequence[Outbound]:
        """Everything added since the last ``take``, oldest first."""
        items = self._items
        if not items:
            return ()
        self._items = []
        return items

    def to_instance(
        self,
        instance_id: int,
        msg: BatchAssign | BatchDue | CancelRequest | Shutdown | ReadyCheck | LogSettingsUpdate,
    ) -> None:
        """Send ``msg`` to the worker ``instance_id``."""
        self._items.append(ToInstance(instance_id, msg))

    def reply(
        self,
        to: ReplyTo,
        msg: RequestFailed | StatsReply | QueueReply | InferResponse | ReadyFanout,
    ) -> None:
        """Answer at ``to`` (an ensemble's composing request: at ``loopback``, now)."""
        if to.kind is Requester.ENSEMBLE and self.loopback is not None:
            assert isinstance(msg, RequestFailed)
            self.loopback(to, msg)
            return
        self._items.append(Reply(to, msg))

    def free(self, block: BlockRef) -> None:
        """Free a worker's output block."""
        self._items.append(Free(block))

    def unmap(self, prefix: str) -> None:
        """Unmap a gone worker's arenas (``Unmap``)."""
        self._items.append(Unmap(prefix))

    def broadcast(self, msg: ModelAvailability) -> None:
        """Send ``msg`` to every frontend."""
        self._items.append(Broadcast(msg))

    def attach(self, wiring: InstanceWiring) -> None:
        """Open a new instance's channels."""
        self._items.append(Attach(wiring))

    def detach(self, instance_id: int) -> None:
        """Close a removed instance's channels."""
        self._items.append(Detach(instance_id))

    def end(
        self,
        req: Request,
        code: ErrorCode,
        message: str,
        handoffs: tuple[Handoff, ...] = (),
        origin: str = "scheduler",
    ) -> None:
        """End a request with an error (``RequestFailed`` from the scheduler) without
        counting it: its failure was counted already (an open decoupled request, an
        ensemble request, whose ``handoffs`` go with it). ``origin``: ``ErrorInfo.origin``."""
        error = ErrorInfo(code=code, message=message, origin=origin)
        failed = RequestFailed(request_id=req.request_id, error=error, handoffs=handoffs)
        self.reply(req.reply_to, failed)

    def fail(
        self,
        req: Request,
        code: ErrorCode,
        message: str,
        now_ns: int,
        reason: str | None = "OTHER",
    ) -> None:
        """Fail a request at ``now_ns`` and count it in its version's statistics.

        Args:
            reason: Triton's failure reason (``nv_inference_request_failure``): REJECTED,
                CANCELED, BACKEND or OTHER; None: counted nowhere (a refusal Triton's
                enqueue call returns: a full queue, a sequence's missing START). A counted
                failure goes as Triton's response error (``QUEUED_ORIGIN``).
        """
        if reason is None:
            self.end(req, code, message)
            return
        self._stats.record_failure(req.model, req.version, req.arrival_ns, now_ns, reason)
        self.end(req, code, message, origin=QUEUED_ORIGIN)
