"""The client end of our ``triton_mp.admin.Admin`` gRPC service: what ``triton-mp stat`` calls.

Imported by ``triton_mp.cli.stat`` and ``triton_mp.cli.main`` (lazily, only when ``stat``
runs); runs in the user's shell, never in a server process, and is the only CLI module that
imports ``grpc``. ``fetch_queue_snapshot`` makes one ``QueueStatus`` call and turns the
``QueueStatusResponse`` back into the ``ModelQueueStatus`` structs the scheduler sent and the
supervisor's frontend restart counts, so rendering code (``triton_mp.cli.stat``) never sees a
proto; ``fetch_queue_status`` keeps only the structs. The server end is
``triton_mp.frontend.grpc.admin_service``.

The proto messages mirror the msgspec structs field for field (same names, same units), and
the conversion below relies on that.
"""

from __future__ import annotations

from typing import Any

import grpc
import msgspec

from triton_mp._proto import admin_pb2, admin_pb2_grpc
from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc.protocol.reports import (
    BatchRecord,
    InstanceStatus,
    LevelStatus,
    ModelQueueStatus,
    StepStatus,
)

CLIENT_TIMEOUT_S = 10.0
"""Default gRPC deadline of ``fetch_queue_status`` (longer than the frontend's own wait for
its scheduler, so a slow scheduler is reported as such rather than as a client timeout)."""


class AdminError(TritonMPError):
    """A ``QueueStatus`` call failed; ``code`` says how, ``message`` is one line for a user.

    ``UNAVAILABLE``: no server answered at the address. ``NOT_FOUND``: unknown model.
    ``DEADLINE_EXCEEDED``: the server (or its scheduler) did not answer in time.
    ``UNSUPPORTED``: the server does not serve triton-mp's admin service.
    """


def _flat_from_proto(message: Any, struct: type[msgspec.Struct]) -> Any:
    """The flat struct ``struct`` with every field read from ``message`` (same names)."""
    return struct(**{f.name: getattr(message, f.name) for f in msgspec.structs.fields(struct)})


def status_from_proto(response: admin_pb2.QueueStatusResponse) -> tuple[ModelQueueStatus, ...]:
    """The structs a ``QueueStatusResponse`` carries (the inverse of the server's
    ``admin_service.status_to_proto``)."""
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
            steps=tuple(_flat_from_proto(x, StepStatus) for x in m.steps),
        )
        for m in response.models
    )


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


def _admin_error(url: str, e: grpc.RpcError) -> AdminError:
    """The one-line ``AdminError`` of a failed call to ``url``."""
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
    return AdminError(message, code)


def fetch_queue_snapshot(
    url: str,
    model: str = "",
    timeout_s: float = CLIENT_TIMEOUT_S,
    metadata: tuple[tuple[str, str], ...] = (),
) -> tuple[tuple[ModelQueueStatus, ...], dict[int, int]]:
    """Ask the server at ``url`` (``host:port``) for its queues (blocking, one RPC).

    Args:
        url: the gRPC address of a triton-mp server, e.g. ``localhost:8001``.
        model: one model's name, or empty for every model.
        timeout_s: the call's deadline in seconds.
        metadata: gRPC metadata sent with the call, e.g. the header of a restricted
            ``statistics`` protocol (``--grpc-restricted-protocol``).

    Returns:
        ``(models, frontend_restarts)``: the scheduler's structs, and per frontend id the
        supervisor's restarts of that frontend so far (``QueueStatusResponse.frontend_restarts``;
        empty from a server that predates the field).

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
            raise _admin_error(url, e) from None
    restarts = {int(k): int(v) for k, v in sorted(response.frontend_restarts.items())}
    return status_from_proto(response), restarts


def fetch_queue_status(
    url: str,
    model: str = "",
    timeout_s: float = CLIENT_TIMEOUT_S,
    metadata: tuple[tuple[str, str], ...] = (),
) -> tuple[ModelQueueStatus, ...]:
    """``fetch_queue_snapshot``'s structs alone (same arguments, same errors)."""
    return fetch_queue_snapshot(url, model, timeout_s, metadata)[0]
