"""An instance_group-only reload in the scheduler (``InstancesRegrouped``,
``scheduler.lifecycle``), in-process: the version's generation goes on, added instances
join it, removed ones leave once they run nothing and hold no live sequence (core
``TritonModel::UpdateInstanceGroup``, ``SequenceBatchScheduler::Update``)."""

from __future__ import annotations

import msgspec

from tests.unit.scheduler_harness import Harness, model_spec
from tests.unit.test_direct_handoff import DELAYED, NODELAY, FakeLeases, direct, done
from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.protocol.messages import (
    InstancesAdded,
    InstancesRegrouped,
    InstanceWiring,
    SequenceFlags,
    Shutdown,
    VersionsActivated,
)
from triton_mp.ipc.protocol.specs import BatchingSpec, ModelVersionSpec, SequenceSpec
from triton_mp.ipc.recordio.codec import encode
from triton_mp.scheduler.instances import InstanceState

START, END = int(SequenceFlags.START), int(SequenceFlags.END)
SEQ = msgspec.structs.replace(
    model_spec("m", (10, 11)),
    batching=BatchingSpec(kind="sequence", max_batch_size=8),
    sequence=SequenceSpec(strategy="oldest", max_candidate_sequences=1),
)


def _wiring(instance_id: int, model: str = "m") -> InstanceWiring:
    return InstanceWiring(
        instance_id=instance_id,
        name=f"{model}_{instance_id}",
        model=model,
        version=1,
        to_worker_ring=f"/r_s_w{instance_id}",
        to_worker_wakeup=Wakeup("semaphore", f"/w{instance_id}_sem"),
        from_worker_ring=f"/r_w{instance_id}_s",
    )


def _load(h: Harness, spec: ModelVersionSpec) -> None:
    h.handle(InstancesAdded(instances=tuple(_wiring(i) for i in spec.instance_ids)))
    h.ready(*spec.instance_ids)
    h.handle(VersionsActivated(specs=(encode(spec),)))


def _regroup(h: Harness, spec: ModelVersionSpec, ids: tuple[int, ...]) -> None:
    """What the supervisor sends: the added instances, then the version's new list."""
    added = [i for i in ids if i not in spec.instance_ids]
    if added:
        h.handle(InstancesAdded(instances=tuple(_wiring(i, spec.model) for i in added)))
        h.ready(*added)
    new = msgspec.structs.replace(spec, instance_ids=ids)
    h.handle(InstancesRegrouped(spec=encode(new)))


def _shutdowns(h: Harness) -> list[int]:
    return sorted(i for i, m in h.to_workers if isinstance(m, Shutdown))


def test_a_removed_instance_finishes_its_batch_then_stops_and_the_generation_goes_on() -> None:
    h = Harness(models=())
    spec = model_spec("m", (10, 11))
    _load(h, spec)
    gen = h.core.lifecycle.active[("m", 1)]
    running = [h.request("m") for _ in range(4)]
    ((first, batch),) = h.dispatch()
    keep = 11 if first == 10 else 10
    _regroup(h, spec, (keep, 12))
    assert h.core.lifecycle.active[("m", 1)] is gen  # no new generation
    assert h.core.lifecycle.instances.get(first).state is InstanceState.LEAVING  # type: ignore[union-attr]
    h.dispatch()
    assert _shutdowns(h) == []  # its batch still runs
    later = [h.request("m") for _ in range(8)]
    assert sorted(i for i, _ in h.dispatch()) == [keep, 12]  # never the leaving one
    h.done(first, batch)
    h.dispatch()
    assert _shutdowns(h) == [first]
    assert batch.requests == tuple(running)
    assert h.stats("m").execution_count == 1  # the version's books go on
    assert len(later) == 8


def test_a_removed_instance_s_live_sequence_runs_to_its_end_then_it_stops() -> None:
    h = Harness(models=())
    _load(h, SEQ)
    h.request("m", sequence_id=11, sequence_flags=START)
    h.request("m", sequence_id=12, sequence_flags=START)
    batches = dict(h.dispatch())
    on = {b.requests[0].sequence_id: i for i, b in batches.items()}
    for i, b in batches.items():
        h.done(i, b)
    leaving = on[11]
    _regroup(h, SEQ, (on[12],))
    h.dispatch()
    assert _shutdowns(h) == []  # sequence 11 is live on it
    h.request("m", sequence_id=11)
    h.request("m", sequence_id=13, sequence_flags=START)  # waits for the kept slot
    ((i, b),) = [(i, b) for i, b in h.dispatch() if b.requests[0].sequence_id == 11]
    assert i == leaving
    h.done(i, b)
    h.request("m", sequence_id=11, sequence_flags=END)
    ((i, b),) = h.dispatch()
    assert (i, b.requests[0].sequence_id) == (leaving, 11)
    assert _shutdowns(h) == []  # its END runs
    h.done(i, b)
    h.dispatch()
    assert _shutdowns(h) == [leaving]
    assert h.failures() == []


def test_an_added_instance_takes_new_sequences() -> None:
    h = Harness(models=())
    one = msgspec.structs.replace(SEQ, instance_ids=(10,))
    _load(h, one)
    h.request("m", sequence_id=1, sequence_flags=START)
    ((i, b),) = h.dispatch()
    h.done(i, b)
    _regroup(h, one, (10, 20))
    h.request("m", sequence_id=2, sequence_flags=START)
    h.request("m", sequence_id=1)
    assert sorted((i, b.requests[0].sequence_id) for i, b in h.dispatch()) == [(10, 1), (20, 2)]
    assert _shutdowns(h) == []


def test_a_leaving_instance_s_lease_is_taken_back_and_never_offered_again() -> None:
    """Only live members of the version are handed requests directly: a frontend that won
    the leaving instance's lease before the regroup still runs its request there."""
    h = Harness(models=(NODELAY, DELAYED))
    leases = FakeLeases()
    h.core.handoffs.leases = leases
    h.ready(0, 1)
    h.dispatch()
    assert leases.value == {0: 1, 1: 1}
    assert leases.frontend_take(0)
    _regroup(h, NODELAY, (1, 5))
    h.dispatch()
    assert leases.value == {0: 0, 1: 1, 5: 1}
    assert _shutdowns(h) == []  # a frontend's batch is on its way to 0
    req = msgspec.structs.replace(h.request("delayed"), model="nodelay")
    sent = direct(h, 0, req)
    h.handle(sent)
    h.dispatch()
    assert _shutdowns(h) == []
    h.handle(done(h, 0, sent.batch_id))
    h.dispatch()
    assert _shutdowns(h) == [0]
    assert leases.value[0] == 0
