"""Our own ``triton_mp.admin.Admin`` gRPC service: the server end of ``triton-mp stat``.

Imported by the frontend process (``frontend.main`` registers it on the inference port).
``AdminServicer`` checks the model name, asks the scheduler with a ``QueueQuery`` and turns
its ``QueueReply`` into a ``QueueStatusResponse``. The client end, which turns the response
back into the same structs, is ``triton_mp.cli.admin_client``.

The proto messages mirror the msgspec structs field for field (same names, same units), and
the conversion below relies on that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import msgspec

from triton_mp._proto import admin_pb2, admin_pb2_grpc
from triton_mp.common.errors import TritonMPError
from triton_mp.ipc.codec import encode
from triton_mp.ipc.messages import QueueQuery, QueueReply
from triton_mp.ipc.reports import ModelQueueStatus

if TYPE_CHECKING:
    from triton_mp.frontend.models import ModelTable
    from triton_mp.frontend.pending import PendingTable

SCHEDULER_REPLY_TIMEOUT_S = 5.0
"""How long a frontend waits for the scheduler's ``QueueReply`` before answering
DEADLINE_EXCEEDED."""


def _flat_to_proto(value: msgspec.Struct, message: Any) -> Any:
    """A proto message with every field of the flat struct ``value`` (same names)."""
    return message(**msgspec.structs.asdict(value))


def status_to_proto(models: tuple[ModelQueueStatus, ...]) -> admin_pb2.QueueStatusResponse:
    """The scheduler's queue state as a ``triton_mp.admin.QueueStatusResponse``.

    Raises:
        ValueError: a struct has a field the proto lacks (the two drifted apart).
    """
    return admin_pb2.QueueStatusResponse(
        models=[
            admin_pb2.ModelQueueStatus(
                model=m.model,
                version=m.version,
                scheduler=m.scheduler,
                max_batch_size=m.max_batch_size,
                preferred_batch_sizes=list(m.preferred_batch_sizes),
                max_queue_delay_us=m.max_queue_delay_us,
                levels=[_flat_to_proto(x, admin_pb2.LevelStatus) for x in m.levels],
                instances=[_flat_to_proto(x, admin_pb2.InstanceStatus) for x in m.instances],
                batch_sizes=dict(m.batch_sizes),
                close_reasons=dict(m.close_reasons),
                recent_batches=[_flat_to_proto(x, admin_pb2.BatchRecord) for x in m.recent_batches],
            )
            for m in models
        ]
    )


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, msg: str) -> NoReturn:
    await context.abort(code, msg)
    raise AssertionError("unreachable")  # context.abort raises


class AdminServicer(admin_pb2_grpc.AdminServicer):  # type: ignore[misc]
    """``triton_mp.admin.Admin``: the scheduler's queues, for ``triton-mp stat``.

    Args:
        frontend_id: this frontend's index (the scheduler answers on its inbox).
        models: the model table (unknown names are refused here, not by the scheduler).
        pending: the table the scheduler's ``QueueReply`` is delivered to.
        send_scheduler: pushes encoded bytes to the scheduler.
        reply_timeout_s: how long to wait for the scheduler before DEADLINE_EXCEEDED.
    """

    def __init__(
        self,
        *,
        frontend_id: int,
        models: ModelTable,
        pending: PendingTable,
        send_scheduler: Callable[[bytes], None],
        reply_timeout_s: float = SCHEDULER_REPLY_TIMEOUT_S,
    ) -> None:
        self._fid = frontend_id
        self._models = models
        self._pending = pending
        self._send = send_scheduler
        self._timeout_s = reply_timeout_s

    async def QueueStatus(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Every model's queue state (or one model's); NOT_FOUND for an unknown model,
        DEADLINE_EXCEEDED when the scheduler does not answer within ``reply_timeout_s``."""
        if request.model:
            try:
                self._models.get(request.model)
            except TritonMPError as e:
                await _abort(context, grpc.StatusCode.NOT_FOUND, e.message)
        qid, fut = self._pending.new_query()
        self._send(encode(QueueQuery(query_id=qid, frontend_id=self._fid, model=request.model)))
        try:
            reply = await asyncio.wait_for(fut, self._timeout_s)
        except asyncio.CancelledError:
            self._pending.forget_query(qid)
            raise
        except TimeoutError:
            self._pending.forget_query(qid)
            await _abort(
                context,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the scheduler did not answer the queue query within {self._timeout_s:g} s",
            )
        assert isinstance(reply, QueueReply)
        return status_to_proto(reply.models)
