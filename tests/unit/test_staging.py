"""Staging (``scheduler.staging``): a queued request's batch sent behind the batch its
instance runs, process-free.

The spec rules run on ``stageable`` alone; the rest on the recording harness (the real
``SchedulerCore``) with ``test_direct_handoff``'s fake leases and a one-instance model of the
default scheduler: what is staged and when, what a ``BatchDone`` promotes, the statistics
(a staged request's queue time ends when its worker starts it), ``triton-mp stat``'s view,
the quiet ``BatchDone`` s, cancellation, a worker's death, a refused batch, a retirement and
a worker that re-offered its lease while a batch was staged.
"""

from __future__ import annotations

import msgspec
import pytest

from tests.unit.scheduler_harness import US, Harness, model_spec
from tests.unit.test_direct_handoff import FakeLeases, direct, done
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.memory.ring import RecordTooLarge
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    CancelRequest,
    InferRequest,
    InstancesRetired,
    Shutdown,
    WorkerDied,
)
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    EnsembleSpec,
    ModelVersionSpec,
    QueuePolicySpec,
    SequenceSpec,
)
from triton_mp.ipc.recordio.records import decode_request
from triton_mp.scheduler.instances import Generation
from triton_mp.scheduler.registry import make_policy
from triton_mp.scheduler.staging import stageable

SOLO = model_spec("solo", (5,), max_batch_size=0, batching=BatchingSpec())
"""One instance, the default scheduler: stageable."""
IID = 5


# ------------------------------------------------------------------ the spec rules


def _gen(spec: ModelVersionSpec) -> Generation:
    return Generation(spec, make_policy(spec))


def _batching(**kw: object) -> ModelVersionSpec:
    return msgspec.structs.replace(SOLO, batching=BatchingSpec(**kw))  # type: ignore[arg-type]


_TIMEOUT = QueuePolicySpec(default_timeout_us=1000)


@pytest.mark.parametrize(
    ("spec", "rate_limited"),
    [
        pytest.param(msgspec.structs.replace(SOLO, instance_ids=(5, 6)), False, id="2-instances"),
        pytest.param(_batching(kind="dynamic", max_batch_size=8), False, id="dynamic-batching"),
        pytest.param(_batching(priority_levels=2), False, id="priority-levels"),
        pytest.param(_batching(default_queue_policy=_TIMEOUT), False, id="queue-timeout"),
        pytest.param(
            _batching(default_queue_policy=QueuePolicySpec(max_queue_size=4)),
            False,
            id="max-queue-size",
        ),
        pytest.param(
            _batching(default_queue_policy=QueuePolicySpec(allow_timeout_override=True)),
            False,
            id="timeout-override",
        ),
        pytest.param(_batching(priority_queue_policy={1: _TIMEOUT}), False, id="level-timeout"),
        pytest.param(_batching(preserve_ordering=True), False, id="preserve-ordering"),
        pytest.param(msgspec.structs.replace(SOLO, sequence=SequenceSpec()), False, id="sequence"),
        pytest.param(msgspec.structs.replace(SOLO, decoupled=True), False, id="decoupled"),
        pytest.param(
            msgspec.structs.replace(SOLO, ensemble=EnsembleSpec(steps=())), False, id="ensemble"
        ),
        pytest.param(SOLO, True, id="rate-limiter"),
    ],
)
def test_what_triton_may_change_after_the_batch_left_the_queue_is_never_staged(
    spec: ModelVersionSpec, rate_limited: bool
) -> None:
    """Each rule alone makes a stageable model unstageable (the module docstring's list)."""
    assert stageable(_gen(SOLO), False)
    assert not stageable(
        Generation(spec, make_policy(SOLO)) if spec.ensemble else _gen(spec), rate_limited
    )


# ------------------------------------------------------------------ the core


@pytest.fixture
def h() -> Harness:
    h = Harness(models=(SOLO,))
    h.leases = FakeLeases()  # type: ignore[attr-defined]
    h.core.handoffs.leases = h.leases  # type: ignore[attr-defined]
    h.ready(IID)
    h.dispatch()
    assert h.leases.value == {IID: 1}, "idle: offered; the first request takes it back"  # type: ignore[attr-defined]
    return h


def _req(h: Harness) -> InferRequest:
    return h.request("solo", width=4)


def _ids(sent: list[tuple[int, BatchAssign]]) -> list[list[int]]:
    return [[decode_request(r).request_id for r in m.requests] for _, m in sent]


def _end(h: Harness, batch: BatchAssign, start_ns: int | None = None, **kw: object) -> None:
    msg = msgspec.structs.replace(done(h, IID, batch.batch_id), **kw)  # type: ignore[arg-type]
    if start_ns is not None:
        msg = msgspec.structs.replace(msg, start_ns=start_ns)
    h.handle(msg)


def _instance_view(h: Harness) -> tuple[int, int, int]:
    (m,) = h.core.queue_status("solo", h.now)
    (inst,) = m.instances
    return inst.batches_in_flight, inst.requests_in_flight, inst.waiting_requests


