"""What the scheduler core answers about a request as it arrives: when its time in the queue
starts, the prefix of its errors, the refusal of a version it does not serve.

Imported by ``scheduler.core``; pure (no ipc, no clock).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from triton_mp.common.errors import ErrorCode


class Labelled(Protocol):
    """A request as far as its error prefix goes (``InferRequest``, ``RequestRecord``)."""

    @property
    def client_id(self) -> str:
        """The request's ``id`` ("" = none)."""
        ...


def request_label(req: Labelled) -> str:
    """Triton's ``[request id: <id>] `` prefix of request errors."""
    return f"[request id: {req.client_id or '<id_unknown>'}] "


def queue_start_ns(arrival_ns: int, now_ns: int) -> int:
    """When a request's time in the queue starts (the batching delay's and the queue
    timeout's origin): its ``arrival_ns``, stamped as its frontend handed it on (Triton's
    ``CaptureQueueStartNs``, in the same process as its frontend), so the hop to this process
    counts against ``max_queue_delay_microseconds`` as it does in the queue-time statistic;
    ``now_ns`` when it has no stamp in the past (0, or a clock it does not share)."""
    return arrival_ns if 0 < arrival_ns <= now_ns else now_ns


def unknown_version(
    model: str, version: int, active: Iterable[tuple[str, int]]
) -> tuple[ErrorCode, str]:
    """The answer to a request for a version the scheduler does not serve: the frontend
    resolved it, so a model still served under another version stopped serving this one
    since (UNAVAILABLE "... is not at ready state", core ModelLifeCycle::GetModel); a model
    not served at all is NOT_FOUND "... is not found"."""
    if any(name == model for name, _ in active):
        return (
            ErrorCode.UNAVAILABLE,
            f"Request for unknown model: '{model}' version {version} is not at ready state",
        )
    return ErrorCode.NOT_FOUND, f"Request for unknown model: '{model}' is not found"
