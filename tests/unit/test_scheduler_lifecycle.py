"""The scheduler's instances through staged -> active -> retiring -> removed, its dispatch
table and its policy registry, in-process (``scheduler.lifecycle``, ``scheduler.core``,
``scheduler.registry``): model changes as the supervisor sends them, no process."""

from __future__ import annotations

import typing

import msgspec
import pytest

from tests.unit.scheduler_harness import Harness, model_spec
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.memory.ring import RecordTooLarge
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    InstancesAdded,
    InstancesRemoved,
    InstancesRetired,
    InstanceWiring,
    ModelAvailability,
    RequestFailed,
    Shutdown,
    ToScheduler,
    VersionsActivated,
    WorkerDied,
    WorkerReady,
)
from triton_mp.ipc.protocol.specs import BatchingSpec, ModelVersionSpec, SequenceSpec
from triton_mp.ipc.recordio.codec import encode
from triton_mp.ipc.recordio.records import RequestRecord
from triton_mp.scheduler.core import SchedulerCore, deliver
from triton_mp.scheduler.instances import Health, InstanceState
from triton_mp.scheduler.lifecycle import READERS_S, STOPPING_MESSAGE
from triton_mp.scheduler.outbox import Attach, Detach, Reply, Unmap
from triton_mp.scheduler.policies.default import DefaultScheduler
from triton_mp.scheduler.policies.dynamic import DynamicBatcher
from triton_mp.scheduler.policies.sequence import SequenceBatcher
from triton_mp.scheduler.registry import POLICIES, make_policy

V1 = model_spec("m", (10, 11))


def _wiring(instance_id: int, name: str = "") -> InstanceWiring:
    return InstanceWiring(
        instance_id=instance_id,
        name=name or f"m_{instance_id}",
        model="m",
        version=1,
        to_worker_ring=f"/r_s_w{instance_id}",
        to_worker_wakeup=Wakeup("semaphore", f"/w{instance_id}_sem"),
        from_worker_ring=f"/r_w{instance_id}_s",
    )


def _load(h: Harness, spec: ModelVersionSpec, *, ready: bool = True) -> None:
    """What the supervisor sends for a load: add, (workers report ready), activate."""
    h.handle(InstancesAdded(instances=tuple(_wiring(i) for i in spec.instance_ids)))
    if ready:
        h.ready(*spec.instance_ids)
    h.handle(VersionsActivated(specs=(encode(spec),)))


def _state(h: Harness, instance_id: int) -> tuple[InstanceState, Health]:
    inst = h.core.lifecycle.instances.get(instance_id)
    assert inst is not None
    return inst.state, inst.health


def _availability(h: Harness) -> list[bool]:
    out = [m.ready for _, m in h.to_frontends if isinstance(m, ModelAvailability)]
    h.to_frontends[:] = [(f, m) for f, m in h.to_frontends if not isinstance(m, ModelAvailability)]
    return out


@pytest.fixture
def h() -> Harness:
    return Harness(models=())


# ------------------------------------------------------------------------ dispatch table


def test_the_dispatch_table_has_one_handler_per_inbound_message() -> None:
    core = SchedulerCore()
    # NOTE: a REQUEST ring record decodes to a RequestRecord (ipc.recordio.records), not a message.
    assert set(core.handlers) == {*typing.get_args(ToScheduler), RequestRecord}


def test_a_bad_batch_is_refused_but_other_undeliverable_messages_are_not_hidden() -> None:
    def send(item: object) -> None:
        raise RecordTooLarge("too large")

    core = SchedulerCore()
    with pytest.raises(RecordTooLarge):
        deliver(core, [Reply(to=None, msg=None)], send, 0)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- staging


def test_a_staged_instance_takes_no_work_until_its_version_is_active(h: Harness) -> None:
    h.handle(InstancesAdded(instances=(_wiring(10), _wiring(11))))
    assert [type(w) for w in h.wiring] == [Attach, Attach]
    h.ready(10, 11)
    assert _state(h, 10) == (InstanceState.STAGED, Health.READY)
    assert _availability(h) == []  # nothing announced for a staged instance
    lost = h.request("m")  # the version is unknown until activated
    assert [m.request_id for _, m in h.failures()] == [lost.request_id]
    h.handle(VersionsActivated(specs=(encode(V1),)))
    assert _state(h, 10) == (InstanceState.ACTIVE, Health.READY)
    assert _availability(h) == [True]
    reqs = [h.request("m") for _ in range(4)]  # preferred size 4
    ((_, batch),) = h.dispatch()
    assert batch.requests == tuple(reqs)


def test_a_staged_instance_that_dies_starts_again_without_counting_a_restart(
    h: Harness,
) -> None:
    h.handle(InstancesAdded(instances=(_wiring(10),)))
    h.ready(10)
    h.handle(WorkerDied(instance_id=10, exitcode=-9))
    assert _state(h, 10) == (InstanceState.STAGED, Health.STARTING)
    h.handle(VersionsActivated(specs=(encode(model_spec("m", (10,))),)))
    assert _state(h, 10) == (InstanceState.ACTIVE, Health.STARTING)
    assert _availability(h) == []
    h.ready(10)
    assert _availability(h) == [True]
    (st,) = h.core.queue_status("m", h.now)
    assert [(i.live, i.restarts) for i in st.instances] == [(True, 0)]


