"""Our own ``triton_mp.admin.Admin`` gRPC service: the wire behind ``triton-mp stat``.

Owns both ends of the admin service, so that ``grpc`` and ``_proto`` stay inside
``triton_mp.frontend``:

- ``AdminServicer`` runs in every frontend process, on the inference port: it checks the
  model name, asks the scheduler with a ``QueueQuery`` and turns its ``QueueReply`` into a
  ``QueueStatusResponse``;
- ``fetch_queue_status`` is the client call the ``triton-mp stat`` process makes; it turns
  the response back into the same ``ModelQueueStatus`` structs, so rendering code
  (``triton_mp.cli.stat``) never sees a proto.

The proto messages mirror the msgspec structs field for field (same names, same units), and
the conversions below rely on that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import msgspec

from triton_mp._proto import admin_pb2, admin_pb2_grpc
from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc.codec import encode
from triton_mp.ipc.messages import QueueQuery, QueueReply
from triton_mp.ipc.reports import BatchRecord, InstanceStatus, LevelStatus, ModelQueueStatus

if TYPE_CHECKING:
    from triton_mp.frontend.models import ModelTable
    from triton_mp.frontend.pending import PendingTable

SCHEDULER_REPLY_TIMEOUT_S = 5.0
"""How long a frontend waits for the scheduler's ``QueueReply`` before answering
DEADLINE_EXCEEDED."""

CLIENT_TIMEOUT_S = 10.0
"""Default gRPC deadline of ``fetch_queue_status`` (longer than the frontend's own wait, so
a slow scheduler is reported as such rather than as a client timeout)."""


class AdminError(TritonMPError):
    """A ``QueueStatus`` call failed; ``code`` says how, ``message`` is one line for a user.

    ``UNAVAILABLE``: no server answered at the address. ``NOT_FOUND``: unknown model.
    ``DEADLINE_EXCEEDED``: the server (or its scheduler) did not answer in time.
    ``UNSUPPORTED``: the server does not serve triton-mp's admin service.
    """


def _fields(struct: type[msgspec.Struct]) -> tuple[str, ...]:
    return tuple(f.name for f in msgspec.structs.fields(struct))


def _flat_to_proto(value: msgspec.Struct, message: Any) -> Any:
    """A proto message with every field of the flat struct ``value`` (same names)."""
    return message(**msgspec.structs.asdict(value))


def _flat_from_proto(message: Any, struct: type[msgspec.Struct]) -> Any:
    return struct(**{name: getattr(message, name) for name in _fields(struct)})


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


def status_from_proto(response: admin_pb2.QueueStatusResponse) -> tuple[ModelQueueStatus, ...]:
    """The structs a ``QueueStatusResponse`` carries (the inverse of ``status_to_proto``)."""
    return tuple(
        ModelQueueStatus(
            model=m.model,
            version=m.version,
            scheduler=m.scheduler,
            max_batch_size=m.max_batch_size,
            preferred_batch_sizes=tuple(m.preferred_batch_sizes),
            max_queue_delay_us=m.max_queue_delay_us,
            levels=tuple(_flat_from_proto(x, LevelStatus) for x in m.levels),
            instances=tuple(_flat_from_proto(x, InstanceStatus) for x in m.instances),
            batch_sizes={int(k): int(v) for k, v in sorted(m.batch_sizes.items())},
            close_reasons={str(k): int(v) for k, v in sorted(m.close_reasons.items())},
            recent_batches=tuple(_flat_from_proto(x, BatchRecord) for x in m.recent_batches),
        )
        for m in response.models
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


_ERROR_CODES = {
    grpc.StatusCode.NOT_FOUND: ErrorCode.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT: ErrorCode.INVALID_ARG,
    grpc.StatusCode.UNAVAILABLE: ErrorCode.UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED: ErrorCode.UNSUPPORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.INTERNAL: ErrorCode.INTERNAL,
    grpc.StatusCode.CANCELLED: ErrorCode.CANCELLED,
}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def fetch_queue_status(
    url: str,
    model: str = "",
    timeout_s: float = CLIENT_TIMEOUT_S,
    metadata: tuple[tuple[str, str], ...] = (),
) -> tuple[ModelQueueStatus, ...]:
    """Ask the server at ``url`` (``host:port``) for its queues (blocking, one RPC).

    Args:
        url: the gRPC address of a triton-mp server, e.g. ``localhost:8001``.
        model: one model's name, or empty for every model.
        timeout_s: the call's deadline in seconds.
        metadata: gRPC metadata sent with the call, e.g. the header of a restricted
            ``statistics`` protocol (``--grpc-restricted-protocol``).

    Raises:
        AdminError: no server at ``url`` (UNAVAILABLE), unknown model (NOT_FOUND), no answer
            in time (DEADLINE_EXCEEDED), a server without the admin service (UNSUPPORTED),
            or whatever else the server answered; the message is one line.
    """
    with grpc.insecure_channel(url) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        try:
            response = stub.QueueStatus(
                admin_pb2.QueueStatusRequest(model=model),
                timeout=timeout_s,
                metadata=metadata or None,
            )
        except grpc.RpcError as e:
            status = e.code()
            details = _one_line(e.details() or str(status))
            code = _ERROR_CODES.get(status, ErrorCode.UNKNOWN)
            if status == grpc.StatusCode.UNAVAILABLE:
                message = f"cannot reach a server at {url}: {details}"
            elif status == grpc.StatusCode.UNIMPLEMENTED:
                message = f"the server at {url} does not serve triton-mp's admin service"
            elif status == grpc.StatusCode.DEADLINE_EXCEEDED:
                message = f"no answer from {url}: {details}"
            else:
                message = details
            raise AdminError(message, code) from None
    return status_from_proto(response)
