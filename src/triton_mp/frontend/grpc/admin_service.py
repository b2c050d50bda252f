"""Our own ``triton_mp.admin.Admin`` gRPC service: the server end of ``triton-mp stat``.

Imported by the frontend process (``frontend.main`` registers it on the inference port).
``AdminServicer`` asks ``StatsApi.queue_status`` (which checks the model name and sends the
scheduler a ``QueueQuery``) and turns the answer into a ``QueueStatusResponse``. The client
end, which turns the response back into the same structs, is ``triton_mp.cli.admin_client``.

The proto messages mirror the msgspec structs field for field (same names, same units), and
the conversion below relies on that.
"""

from __future__ import annotations

from typing import Any

import msgspec

from triton_mp._proto import admin_pb2, admin_pb2_grpc
from triton_mp.common.errors import TritonMPError
from triton_mp.frontend.admin.stats import StatsApi
from triton_mp.frontend.grpc.servicer import abort
from triton_mp.ipc.protocol.reports import ModelQueueStatus


def _flat_to_proto(value: msgspec.Struct, message: Any) -> Any:
    """A proto message with every field of the flat struct ``value`` (same names)."""
    return message(**msgspec.structs.asdict(value))


def status_to_proto(
    models: tuple[ModelQueueStatus, ...], frontend_restarts: dict[int, int] | None = None
) -> admin_pb2.QueueStatusResponse:
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
                steps=[_flat_to_proto(x, admin_pb2.StepStatus) for x in m.steps],
            )
            for m in models
        ],
        frontend_restarts=dict(frontend_restarts or {}),
    )


class AdminServicer(admin_pb2_grpc.AdminServicer):  # type: ignore[misc]
    """``triton_mp.admin.Admin``: the scheduler's queues, for ``triton-mp stat``.

    Args:
        stats: the frontend's queries to the scheduler (``StatsApi.queue_status``).
    """

    def __init__(self, stats: StatsApi) -> None:
        self._stats = stats

    async def QueueStatus(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Every model's queue state (or one model's); NOT_FOUND for an unknown model,
        DEADLINE_EXCEEDED when the scheduler does not answer in time."""
        try:
            models = await self._stats.queue_status(request.model)
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        return status_to_proto(models, self._stats.frontend_restarts)