def test_a_request_queued_behind_a_running_batch_is_sent_behind_it_at_once(h: Harness) -> None:
    a, b = _req(h), _req(h)
    sent = h.dispatch()
    assert _ids(sent) == [[a.request_id], [b.request_id]], "A runs, B staged"
    assert IID not in h.core.pass_words(1).quiet, "A's BatchDone wakes: no re-offer"
    c = _req(h)
    assert h.dispatch() == [], "C queued"
    assert _instance_view(h) == (2, 2, 1)
    h.clock.advance_us(50)
    _end(h, sent[0][1])
    again = h.dispatch()
    assert _ids(again) == [[c.request_id]], "B promoted, C staged behind it"
    assert _instance_view(h) == (2, 2, 1)
    _end(h, sent[1][1])
    _end(h, again[0][1])
    assert h.dispatch() == []
    assert _instance_view(h) == (0, 0, 0)
    st = h.stats("solo")
    assert (st.inference_count, st.execution_count) == (3, 3)
    assert h.core.idle()


def test_a_staged_request_is_queued_until_its_worker_starts_it(h: Harness) -> None:
    a, b = _req(h), _req(h)
    first, second = (m for _, m in h.dispatch())
    h.clock.advance_us(300)
    _end(h, first)
    started = h.now + 7 * US
    h.clock.advance_us(100)
    _end(h, second, start_ns=started)
    st = h.stats("solo")
    assert st.queue.count == 2
    assert st.queue.ns == (first.dispatch_ns - a.arrival_ns) + (started - b.arrival_ns)


def test_nothing_is_staged_while_a_frontend_s_batch_waits_for_the_instance(h: Harness) -> None:
    """The worker re-offered its lease after A (its ``BatchDone`` not read yet) and a frontend
    handed it C, which waits here for A: a queued request runs after C, not staged before."""
    _req(h)
    (a,) = (m for _, m in h.dispatch())
    h.leases.value[IID] = 1  # type: ignore[attr-defined]  # NOTE: the worker's post
    assert h.leases.frontend_take(IID)  # type: ignore[attr-defined]
    c = _req(h)
    h.core.lifecycle.active[("solo", 1)].policy.cancel((c.reply_to, c.request_id))
    sent = direct(h, IID, c)
    h.handle(sent)
    assert h.core.handoffs.holds(IID)
    r = _req(h)
    assert h.dispatch() == [], "C goes first"
    _end(h, a, reoffered=True)
    h.handle(done(h, IID, sent.batch_id))
    assert _ids(h.dispatch()) == [[r.request_id]]


def test_nothing_is_staged_behind_a_frontend_s_direct_batch(h: Harness) -> None:
    """A direct batch came through a frontend's ring, which the worker may read after the
    scheduler's: a batch staged behind it could run first."""
    h.leases.value[IID] = 1  # type: ignore[attr-defined]
    assert h.leases.frontend_take(IID)  # type: ignore[attr-defined]
    req = msgspec.structs.replace(_req(h), model="solo")
    h.core.lifecycle.active[("solo", 1)].policy.cancel((req.reply_to, req.request_id))
    h.handle(direct(h, IID, req))
    _req(h)
    assert h.dispatch() == []


def test_nothing_is_staged_on_a_retiring_version_and_its_retirement_waits_for_both(
    h: Harness,
) -> None:
    _req(h), _req(h), _req(h)
    first, second = (m for _, m in h.dispatch())
    h.handle(InstancesRetired(instance_ids=(IID,)))
    h.dispatch()
    _end(h, first)
    assert h.dispatch() == [], "the third runs after, on the retiring instance, not staged"
    assert not any(isinstance(m, Shutdown) for _, m in h.to_workers)
    _end(h, second)
    (third,) = (m for _, m in h.dispatch())
    _end(h, third)
    assert h.stats("solo").execution_count == 3
    h.dispatch()
    h.dispatch()
    assert any(isinstance(m, Shutdown) for _, m in h.to_workers)


def test_a_cancelled_staged_request_goes_to_its_worker_like_a_running_one(h: Harness) -> None:
    _req(h)
    b = _req(h)
    h.dispatch()
    h.handle(CancelRequest(request_id=b.request_id, reply_to=b.reply_to, model="solo", version=1))
    assert h.failures() == [], "not 'cancelled before it was scheduled': it left the queue"
    assert any(isinstance(m, CancelRequest) for i, m in h.to_workers if i == IID)


def test_a_worker_dead_before_its_staged_batch_gives_it_back_to_the_queue_front(
    h: Harness,
) -> None:
    a, b, c = _req(h), _req(h), _req(h)
    h.dispatch()
    h.handle(WorkerDied(instance_id=IID, exitcode=-9))
    ((_, failed),) = h.failures()
    assert failed.request_id == a.request_id
    assert failed.error.code == ErrorCode.UNAVAILABLE
    assert _instance_view(h) == (0, 0, 0)
    assert h.dispatch() == []
    h.ready(IID)
    assert _ids(h.dispatch()) == [[b.request_id], [c.request_id]], "B first, as if queued"


