"""The direct handoff (``ipc.direct``, ``scheduler.direct``, ``frontend.dispatch.direct``),
process-free.

The scheduler's decisions run on the recording harness with fake leases: which idle
instances are offered, when offers are taken back, what a frontend's ``DirectSent`` and the
worker's ``BatchDone`` do to statistics and the batch log, and what deaths, retirements,
shutdowns and lost claims do. The frontend's side runs on real rings and semaphores of this
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import msgspec
import numpy as np
import posix_ipc
import pytest

from tests.unit.scheduler_harness import US, Harness, model_spec
from tests.unit.test_inference import Frontend, _request
from triton_mp.common.errors import ErrorCode
from triton_mp.common.trace_config import TraceLevel
from triton_mp.frontend.dispatch.direct import DirectRoutes
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.frontend.tracing.tracer import Trace
from triton_mp.ipc import Ring
from triton_mp.ipc.direct import DirectRoute, Lease, create_lease, handoff_eligible
from triton_mp.ipc.memory.notify import create_wakeup
from triton_mp.ipc.memory.shm import unlink_quietly
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BatchDone,
    DirectSent,
    InferRequest,
    InstancesRetired,
    Shutdown,
    WorkerDied,
    direct_batch_id,
)
from triton_mp.ipc.protocol.specs import BatchingSpec, QueuePolicySpec, SequenceSpec
from triton_mp.ipc.recordio.codec import Decoder
from triton_mp.ipc.recordio.records import decode_request
from triton_mp.scheduler.direct import CLAIM_TIMEOUT_NS

NODELAY = model_spec("nodelay", (0, 1), batching=BatchingSpec(kind="dynamic", max_batch_size=8))
DELAYED = model_spec("delayed", (2,))  # dynamic batching, 100 µs delay
TIMED = QueuePolicySpec(default_timeout_us=10_000_000, allow_timeout_override=True)


class FakeLeases:
    """Lease semaphores as values; ``frontend_take`` is a frontend's ``sem_trywait``."""

    def __init__(self) -> None:
        self.value: dict[int, int] = {}

    def offer(self, instance_id: int) -> None:
        assert self.value.get(instance_id, 0) == 0, "offered twice"
        self.value[instance_id] = 1

    def take(self, instance_id: int) -> bool:
        if self.value.get(instance_id, 0):
            self.value[instance_id] = 0
            return True
        return False

    frontend_take = take


@pytest.fixture
def h() -> Harness:
    h = Harness(models=(NODELAY, DELAYED))
    h.leases = FakeLeases()  # type: ignore[attr-defined]
    h.core.handoffs.leases = h.leases  # type: ignore[attr-defined]
    return h


def leases(h: Harness) -> FakeLeases:
    return h.leases  # type: ignore[attr-defined,no-any-return]


def direct(h: Harness, instance_id: int, req: InferRequest) -> DirectSent:
    """What a frontend that took ``instance_id``'s lease leaves for the scheduler."""
    return DirectSent(
        instance_id=instance_id,
        batch_id=direct_batch_id(0, req.request_id),
        dispatch_ns=h.now,
        request=req,
    )


def done(h: Harness, instance_id: int, batch_id: int) -> BatchDone:
    return BatchDone(
        instance_id=instance_id,
        batch_id=batch_id,
        start_ns=h.now,
        compute_input_ns=1 * US,
        compute_infer_ns=5 * US,
        compute_output_ns=2 * US,
        end_ns=h.now + 8 * US,
    )


# ------------------------------------------------------------------ eligibility


