"""The scheduler's queue-status views: what ``triton-mp stat`` and the queue metrics show.

Imported by the scheduler core: ``BatchLogs`` keeps, per model version, the batches it
formed (sizes, close reasons, the most recent ones); ``queue_status`` builds the
``QueueReply`` contents (``ipc.protocol.reports.ModelQueueStatus``) from those books, the active
generations' policies (per priority level) and the instance table. No I/O.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from triton_mp.common.close_reason import CloseReason
from triton_mp.common.labels import unique_labels
from triton_mp.ipc.protocol.reports import (
    BatchRecord,
    InstanceStatus,
    LevelStatus,
    ModelQueueStatus,
    StepStatus,
)
from triton_mp.scheduler.instances import Generation, Instance, InstanceTable, VersionKey
from triton_mp.scheduler.policies.ensemble import EnsembleScheduler
from triton_mp.scheduler.policies.policy import Batch, LevelSnapshot

RECENT_BATCHES = 32
"""Formed batches kept per model for ``triton-mp stat``."""

_K = TypeVar("_K")


@dataclass(slots=True)
class BatchLog:
    """What ``triton-mp stat`` shows of the batches one model version formed."""

    sizes: collections.Counter[int] = field(default_factory=collections.Counter)
    reasons: collections.Counter[CloseReason] = field(default_factory=collections.Counter)
    recent: collections.deque[tuple[int, int, int, CloseReason, str, int]] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_BATCHES)
    )
    """(formed at ns, total batch size, requests, reason, instance name, instance id), oldest
    first."""

    def record(self, batch: Batch, instance: Instance, now_ns: int) -> None:
        """One batch formed at ``now_ns`` for ``instance``."""
        self.sizes[batch.total_batch_size] += 1
        self.reasons[batch.reason] += 1
        self.recent.append(
            (
                now_ns,
                batch.total_batch_size,
                len(batch.requests),
                batch.reason,
                instance.label,
                instance.instance_id,
            )
        )

    def record_sizes(
        self, total: int, requests: int, reason: CloseReason, instance: Instance, now_ns: int
    ) -> None:
        """``record`` of a batch by its figures, no ``Batch`` built: ``total`` batch size,
        ``requests`` in it (a frontend's direct batch, which no policy formed,
        ``scheduler.direct``)."""
        self.sizes[total] += 1
        self.reasons[reason] += 1
        self.recent.append((now_ns, total, requests, reason, instance.label, instance.instance_id))

    def unrecord(self, batch: Batch, instance: Instance, formed_ns: int) -> None:
        """Take back ``record(batch, instance, formed_ns)``: a staged batch that never started
        went back to the queue (``scheduler.staging``' ``on_died``) and is recorded again when
        it is formed again, so each batch counts once, as in Triton's statistics."""
        total = batch.total_batch_size
        _take(self.sizes, total)
        _take(self.reasons, batch.reason)
        with contextlib.suppress(ValueError):
            self.recent.remove(
                (
                    formed_ns,
                    total,
                    len(batch.requests),
                    batch.reason,
                    instance.label,
                    instance.instance_id,
                )
            )


def _take(counter: collections.Counter[_K], key: _K) -> None:
    """One less ``key`` in ``counter`` (gone at 0: ``triton-mp stat`` lists what it holds)."""
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


class BatchLogs:
    """A ``BatchLog`` per served model version (kept across reloads, dropped on unload)."""

    def __init__(self) -> None:
        self._logs: dict[VersionKey, BatchLog] = {}

    def add(self, key: VersionKey) -> None:
        """Start the log of a version (kept when it exists: a reload)."""
        if key not in self._logs:
            self._logs[key] = BatchLog()

    def remove(self, key: VersionKey) -> None:
        """Drop the log of an unloaded version."""
        self._logs.pop(key, None)

    def get(self, key: VersionKey) -> BatchLog:
        """The log of ``key``, started if it was dropped (a retiring generation's batches)."""
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = BatchLog()
        return log


def _levels(levels: list[LevelSnapshot], now_ns: int) -> tuple[LevelStatus, ...]:
    return tuple(
        LevelStatus(
            level=lv.level,
            depth=lv.depth,
            delayed=lv.delayed,
            oldest_age_us=(
                0 if lv.oldest_arrival_ns is None else max(0, now_ns - lv.oldest_arrival_ns) // 1000
            ),
            rejected=lv.rejected,
            timed_out=lv.timed_out,
            delayed_total=lv.delayed_total,
        )
        for lv in levels
    )


def _instances(gen: Generation, table: InstanceTable) -> tuple[InstanceStatus, ...]:
    """The version's instances in its spec's order, each named by its unique label
    (``common.labels``: two instances that 2.51 names alike are ``<name>`` and ``<name>#2``)."""
    ids = gen.spec.instance_ids
    found = [table.get(i) for i in ids]
    labels = unique_labels(
        inst.label if inst is not None else str(i) for i, inst in zip(ids, found, strict=True)
    )
    out = []
    for i, inst, label in zip(ids, found, labels, strict=True):
        flight = inst.batch if inst is not None else None
        behind = inst.behind if inst is not None else None
        # NOTE: a staged batch (scheduler.staging) is in flight and waiting, as a batch
        # held for the rate limiter is.
        held = [b for b in (flight, behind) if b is not None]
        waiting = len(behind.requests) if behind is not None else 0
        if flight is not None and inst is not None and inst.staged:
            waiting += len(flight.requests)
        out.append(
            InstanceStatus(
                instance_id=i,
                name=label,
                live=inst is not None and inst.live,
                batches_in_flight=len(held),
                requests_in_flight=sum(len(b.requests) for b in held),
                batch_size_in_flight=sum(b.total_batch_size for b in held),
                executions=inst.executions if inst is not None else 0,
                restarts=inst.restarts if inst is not None else 0,
                waiting_requests=waiting,
            )
        )
    return tuple(out)


def _recent(
    log: BatchLog, now_ns: int, instances: tuple[InstanceStatus, ...]
) -> tuple[BatchRecord, ...]:
    """The log's recent batches, newest first; each instance by its label among
    ``instances`` (the version's, ``_instances``), or by its name once it left."""
    labels = {i.instance_id: i.name for i in instances}
    return tuple(
        BatchRecord(
            age_us=max(0, now_ns - at) // 1000,
            batch_size=size,
            requests=n,
            reason=str(reason),
            instance=labels.get(inst_id, name),
        )
        for at, size, n, reason, name, inst_id in reversed(log.recent)
    )


def queue_status(
    active: Mapping[VersionKey, Generation],
    table: InstanceTable,
    logs: BatchLogs,
    model: str,
    now_ns: int,
) -> tuple[ModelQueueStatus, ...]:
    """``triton-mp stat``'s view of one model's active versions (all models when empty),
    sorted by (model, version); ages in microseconds before ``now_ns``."""
    out = []
    for key, gen in sorted(active.items()):
        if model and key[0] != model:
            continue
        spec = gen.spec
        log = logs.get(key)
        instances = _instances(gen, table)
        out.append(
            ModelQueueStatus(
                model=key[0],
                version=key[1],
                scheduler=spec.batching.kind,
                max_batch_size=spec.max_batch_size,
                preferred_batch_sizes=spec.batching.preferred_batch_sizes,
                max_queue_delay_us=spec.batching.max_queue_delay_us,
                levels=_levels(gen.policy.levels(), now_ns),
                instances=instances,
                batch_sizes=dict(sorted(log.sizes.items())),
                close_reasons={str(r): n for r, n in sorted(log.reasons.items())},
                recent_batches=_recent(log, now_ns, instances),
                steps=_steps(gen),
            )
        )
    return tuple(out)


def _steps(gen: Generation) -> tuple[StepStatus, ...]:
    """An ensemble's steps: requests in flight and held back, per step."""
    policy = gen.policy
    if gen.spec.ensemble is None or not isinstance(policy, EnsembleScheduler):
        return ()
    waiting = policy.waiting()
    return tuple(
        StepStatus(model=step.model, in_flight=n, waiting=w)
        for step, n, w in zip(policy.steps, policy.step_inflight, waiting, strict=True)
    )
