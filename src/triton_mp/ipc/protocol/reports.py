"""What the scheduler reports: per-version statistics and queue status, as they travel.

Imported by ``ipc.protocol.messages`` (``StatsReply`` and ``QueueReply`` carry them), the scheduler
(which fills them: ``scheduler.stats``, ``scheduler.status``) and their readers (the
frontend's statistics and metrics, ``triton-mp stat``). ``ModelStats`` mirrors Triton's
``inference.ModelStatistics``; ``ModelQueueStatus`` is triton-mp's own view for
``triton-mp stat`` (``triton_mp.admin.Admin/QueueStatus``).
"""

from __future__ import annotations

import msgspec


class StatDuration(msgspec.Struct, array_like=True):
    """Triton's StatisticDuration: a count and a total in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        """Add ``count`` events that took ``ns`` nanoseconds in total."""
        self.count += count
        self.ns += ns


class BatchStats(msgspec.Struct, array_like=True):
    """Triton's InferBatchStatistics for one batch size."""

    batch_size: int
    compute_input: StatDuration = msgspec.field(default_factory=StatDuration)
    compute_infer: StatDuration = msgspec.field(default_factory=StatDuration)
    compute_output: StatDuration = msgspec.field(default_factory=StatDuration)


class ModelStats(msgspec.Struct, array_like=True):
    """Triton's ModelStatistics for one model version (inference.ModelStatistics)."""

    name: str
    version: int
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: StatDuration = msgspec.field(default_factory=StatDuration)
    fail: StatDuration = msgspec.field(default_factory=StatDuration)
    queue: StatDuration = msgspec.field(default_factory=StatDuration)
    compute_input: StatDuration = msgspec.field(default_factory=StatDuration)
    compute_infer: StatDuration = msgspec.field(default_factory=StatDuration)
    compute_output: StatDuration = msgspec.field(default_factory=StatDuration)
    batch_stats: dict[int, BatchStats] = msgspec.field(default_factory=dict)
    fail_reasons: dict[str, int] = msgspec.field(default_factory=dict)
    """Failed requests per Triton metric reason: REJECTED (queue timeout; a full queue's
    refusal is counted nowhere, as in Triton),
    CANCELED (client went away), BACKEND (the model's error), OTHER (instance died, stopping)."""
    cache_hit: StatDuration = msgspec.field(default_factory=StatDuration)
    """Requests answered from the response cache, and the lookups' time."""
    cache_miss: StatDuration = msgspec.field(default_factory=StatDuration)
    """Requests not found in the cache whose response was inserted, and the lookup plus
    insertion time."""


class LevelStatus(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One priority level of a model's queue, as ``triton-mp stat`` shows it."""

    level: int
    """Priority level (1 = highest); 0 when the model has no priority levels."""
    depth: int
    """Requests waiting, delayed ones included."""
    delayed: int
    """Of those, requests whose queue timeout expired under ``timeout_action: DELAY``."""
    oldest_age_us: int
    """How long the oldest waiting request has waited, in microseconds (0 when empty)."""
    rejected: int
    """Requests refused because the level held ``max_queue_size`` requests (cumulative)."""
    timed_out: int
    """Requests failed by ``timeout_action: REJECT`` (cumulative)."""
    delayed_total: int
    """Requests moved behind the others by ``timeout_action: DELAY`` (cumulative)."""


class InstanceStatus(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One model instance (worker process) as the scheduler sees it."""

    instance_id: int
    name: str
    live: bool
    """The worker reported ready and has not died since."""
    batches_in_flight: int
    """Batches handed to the instance and not yet done (0 or 1; 2 with a batch staged
    behind the running one, ``scheduler.staging``, which counts as waiting too)."""
    requests_in_flight: int
    batch_size_in_flight: int
    """Sum of the request batch sizes of the batch in flight."""
    executions: int
    """Batches this instance finished (cumulative)."""
    restarts: int = 0
    """Times the worker process came back after it died (cumulative)."""
    waiting_requests: int = 0
    """Requests of its batch that waits for the rate limiter's resources, or of the batch
    staged behind its running one (counted in ``batches_in_flight`` and
    ``requests_in_flight`` too, and pending in the metrics)."""


class BatchRecord(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One recently formed batch."""

    age_us: int
    """Microseconds since it was formed."""
    batch_size: int
    requests: int
    reason: str
    """Why it closed: a ``common.close_reason.CloseReason`` value."""
    instance: str


class StepStatus(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One step of an ensemble now: its model, its requests in flight, and those held back
    by ``max_inflight_requests``."""

    model: str
    in_flight: int
    waiting: int


class ModelQueueStatus(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The scheduler's state of one model version, for ``triton-mp stat``."""

    model: str
    version: int
    scheduler: str
    """Its batching policy: ``dynamic``, ``sequence`` or ``default`` (one request per
    execution); ``ipc.protocol.specs.BatchingSpec.kind``."""
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    levels: tuple[LevelStatus, ...]
    instances: tuple[InstanceStatus, ...]
    batch_sizes: dict[int, int]
    """Histogram of formed batches: total batch size -> batches (cumulative)."""
    close_reasons: dict[str, int]
    """Why formed batches closed: ``CloseReason`` value -> batches (cumulative)."""
    recent_batches: tuple[BatchRecord, ...]
    """The most recent batches, newest first."""
    steps: tuple[StepStatus, ...] = ()
    """An ensemble's steps, in config order (empty for any other model)."""