@pytest.mark.parametrize(
    ("batching", "extra", "rate_limited", "ok"),
    [
        (BatchingSpec(), {}, False, True),  # the default scheduler
        (BatchingSpec(kind="dynamic", max_batch_size=8), {}, False, True),
        (BatchingSpec(kind="dynamic", max_batch_size=8, max_queue_delay_us=500), {}, False, False),
        (BatchingSpec(kind="dynamic", max_batch_size=8, preserve_ordering=True), {}, False, False),
        (BatchingSpec(kind="dynamic", max_batch_size=8), {}, True, False),
        (BatchingSpec(kind="dynamic", max_batch_size=8), {"decoupled": True}, False, False),
        (BatchingSpec(kind="sequence"), {"sequence": SequenceSpec()}, False, False),
        (BatchingSpec(kind="ensemble"), {}, False, False),
        # a queue timeout on any level: applied when the batch is formed (r13's F9)
        (
            BatchingSpec(kind="dynamic", max_batch_size=8, default_queue_policy=TIMED),
            {},
            False,
            False,
        ),
        (
            BatchingSpec(
                kind="dynamic",
                max_batch_size=8,
                priority_levels=2,
                priority_queue_policy={2: TIMED},
            ),
            {},
            False,
            False,
        ),
        # a policy without a timeout (a queue bound only) keeps the handoff
        (
            BatchingSpec(
                kind="dynamic",
                max_batch_size=8,
                default_queue_policy=QueuePolicySpec(max_queue_size=4),
            ),
            {},
            False,
            True,
        ),
    ],
)
def test_only_versions_the_scheduler_would_dispatch_at_once_are_eligible(
    batching: BatchingSpec, extra: dict[str, object], rate_limited: bool, ok: bool
) -> None:
    spec = msgspec.structs.replace(model_spec("m", (0,), batching=batching), **extra)
    assert handoff_eligible(spec, rate_limited) is ok


def test_eligibility_is_never_taken_from_another_generation_under_a_reused_id() -> None:
    """A reloaded version's new generation may get the id of the old, freed one: its
    eligibility is its own spec's (a 500 µs delay added by the reload is never bypassed)."""
    from triton_mp.scheduler.direct import Handoffs
    from triton_mp.scheduler.instances import Generation

    nodelay = model_spec("m", (0,), batching=BatchingSpec(kind="dynamic", max_batch_size=8))
    delayed = msgspec.structs.replace(
        nodelay, batching=BatchingSpec(kind="dynamic", max_batch_size=8, max_queue_delay_us=500)
    )
    handoffs = Handoffs(None, None, None, rate_limited=False)  # type: ignore[arg-type]
    old = Generation(nodelay, None)  # type: ignore[arg-type]
    new = Generation(delayed, None)  # type: ignore[arg-type]
    assert handoffs.eligible(old) is True
    handoffs._eligible[id(new)] = handoffs._eligible.pop(id(old))  # as if new took old's id
    assert handoffs.eligible(new) is False
    assert handoffs.eligible(new) is False


# ------------------------------------------------------------------ offers


def test_idle_instances_of_an_eligible_version_are_offered_after_a_pass(h: Harness) -> None:
    h.dispatch()
    assert leases(h).value == {}  # not ready yet
    h.ready(0, 1, 2)
    h.dispatch()
    assert leases(h).value == {0: 1, 1: 1}  # the delayed model's instance 2 is never offered
    h.dispatch()  # offered once, not again
    assert leases(h).value == {0: 1, 1: 1}


def test_a_queued_request_takes_the_offers_back_before_its_batch(h: Harness) -> None:
    h.ready(0, 1)
    h.dispatch()
    req = h.request("nodelay")
    ((instance, batch),) = h.dispatch()
    assert batch.requests == (req,)
    # the instance that got the batch is busy and not offered; the other is offered again
    assert leases(h).value[instance] == 0
    assert leases(h).value[1 - instance] == 1
    h.done(instance, batch)
    h.dispatch()
    assert leases(h).value == {0: 1, 1: 1}


def test_an_instance_a_frontend_holds_gets_no_batch_until_its_own_is_done(h: Harness) -> None:
    h.ready(0, 1)
    h.dispatch()
    assert leases(h).frontend_take(0)
    assert leases(h).frontend_take(1)
    queued = h.request("nodelay")
    assert h.dispatch() == []  # both taken by frontends: nothing to hand the request to
    assert h.core.handoffs.claimed.keys() == {0, 1}
    sent = direct(h, 0, msgspec.structs.replace(queued, request_id=900))
    h.handle(sent)
    assert h.core.lifecycle.instances.get(0).batch is not None  # type: ignore[union-attr]
    assert h.dispatch() == []
    h.clock.advance_us(20)
    h.handle(done(h, 0, sent.batch_id))
    ((instance, batch),) = h.dispatch()
    assert (instance, batch.requests) == (0, (queued,))