# ------------------------------------------------------------------------- retirement


def test_a_reload_finishes_the_old_queue_on_the_old_instances_then_stops_them(
    h: Harness,
) -> None:
    _load(h, V1)
    assert _availability(h) == [True]
    old = [h.request("m") for _ in range(4)]
    ((old_instance, old_batch),) = h.dispatch()
    queued = h.request("m")  # waits: the delay has not run out
    v1_again = model_spec("m", (20, 21))
    h.handle(InstancesAdded(instances=(_wiring(20), _wiring(21))))
    h.ready(20, 21)
    h.handle(VersionsActivated(specs=(encode(v1_again),)))
    assert _state(h, old_instance)[0] is InstanceState.RETIRING
    assert _availability(h) == []  # the version stayed ready throughout
    new = [h.request("m") for _ in range(4)]
    ((new_instance, new_batch),) = h.dispatch()
    assert new_instance in (20, 21)
    assert new_batch.requests == tuple(new)
    assert old_batch.requests == tuple(old)
    h.clock.advance_us(100)  # the old generation's delay runs out: its last request goes
    ((i, last),) = h.dispatch()
    assert i in (10, 11)
    assert last.requests == (queued,)
    h.done(old_instance, old_batch)
    h.done(i, last)
    h.done(new_instance, new_batch)
    h.dispatch()  # the first pass that sees the retirement idle only arms it
    h.dispatch()
    shutdowns = sorted(i for i, m in h.to_workers if isinstance(m, Shutdown))
    assert shutdowns == [10, 11]
    # NOTE: a retired instance waits for the frontends to read its last answers.
    assert {m.readers_s for _, m in h.to_workers if isinstance(m, Shutdown)} == {READERS_S}
    assert _state(h, 10)[0] is InstanceState.STOPPING
    assert h.stats("m").execution_count == 3  # one version's books, both generations


def test_an_unload_answers_what_is_queued_then_stops_and_drops_the_books(h: Harness) -> None:
    _load(h, V1)
    h.request("m")
    h.handle(InstancesRetired(instance_ids=(10, 11)))
    h.clock.advance_us(100)
    ((i, batch),) = h.dispatch()  # the queued request still runs
    assert h.core.queue_status("m", h.now) == ()  # not served any more
    h.done(i, batch)
    h.dispatch()
    assert sorted(i for i, m in h.to_workers if isinstance(m, Shutdown)) == [10, 11]
    assert h.core.stats.snapshot("m") == ()
    h.handle(InstancesRemoved(instance_ids=(10, 11)))
    assert [w.instance_id for w in h.wiring if isinstance(w, Detach)] == [10, 11]
    assert h.core.lifecycle.instances.get(10) is None
    assert h.core.idle()


def test_an_unloaded_version_without_instances_drops_its_books(h: Harness) -> None:
    """An ensemble's version runs on no instance: the unload names it by key
    (``InstancesRetired.versions``), else its statistics stayed listed after the unload."""
    bare = model_spec("e", ())
    h.handle(VersionsActivated(specs=(encode(bare),)))
    assert [s.name for s in h.core.stats.snapshot("e")] == ["e"]
    h.handle(InstancesRetired(instance_ids=(), versions=(("e", 1), ("gone", 3))))
    h.dispatch()
    h.dispatch()
    assert h.core.stats.snapshot("e") == ()
    assert h.core.idle()


def test_a_retired_version_whose_instances_all_died_fails_its_queue(h: Harness) -> None:
    _load(h, V1, ready=False)
    queued = h.request("m")
    h.handle(InstancesRetired(instance_ids=(10, 11)))
    h.handle(WorkerDied(instance_id=10, exitcode=-9))
    h.handle(WorkerDied(instance_id=11, exitcode=-9))
    h.dispatch()
    ((_, failed),) = h.failures()
    assert isinstance(failed, RequestFailed)
    assert failed.request_id == queued.request_id
    assert (failed.error.code, failed.error.message) == (ErrorCode.UNAVAILABLE, STOPPING_MESSAGE)
    h.dispatch()
    assert not [m for _, m in h.to_workers if isinstance(m, Shutdown)]  # dead: none to tell


def test_a_request_sent_before_the_frontend_dropped_the_version_still_runs(
    h: Harness,
) -> None:
    _load(h, V1)
    h.handle(InstancesRetired(instance_ids=(10, 11)))
    late = h.request("m")  # the frontend had not applied the unload yet
    h.clock.advance_us(100)
    ((_, batch),) = h.dispatch()
    assert batch.requests == (late,)
    assert isinstance(batch, BatchAssign)


def test_the_next_deadline_wakes_a_retirement_that_may_end(h: Harness) -> None:
    _load(h, V1)
    assert h.core.next_deadline_ns() is None
    h.handle(InstancesRetired(instance_ids=(10, 11)))
    assert h.core.next_deadline_ns() == 0
    h.dispatch()
    h.dispatch()
    assert h.core.next_deadline_ns() is None


