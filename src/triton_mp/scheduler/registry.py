"""Which batching policy a model version gets: ``POLICIES``, one entry per policy.

The one place that reads runtime specs (``ipc.protocol.specs.ModelVersionSpec``) into policy
arguments, so the policies themselves stay pure (``scheduler.policies.policy``). The key is the
model's scheduling choice, ``BatchingSpec.kind`` (Triton's ``scheduling_choice`` oneof:
none, ``dynamic_batching``, ``sequence_batching``). A new policy (an ensemble scheduler) is a
module in ``scheduler/policies/`` plus one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from triton_mp.ipc.protocol.specs import ModelVersionSpec, QueuePolicySpec, RateLimitSpec
from triton_mp.scheduler.limits.rate_limiter import Limits
from triton_mp.scheduler.policies.default import DefaultScheduler
from triton_mp.scheduler.policies.dynamic import DynamicBatcher
from triton_mp.scheduler.policies.ensemble import EnsembleScheduler, Step
from triton_mp.scheduler.policies.policy import Policy
from triton_mp.scheduler.policies.queues import PriorityQueue, QueuePolicy
from triton_mp.scheduler.policies.sequence import SequenceBatcher


def _queue_policy(p: QueuePolicySpec) -> QueuePolicy:
    return QueuePolicy(
        p.timeout_action, p.default_timeout_us, p.allow_timeout_override, p.max_queue_size
    )


def _default(spec: ModelVersionSpec) -> Policy:
    """Triton's default scheduler (FIFO, one request per execution, priorities ignored)."""
    return DefaultScheduler()


def _dynamic(spec: ModelVersionSpec) -> Policy:
    """The dynamic batcher with the model's priority levels and queue policies (also with
    max_batch_size 0: requests then run alone)."""
    b = spec.batching
    queue = PriorityQueue(
        b.priority_levels,
        b.default_priority_level,
        _queue_policy(b.default_queue_policy),
        {level: _queue_policy(p) for level, p in b.priority_queue_policy.items()},
    )
    return DynamicBatcher(
        max(0, spec.max_batch_size), b.preferred_batch_sizes, b.max_queue_delay_us, queue=queue
    )


def _sequence(spec: ModelVersionSpec) -> Policy:
    """The sequence batcher; a CORRID control of datatype BYTES wants string IDs, any other
    one integers (no CORRID control: either)."""
    seq = spec.sequence
    if seq is None:
        # NOTE: a spec that says sequence without sequence_batching: the default scheduler,
        # as before the registry.
        return _default(spec)
    corrid = next((c for c in seq.controls if c.kind == "CORRID"), None)
    kind: type | None = None
    if corrid is not None:
        kind = str if corrid.datatype == "BYTES" else int
    return SequenceBatcher(
        spec.model,
        seq.strategy,
        max(0, spec.max_batch_size),
        spec.instance_ids,
        max_sequence_idle_us=seq.max_sequence_idle_us,
        max_queue_delay_us=seq.max_queue_delay_us,
        minimum_slot_utilization=seq.minimum_slot_utilization,
        max_candidate_sequences=seq.max_candidate_sequences,
        preferred_batch_sizes=seq.preferred_batch_sizes,
        corrid_kind=kind,
        iterative=seq.iterative,
    )


def _ensemble(spec: ModelVersionSpec) -> Policy:
    """The ensemble scheduler over the ensemble's steps (``ensemble_scheduling``)."""
    ens = spec.ensemble
    steps = ens.steps if ens is not None else ()
    return EnsembleScheduler(
        spec.model,
        [
            Step(
                s.model,
                s.version,
                tuple(s.input_map.items()),
                tuple(s.output_map.items()),
                decoupled=s.decoupled,
            )
            for s in steps
        ],
        [t.name for t in spec.outputs],
        decoupled=spec.decoupled,
        max_inflight_requests=ens.max_inflight_requests if ens is not None else 0,
    )


POLICIES: dict[str, Callable[[ModelVersionSpec], Policy]] = {
    "default": _default,
    "dynamic": _dynamic,
    "sequence": _sequence,
    "ensemble": _ensemble,
}
"""``BatchingSpec.kind`` -> the factory of that policy for one model version (no instance
idle yet)."""


def make_policy(spec: ModelVersionSpec) -> Policy:
    """The batching policy of one model version's generation (``POLICIES``)."""
    return POLICIES[spec.batching.kind](spec)


def instance_limits(rate_limits: Sequence[RateLimitSpec], i: int) -> Limits:
    """The rate limiter's limits of a version's instance ``i`` (``rate_limits``: the
    version's ``instance_group[].rate_limiter`` per instance; none configured: no limits)."""
    spec = rate_limits[i] if i < len(rate_limits) else None
    if spec is None:
        return Limits()
    resources = tuple((r.name, r.global_, r.count) for r in spec.resources)
    return Limits(resources, spec.priority, spec.device)