def test_a_direct_batch_counts_in_statistics_and_the_batch_log(h: Harness) -> None:
    h.ready(0, 1)
    h.dispatch()
    assert leases(h).frontend_take(0)
    req = msgspec.structs.replace(h.request("delayed"), model="nodelay", arrival_ns=h.now)
    h.clock.advance_us(3)
    sent = direct(h, 0, req)
    h.clock.advance_us(40)  # the scheduler reads it on a later pass
    h.handle(sent)
    h.handle(done(h, 0, sent.batch_id))
    st = h.stats("nodelay")
    assert (st.inference_count, st.execution_count, st.success.count) == (1, 1, 1)
    assert st.queue.ns == 3 * US  # arrival to the frontend's dispatch, not to the pass
    assert st.compute_infer.ns == 5 * US
    (status,) = h.core.queue_status("nodelay", h.now)
    assert status.close_reasons.get("idle") == 1
    assert status.batch_sizes == {1: 1}
    h.dispatch()
    assert leases(h).value[0] == 1  # idle again: offered again


def test_a_batch_done_read_before_its_direct_sent_is_applied_with_it(h: Harness) -> None:
    h.ready(0, 1)
    h.dispatch()
    assert leases(h).frontend_take(1)
    req = msgspec.structs.replace(h.request("delayed"), model="nodelay")
    sent = direct(h, 1, req)
    h.handle(done(h, 1, sent.batch_id))  # the drain reached the worker's ring first
    assert h.stats("nodelay").execution_count == 0
    h.handle(sent)
    assert h.stats("nodelay").execution_count == 1
    assert h.core.lifecycle.instances.get(1).batch is None  # type: ignore[union-attr]
    h.dispatch()
    assert leases(h).value[1] == 1


# ------------------------------------------------------------------ faults and changes


def test_a_worker_that_dies_running_a_direct_batch_fails_its_request(h: Harness) -> None:
    h.ready(0, 1)
    h.dispatch()
    assert leases(h).frontend_take(0)
    req = msgspec.structs.replace(h.request("delayed"), model="nodelay")
    h.handle(direct(h, 0, req))
    h.handle(WorkerDied(instance_id=0, exitcode=-9))
    ((_, failed),) = [(f, m) for f, m in h.failures() if m.request_id == req.request_id]
    assert failed.error.code == ErrorCode.UNAVAILABLE
    assert "died" in failed.error.message
    assert h.stats("nodelay").fail.count == 1
    h.dispatch()
    assert leases(h).value[0] == 0  # a dead instance is not offered


def test_a_direct_sent_for_an_instance_that_died_first_fails_its_request(h: Harness) -> None:
    h.ready(0, 1)
    h.dispatch()
    assert leases(h).frontend_take(0)
    h.handle(WorkerDied(instance_id=0, exitcode=-9))
    h.dispatch()  # the take back fails: a frontend holds it
    req = msgspec.structs.replace(h.request("delayed"), model="nodelay")
    h.handle(direct(h, 0, req))
    ((_, failed),) = [(f, m) for f, m in h.failures() if m.request_id == req.request_id]
    assert failed.error.code == ErrorCode.UNAVAILABLE
    assert failed.error.message == (
        "model instance '0' of 'nodelay' died with exit code -9 while running the request"
    ), failed.error.message
    h.ready(0)  # restarted
    h.dispatch()
    assert leases(h).value[0] == 1