# --------------------------------------------------------------------------- registry


def test_every_scheduling_choice_has_a_policy() -> None:
    kinds = typing.get_args(typing.get_type_hints(BatchingSpec)["kind"])
    assert set(POLICIES) == set(kinds)


@pytest.mark.parametrize(
    ("batching", "sequence", "policy"),
    [
        (BatchingSpec(), None, DefaultScheduler),
        (BatchingSpec(kind="dynamic", max_batch_size=8), None, DynamicBatcher),
        (BatchingSpec(kind="sequence", max_batch_size=8), SequenceSpec(), SequenceBatcher),
        (BatchingSpec(kind="sequence", max_batch_size=8), None, DefaultScheduler),
    ],
)
def test_a_spec_gets_the_policy_of_its_scheduling_choice(
    batching: BatchingSpec, sequence: SequenceSpec | None, policy: type
) -> None:
    spec = msgspec.structs.replace(model_spec("m", (0,)), batching=batching, sequence=sequence)
    assert type(make_policy(spec)) is policy


def test_a_dead_or_removed_worker_s_arenas_are_unmapped_in_the_scheduler(h: Harness) -> None:
    """The scheduler attaches workers' arenas to free ensemble steps' blocks; the supervisor
    names a dead process's (and a removed instance's) arenas so the mapping goes too."""
    _load(h, V1)
    h.handle(WorkerDied(instance_id=10, exitcode=-9, segments="/x_w10p123_"))
    assert [w for w in h.wiring if isinstance(w, Unmap)] == [Unmap("/x_w10p123_")]
    h.handle(WorkerDied(instance_id=11, exitcode=-9))  # a supervisor that names none
    assert len([w for w in h.wiring if isinstance(w, Unmap)]) == 1
    h.handle(InstancesRetired(instance_ids=(10, 11)))
    h.dispatch()
    h.handle(InstancesRemoved(instance_ids=(10, 11), segments=("/x_w10p", "/x_w11p")))
    unmapped = [w.prefix for w in h.wiring if isinstance(w, Unmap)]
    assert unmapped == ["/x_w10p123_", "/x_w10p", "/x_w11p"]


def test_a_reload_as_a_new_model_starts_the_statistics_again(h: Harness) -> None:
    """Core ``AsyncLoad``: an ``instance_group`` change updates the model in place (its
    statistics go on); any other change makes a new model (they start at 0); the totals,
    which the metrics report, go on either way (``scheduler.model_reloads``)."""
    config = {"name": "m", "max_batch_size": 8, "instance_group": [{"count": 2}]}

    def spec(ids: tuple[int, ...], **changes: object) -> ModelVersionSpec:
        cfg = msgspec.json.encode({**config, **changes}).decode()
        return msgspec.structs.replace(model_spec("m", ids), config_json=cfg)

    def counted(since_load: bool) -> int:
        (st,) = h.core.stats.snapshot("m", 1, since_load=since_load)
        return st.execution_count

    _load(h, spec((10, 11)))
    [h.request("m") for _ in range(4)]
    ((instance, batch),) = h.dispatch()
    h.done(instance, batch)
    assert (counted(True), counted(False)) == (1, 1)
    _load(h, spec((20, 21, 22), instance_group=[{"count": 3}]))
    assert (counted(True), counted(False)) == (1, 1)
    _load(h, spec((30, 31), max_batch_size=4))
    assert (counted(True), counted(False)) == (0, 1)


def test_warmup_runs_count_in_the_statistics_from_the_activation(h: Harness) -> None:
    """Core ``WarmUp`` runs count like any execution: a staged instance's runs (reported in
    its ``WorkerReady``) go into its version's books once the version activates, a ready
    instance's (a restart) at once."""
    h.handle(InstancesAdded(instances=tuple(_wiring(i) for i in V1.instance_ids)))
    h.handle(
        WorkerReady(instance_id=10, pid=1010, warmup=((1, 100, 5, 40, 200), (2, 300, 5, 50, 400)))
    )
    h.handle(WorkerReady(instance_id=11, pid=1011, warmup=((1, 500, 5, 40, 600),)))
    assert h.core.stats.snapshot("m") == ()  # not counted while staged
    h.handle(VersionsActivated(specs=(encode(V1),)))
    (st,) = h.core.stats.snapshot("m")
    assert (st.inference_count, st.execution_count) == (4, 3)
    assert (st.success.count, st.success.ns) == (4, 100 + 2 * 100 + 100)
    assert (st.queue.count, st.queue.ns) == (4, 0)
    assert (st.compute_infer.count, st.compute_infer.ns) == (4, 40 + 2 * 50 + 40)
    assert {size: b.compute_infer.count for size, b in st.batch_stats.items()} == {1: 2, 2: 1}
    assert st.last_inference_ms > 0
    h.handle(WorkerDied(instance_id=11, exitcode=-9))
    h.handle(WorkerReady(instance_id=11, pid=1012, warmup=((1, 700, 5, 40, 800),)))
    (st,) = h.core.stats.snapshot("m")
    assert (st.inference_count, st.execution_count) == (5, 4)