def test_a_staged_batch_given_back_by_a_death_counts_once_in_stat_s_batch_log(
    h: Harness,
) -> None:
    """``triton-mp stat``'s histogram counts formed batches: B, staged when A's worker died,
    never ran; formed again on the restarted instance, it counts once (before: twice, while
    Triton's statistics count each batch once)."""
    _req(h)
    b, c = _req(h), _req(h)
    h.dispatch()
    h.handle(WorkerDied(instance_id=IID, exitcode=-9))
    (m,) = h.core.queue_status("solo", h.now)
    assert m.batch_sizes == {1: 1}, "A ran (and failed); B is queued again"
    assert [r.requests for r in m.recent_batches] == [1]
    h.ready(IID)
    assert _ids(h.dispatch()) == [[b.request_id], [c.request_id]]
    (m,) = h.core.queue_status("solo", h.now)
    assert m.batch_sizes == {1: 3}, "A, B and C, once each"
    assert sum(m.close_reasons.values()) == 3
    assert len(m.recent_batches) == 3


def test_a_worker_dead_in_a_promoted_batch_fails_it_as_running(h: Harness) -> None:
    _req(h)
    b = _req(h)
    first, _second = (m for _, m in h.dispatch())
    _end(h, first)
    h.handle(WorkerDied(instance_id=IID, exitcode=-9))
    ((_, failed),) = h.failures()
    assert failed.request_id == b.request_id


def test_a_refused_staged_batch_fails_alone_and_the_running_one_goes_on(h: Harness) -> None:
    def refuse_second(i: int, m: object) -> None:
        if isinstance(m, BatchAssign) and m.batch_id > 1:
            raise RecordTooLarge("too large")
        h.to_workers.append((i, m))

    h.send_worker = refuse_second
    _req(h)
    b = _req(h)
    (sent,) = h.dispatch()
    ((_, failed),) = h.failures()
    assert failed.request_id == b.request_id
    assert failed.error.code == ErrorCode.RESOURCE_EXHAUSTED
    inst = h.core.lifecycle.instances.get(IID)
    assert inst is not None
    assert inst.batch is not None
    assert inst.behind is None
    assert inst.batch.batch_id == sent[1].batch_id
    h.send_worker = lambda i, m: h.to_workers.append((i, m))
    c = _req(h)
    assert _ids(h.dispatch()) == [[c.request_id]], "staged behind the running one, not sent idle"
    assert _instance_view(h) == (2, 2, 1)


@pytest.mark.parametrize("sent_first", [True, False])
@pytest.mark.parametrize("order", ["BC", "CB"])
def test_a_lease_re_offered_by_the_worker_with_a_batch_staged_waits_for_it(
    h: Harness, sent_first: bool, order: str
) -> None:
    """The worker read its ring's quiet flag before the pass that staged cleared it: it posts
    its lease after A, a frontend hands it C (its ``DirectSent`` read before or after A's
    ``BatchDone``), and the worker runs C after B or before it: each batch ends once, B
    runs before C here, and the lease is counted."""
    _req(h), _req(h)
    a, b = (m for _, m in h.dispatch())
    h.leases.value[IID] = 1  # type: ignore[attr-defined]  # NOTE: the worker's post
    assert h.leases.frontend_take(IID)  # type: ignore[attr-defined]
    c = _req(h)
    h.core.lifecycle.active[("solo", 1)].policy.cancel((c.reply_to, c.request_id))
    sent = direct(h, IID, c)
    if sent_first:
        h.handle(sent)
    _end(h, a, reoffered=True)
    if not sent_first:
        h.handle(sent)
    inst = h.core.lifecycle.instances.get(IID)
    assert inst is not None
    assert inst.batch is not None
    assert inst.batch.batch_id == b.batch_id, "B runs; C waits for it"
    if order == "BC":
        _end(h, b)
        h.handle(done(h, IID, sent.batch_id))
    else:
        h.handle(done(h, IID, sent.batch_id))
        _end(h, b)
    h.dispatch()
    st = h.stats("solo")
    assert (st.inference_count, st.execution_count) == (3, 3)
    assert inst.batch is None
    assert inst.behind is None
    assert h.core.handoffs.claimed == {}
    r = _req(h)
    assert _ids(h.dispatch()) == [[r.request_id]], "the instance is free, the lease counted"


def test_a_batch_staged_behind_a_promoted_one_goes_back_to_the_queue_on_a_death(
    h: Harness,
) -> None:
    """A promoted batch keeps its instance busy in the policy: the next request is staged
    (not handed to the instance as idle), so a death gives it back to the queue."""
    _req(h), _req(h)
    first, _second = (m for _, m in h.dispatch())
    _end(h, first)
    c = _req(h)
    assert _ids(h.dispatch()) == [[c.request_id]]
    h.handle(WorkerDied(instance_id=IID, exitcode=-9))
    assert len(h.failures()) == 1, "B failed as running"
    h.ready(IID)
    assert _ids(h.dispatch()) == [[c.request_id]], "C runs on the restarted instance"
