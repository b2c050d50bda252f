"""Why the scheduler closed a batch: ``CloseReason``, defined once for every role.

The scheduler's batching policies (``scheduler.policies``) produce it; ``triton-mp stat``
(``cli.stat``) and the Prometheus endpoint (``frontend.metrics.render``) show it. It travels as its
string value in ``ipc.protocol.reports`` (``ModelQueueStatus.close_reasons``,
``BatchRecord.reason``).
It lives in ``common`` (as ``ErrorCode`` does) because the batching core imports nothing of
``ipc`` (``tests/unit/test_layering.py``) and the frontend never imports the scheduler.
"""

from __future__ import annotations

from enum import StrEnum


class CloseReason(StrEnum):
    """Why a batch closed; members are in the order ``triton-mp stat`` and the metrics show
    them (Triton's dynamic batcher, ``dynamic_batch_scheduler.cc``; sequence batcher)."""

    MAX = "max"
    """The batch reached ``max_batch_size``, or the next request would not fit."""
    PREFERRED = "preferred"
    """The batch reached a ``preferred_batch_size``."""
    DELAY = "delay"
    """The oldest request's ``max_queue_delay_microseconds`` ran out."""
    IDLE = "idle"
    """Sent as soon as an instance was free (no delay, or the delay ran out while every
    instance was busy)."""
    SHAPE = "shape"
    """The next request's shape-enforced inputs differ from the batch's."""
    SINGLE = "single"
    """One request per execution (the default scheduler, or ``max_batch_size`` 0)."""
