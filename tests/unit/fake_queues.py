"""Hand-made ``QueueReply`` contents for the admin-service and ``triton-mp stat`` unit tests.

Imported by tests only; no server, no scheduler.
"""

from __future__ import annotations

from triton_mp.ipc.protocol.reports import (
    BatchRecord,
    InstanceStatus,
    LevelStatus,
    ModelQueueStatus,
)


def level(level: int = 1, **kw: int) -> LevelStatus:
    """A priority level; every count 0 unless given."""
    fields = dict.fromkeys(
        ("depth", "delayed", "oldest_age_us", "rejected", "timed_out", "delayed_total"), 0
    )
    fields.update(kw)
    return LevelStatus(level=level, **fields)


def instance(name: str, instance_id: int = 0, live: bool = True, **kw: int) -> InstanceStatus:
    """An instance; idle with no executions unless given."""
    fields = dict.fromkeys(
        ("batches_in_flight", "requests_in_flight", "batch_size_in_flight", "executions"), 0
    )
    fields.update(kw)
    return InstanceStatus(instance_id=instance_id, name=name, live=live, **fields)


def busy_cls() -> ModelQueueStatus:
    """ocr_cls under load: two priority levels, one instance busy and one dead."""
    return ModelQueueStatus(
        model="ocr_cls",
        version=1,
        scheduler="dynamic",
        max_batch_size=32,
        preferred_batch_sizes=(8, 16),
        max_queue_delay_us=100,
        levels=(
            level(1, depth=12, oldest_age_us=3_200),
            level(
                2,
                depth=40,
                delayed=3,
                oldest_age_us=1_250_000,
                rejected=7,
                timed_out=2,
                delayed_total=3,
            ),
        ),
        instances=(
            instance(
                "ocr_cls_0_0",
                0,
                batches_in_flight=1,
                requests_in_flight=5,
                batch_size_in_flight=8,
                executions=120,
            ),
            instance("ocr_cls_0_1", 1, live=False, executions=99),
        ),
        batch_sizes={16: 40, 1: 5, 8: 60, 3: 2},
        close_reasons={"preferred": 100, "idle": 7},
        recent_batches=tuple(
            BatchRecord(
                age_us=1_000 * i,
                batch_size=8,
                requests=5,
                reason="preferred" if i % 3 else "idle",
                instance="ocr_cls_0_0",
            )
            for i in range(12)
        ),
    )


def idle_add_sub() -> ModelQueueStatus:
    """add_sub with the default scheduler, nothing queued, no batch formed yet."""
    return ModelQueueStatus(
        model="add_sub",
        version=1,
        scheduler="default",
        max_batch_size=8,
        preferred_batch_sizes=(),
        max_queue_delay_us=0,
        levels=(level(0),),
        instances=(instance("add_sub_0_0"),),
        batch_sizes={},
        close_reasons={},
        recent_batches=(),
    )