def test_a_retirement_takes_offers_back_and_waits_for_a_claimed_batch(h: Harness) -> None:
    h.ready(0, 1)
    h.dispatch()
    assert leases(h).frontend_take(0)
    h.handle(InstancesRetired(instance_ids=(0, 1)))
    h.dispatch()
    h.dispatch()
    assert leases(h).value == {0: 0, 1: 0}
    stopped = {i for i, m in h.to_workers if isinstance(m, Shutdown)}
    assert stopped == set()  # instance 0 has a frontend's batch on its way
    req = msgspec.structs.replace(h.request("delayed"), model="nodelay")
    sent = direct(h, 0, req)
    h.handle(sent)
    h.dispatch()
    assert {i for i, m in h.to_workers if isinstance(m, Shutdown)} == set()
    h.handle(done(h, 0, sent.batch_id))
    h.dispatch()
    assert {i for i, m in h.to_workers if isinstance(m, Shutdown)} == {0, 1}


def test_a_shutdown_takes_every_offer_back(h: Harness) -> None:
    h.ready(0, 1)
    h.dispatch()
    h.handle(Shutdown())
    h.dispatch()
    assert leases(h).value == {0: 0, 1: 0}


def test_a_claim_never_announced_frees_the_instance_after_the_timeout(h: Harness) -> None:
    h.ready(0)
    h.dispatch()
    assert leases(h).frontend_take(0)  # and the frontend died before its DirectSent
    queued = h.request("nodelay")
    assert h.dispatch() == []
    claimed_at = h.now
    assert h.core.next_deadline_ns() == claimed_at + CLAIM_TIMEOUT_NS
    h.clock.advance_us(CLAIM_TIMEOUT_NS // US - 1)
    assert h.dispatch() == []
    h.clock.advance_us(1)
    h.dispatch()  # the claim expires at the end of this pass
    ((instance, batch),) = h.dispatch()
    assert (instance, batch.requests) == (0, (queued,))


# ------------------------------------------------------------------ the frontend side


@pytest.fixture
def route() -> tuple[DirectRoute, Ring, posix_ipc.Semaphore]:
    base = f"/triton_mp_test_direct_{os.getpid()}"
    ring_name = base + "_r"
    wakeup = create_wakeup("semaphore", base + "_w")
    lease = create_lease(base + "_l")
    ring = Ring.create(ring_name, 1 << 12)
    r = DirectRoute(
        instance_id=4,
        model="m",
        version=1,
        frontend_id=0,
        ring=ring_name,
        wakeup=wakeup,
        lease=lease,
    )
    sem = posix_ipc.Semaphore(wakeup.name)
    yield r, ring, sem
    sem.close()
    ring.close()
    for name in (ring_name, wakeup.name, lease):
        unlink_quietly(name)
        with contextlib.suppress(posix_ipc.Error):
            posix_ipc.unlink_semaphore(name)


def _hand(routes: DirectRoutes, desc: InferRequest) -> bool:
    return routes.hand(desc.model, desc.version, desc.request_id, desc)


def _desc(request_id: int = 7, model: str = "m", params: str = "") -> InferRequest:
    h = Harness(models=())
    req = h.request("m")
    return msgspec.structs.replace(req, request_id=request_id, model=model, parameters_json=params)


def test_hand_takes_an_offered_lease_and_pushes_the_batch(route) -> None:  # type: ignore[no-untyped-def]
    r, ring, wake = route
    notes: list[bytes] = []
    routes = DirectRoutes(0, lambda b: notes.append(b) is None, lambda b: None, lambda: 123)
    routes.update([r, msgspec.structs.replace(r, frontend_id=1, instance_id=5)])
    desc = _desc()
    lease = Lease(r.lease)
    assert not _hand(routes, desc)  # nothing offered
    lease.offer()
    assert _hand(routes, desc)
    assert not lease.offered()  # taken
    assert wake.value == 1  # the worker was woken
    (note,) = notes
    sent = Decoder(DirectSent).decode(note)
    assert (sent.instance_id, sent.dispatch_ns, sent.request) == (4, 123, desc)
    (record,) = ring.pop_all()
    assign = Decoder(BatchAssign).decode(record)
    assert assign.batch_id == sent.batch_id == direct_batch_id(0, 7) < 0
    assert assign.requests == (desc,)
    assert not _hand(routes, _desc(8))  # taken: the next one goes to the scheduler
    assert not _hand(routes, _desc(9, model="other"))  # no route for that model
    routes.update([], remove=[4])
    lease.offer()
    assert not _hand(routes, _desc(10))  # the route is gone
    lease.close()
    routes.close()


def test_hand_leaves_the_lease_for_a_record_too_large_for_the_ring(route) -> None:  # type: ignore[no-untyped-def]
    r, ring, _ = route
    routes = DirectRoutes(0, lambda b: True, lambda b: None)
    routes.update([r])
    lease = Lease(r.lease)
    lease.offer()
    assert not _hand(routes, _desc(params='{"p": "' + "x" * 4000 + '"}'))
    assert lease.offered()  # untouched: the scheduler still offers it
    assert ring.pop_all() == []
    lease.close()
    routes.close()


def test_a_full_scheduler_ring_sends_the_note_with_a_wake_up(route) -> None:  # type: ignore[no-untyped-def]
    r, ring, _ = route
    woke: list[bytes] = []
    routes = DirectRoutes(0, lambda b: False, woke.append)
    routes.update([r])
    lease = Lease(r.lease)
    lease.offer()
    assert _hand(routes, _desc())
    assert len(woke) == 1
    assert len(ring.pop_all()) == 1
    lease.close()
    routes.close()


# ------------------------------------------------------------------ the submit path


class FakeDirect:
    """``DirectRoutes`` that hands over (or not) whatever it is given."""

    def __init__(self, takes: bool) -> None:
        self.takes = takes
        self.offered: list[InferRequest] = []

    def serves(self, model: str, version: int) -> bool:
        return True

    def hand(self, model: str, version: int, request_id: int, wire: InferRequest | bytes) -> bool:
        desc = decode_request(wire)
        assert (desc.model, desc.version, desc.request_id) == (model, version, request_id)
        self.offered.append(desc)
        return self.takes


def _frontend(takes: bool) -> tuple[Frontend, FakeDirect]:
    f = Frontend()
    fake = FakeDirect(takes)
    f.inference = Inference(
        frontend_id=2,
        models=f.models,
        shm=SystemShmRegistry(2),
        arena=f.arena,  # type: ignore[arg-type]
        cache=f.cache,  # type: ignore[arg-type]
        pending=f.pending,
        send_scheduler=f.scheduler.send,
        clock_ns=lambda: 123,
        direct=fake,  # type: ignore[arg-type]
    )
    return f, fake


def test_a_handed_request_skips_the_scheduler_and_is_answered_as_any() -> None:
    async def body() -> None:
        f, fake = _frontend(takes=True)
        ticket = f.inference.submit(_request(id="d1"))
        assert f.scheduler.requests() == []
        (desc,) = fake.offered
        assert (desc.model, desc.client_id, desc.arrival_ns) == ("unary", "d1", 123)
        out = np.array([3, 4], np.float32).tobytes()
        f.deliver(f.worker.answer(desc, {"OUT": out}))
        result = await ticket.result()
        assert result.data(result.outputs[0]) == out
        result.release()
        assert f.arena.live_blocks() == 0

    asyncio.run(body())


def test_a_request_no_instance_takes_goes_to_the_scheduler() -> None:
    f, fake = _frontend(takes=False)
    f.inference.submit(_request())
    assert len(fake.offered) == 1
    assert len(f.scheduler.requests()) == 1


def test_a_traced_request_always_goes_to_the_scheduler() -> None:
    f, fake = _frontend(takes=True)
    trace = Trace(1, None, "unary", "t1", int(TraceLevel.TIMESTAMPS))  # type: ignore[arg-type]
    f.inference.submit(_request(), trace=trace)
    assert fake.offered == []
    assert len(f.scheduler.requests()) == 1


def test_known_requests_of_a_version_with_routes_are_offered_every_time() -> None:
    f, fake = _frontend(takes=False)
    f.inference.submit(_request(id="k"), known_key=b"key")
    raw = [np.array([5, 6], np.float32).tobytes()]
    for _ in range(3):
        assert f.inference.submit_known(b"key", "k", raw) is not None
    assert len(fake.offered) == 4
    assert len(f.scheduler.requests()) == 4
