"""A worker re-offers its instance's lease after a batch (``ipc.direct.worker_reoffers``,
``SelfOffer``) and the scheduler keeps count (``scheduler.direct``: ``batch_ended``, a
``DirectSent`` that waits for the batch whose worker re-offered, a death), process-free.

The scheduler side runs on the recording harness with the fake leases of
``test_direct_handoff`` (which fail a second offer of a posted lease); the worker side on a
real lease semaphore of this process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import msgspec
import posix_ipc
import pytest

from tests.unit import test_direct_handoff
from tests.unit.scheduler_harness import Harness
from tests.unit.test_direct_handoff import direct, done, leases
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.direct import Lease, SelfOffer, create_lease, worker_reoffers
from triton_mp.ipc.protocol.messages import BatchDone, DirectSent, InferRequest, WorkerDied
from triton_mp.scheduler.main import done_first

h = test_direct_handoff.h
"""The harness with fake leases: ``test_direct_handoff``'s fixture, shared by name (an
import of it would shadow every test's ``h`` parameter)."""


def _req(h: Harness, request_id: int) -> InferRequest:
    """A request of ``nodelay`` that no pass queued (a frontend handed it)."""
    req = h.request("delayed")
    return msgspec.structs.replace(req, model="nodelay", request_id=request_id)


def _reoffered(h: Harness, sent: DirectSent) -> BatchDone:
    """The worker posted its lease, then pushed this ``BatchDone``."""
    leases(h).offer(sent.instance_id)
    return msgspec.structs.replace(done(h, sent.instance_id, sent.batch_id), reoffered=True)


def _drain(h: Harness, *msgs: object) -> None:
    """One drain of the scheduler's rings, in the loop's order (``done_first``)."""
    h.deliver(h.core.handle_all(done_first(list(msgs)), h.now))  # type: ignore[arg-type]


def _only_0(h: Harness) -> None:
    """Instance 0 ready and offered (instance 1 of ``nodelay`` never starts)."""
    h.ready(0)
    h.dispatch()
    assert leases(h).value == {0: 1}


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize("quiet", [True, False])
@pytest.mark.parametrize("woken", [True, False])
@pytest.mark.parametrize("rescheduled", [True, False])
def test_a_worker_reoffers_only_while_the_scheduler_has_nothing_to_decide(
    quiet: bool, woken: bool, rescheduled: bool
) -> None:
    assert worker_reoffers(quiet, woken, rescheduled) is (quiet and not woken and not rescheduled)


@pytest.fixture
def lease_name() -> Iterator[str]:
    name = create_lease(f"/triton_mp_test_reoffer_{os.getpid()}")
    yield name
    with contextlib.suppress(posix_ipc.Error):
        posix_ipc.unlink_semaphore(name)


def test_self_offer_posts_the_lease_when_the_rule_says_so(lease_name: str) -> None:
    flags = {"quiet": False, "woken": False}
    offer = SelfOffer(lease_name, lambda: flags["quiet"], lambda: flags["woken"])
    frontend = Lease(lease_name)
    try:
        assert not offer.after_batch(False)  # the scheduler asked for the BatchDone
        assert not frontend.offered()
        flags["quiet"] = True
        assert not offer.after_batch(True)  # rescheduled requests: the scheduler queues them
        flags["woken"] = True
        assert not offer.after_batch(False)  # a pass is due: it decides
        flags["woken"] = False
        assert offer.after_batch(False)
        assert frontend.take()
        assert not frontend.take()
        assert offer.reoffered == 1
    finally:
        frontend.close()
        offer.close()


def test_a_lease_is_never_posted_twice(lease_name: str) -> None:
    """A lease is 0 or 1 (``Lease.offer``): a post on a posted lease, by the scheduler after a
    claim expired or by the worker after a batch, makes none; the worker's re-offer then says
    it did not post (its ``BatchDone`` wakes the scheduler and counts no post)."""
    scheduler, frontend = Lease(lease_name), Lease(lease_name)
    offer = SelfOffer(lease_name, lambda: True, lambda: False)
    try:
        assert scheduler.offer()
        assert not scheduler.offer()
        assert not offer.after_batch(False)
        assert offer.reoffered == 0
        assert frontend.take()
        assert not frontend.take(), "posted once"
        assert offer.after_batch(False)
        assert not scheduler.offer()
        assert frontend.take()
        assert not frontend.take()
    finally:
        for handle in (scheduler, frontend, offer):
            handle.close()


# ------------------------------------------------------------------ the scheduler's count


def test_a_reoffered_lease_counts_as_offered_and_is_never_posted_twice(h: Harness) -> None:
    _only_0(h)
    assert leases(h).frontend_take(0)
    sent = direct(h, 0, _req(h, 900))
    h.handle(sent)
    h.handle(_reoffered(h, sent))
    h.dispatch()  # FakeLeases.offer fails if the pass posted the lease again
    assert leases(h).value == {0: 1}
    assert h.core.handoffs.offered == {0}
    st = h.stats("nodelay")
    assert (st.inference_count, st.execution_count) == (1, 1)


def test_a_batch_done_without_the_reoffer_leaves_the_offer_to_the_pass(h: Harness) -> None:
    _only_0(h)
    assert leases(h).frontend_take(0)
    sent = direct(h, 0, _req(h, 900))
    h.handle(sent)
    h.handle(done(h, 0, sent.batch_id))
    assert 0 not in h.core.handoffs.offered
    h.dispatch()
    assert leases(h).value == {0: 1}


def test_a_direct_sent_read_before_the_reoffering_batch_done_waits_for_it(h: Harness) -> None:
    _only_0(h)
    assert leases(h).frontend_take(0)
    first = direct(h, 0, _req(h, 900))
    h.handle(first)
    bd1 = _reoffered(h, first)  # posted the lease; its BatchDone not read yet
    assert leases(h).frontend_take(0)
    second = direct(h, 0, _req(h, 901))
    h.handle(second)  # the instance still runs `first` here: `second` waits
    assert h.core.lifecycle.instances.get(0).batch.batch_id == first.batch_id  # type: ignore[union-attr]
    h.handle(bd1)
    assert h.core.lifecycle.instances.get(0).batch.batch_id == second.batch_id  # type: ignore[union-attr]
    assert 0 not in h.core.handoffs.offered  # the lease is the second batch's frontend's
    h.handle(_reoffered(h, second))
    h.dispatch()
    assert leases(h).value == {0: 1}
    st = h.stats("nodelay")
    assert (st.inference_count, st.execution_count, st.fail.count) == (2, 2, 0)
    (status,) = h.core.queue_status("nodelay", h.now)
    assert status.batch_sizes == {1: 2}
    assert h.failures() == []


@pytest.mark.parametrize("order", ["in_order", "second_frontend_first"])
def test_a_lazy_backlog_read_in_one_drain_counts_every_batch(h: Harness, order: str) -> None:
    """At c=1 the scheduler sleeps through many batches; a query or a request then reads
    them all in one drain, in whatever order the rings give."""
    _only_0(h)
    sent, ends = [], []
    for rid in range(900, 905):
        assert leases(h).frontend_take(0)
        sent.append(direct(h, 0, _req(h, rid)))
        ends.append(_reoffered(h, sent[-1]))
    if order == "second_frontend_first":
        sent[0], sent[1] = sent[1], sent[0]
    _drain(h, *sent, *ends)
    inst = h.core.lifecycle.instances.get(0)
    assert inst is not None
    assert inst.batch is None
    st = h.stats("nodelay")
    assert (st.inference_count, st.execution_count) == (5, 5)
    h.dispatch()
    assert leases(h).value == {0: 1}
    assert h.core.handoffs.offered == {0}


def test_a_request_queued_meanwhile_takes_the_reoffered_lease_back(h: Harness) -> None:
    _only_0(h)
    assert leases(h).frontend_take(0)
    sent = direct(h, 0, _req(h, 900))
    h.handle(sent)
    queued = h.request("nodelay")  # no lease was on offer for it
    assert h.dispatch() == []  # instance 0 runs the direct batch
    ended = _reoffered(h, sent)  # the worker read the quiet flag before that pass cleared it
    h.handle(ended)
    ((instance, batch),) = h.dispatch()
    assert (instance, batch.requests) == (0, (queued,))
    assert leases(h).value == {0: 0}


def test_a_frontend_that_took_the_reoffered_lease_first_runs_then_the_queue(h: Harness) -> None:
    _only_0(h)
    assert leases(h).frontend_take(0)
    first = direct(h, 0, _req(h, 900))
    h.handle(first)
    queued = h.request("nodelay")
    ended = _reoffered(h, first)
    assert leases(h).frontend_take(0)
    second = direct(h, 0, _req(h, 901))
    h.handle(ended)
    assert h.dispatch() == []  # the take back fails: a frontend holds the lease
    assert 0 in h.core.handoffs.claimed
    h.handle(second)
    h.handle(done(h, 0, second.batch_id))
    ((instance, batch),) = h.dispatch()
    assert (instance, batch.requests) == (0, (queued,))


def test_a_death_fails_the_running_and_the_waiting_direct_batches(h: Harness) -> None:
    _only_0(h)
    assert leases(h).frontend_take(0)
    first = direct(h, 0, _req(h, 900))
    h.handle(first)
    _reoffered(h, first)  # lost with the worker, as is the lease it posted
    assert leases(h).frontend_take(0)
    second = direct(h, 0, _req(h, 901))
    h.handle(second)
    leases(h).offer(0)  # posted after `second`, and its BatchDone lost too
    h.handle(WorkerDied(instance_id=0, exitcode=-9))
    failed = {m.request_id: m.error for _, m in h.failures()}
    assert failed.keys() == {900, 901}
    assert all(e.code == ErrorCode.UNAVAILABLE and "died" in e.message for e in failed.values())
    assert leases(h).value == {0: 0}  # the stray post is taken back
    h.ready(0)  # restarted: offered once
    h.dispatch()
    assert leases(h).value == {0: 1}


def test_a_leased_instance_is_never_quiet_while_its_version_has_queued_requests(
    h: Harness,
) -> None:
    """The rule's premise: a quiet flag tells a leased version's worker that nothing is
    queued for it (``done_wakeups``: such a version never forms a batch for its delay)."""
    _only_0(h)
    assert leases(h).frontend_take(0)
    h.handle(direct(h, 0, _req(h, 900)))
    assert 0 in h.core.quiet_done()
    h.request("nodelay")
    assert h.dispatch() == []  # instance 0 runs the direct batch
    assert 0 not in h.core.quiet_done()


def test_a_reoffer_the_scheduler_took_back_is_not_counted_again_when_its_batch_done_is_read(
    h: Harness,
) -> None:
    """The live hang of id1m / id1m_shm (2026-12-06, /work/notes/reoffer-hang-debug.log):
    the scheduler takes back a post whose BatchDone it has not read yet, then counts that
    post as on offer when it reads the BatchDone, and a later take back fails (a 1 s claim)."""
    _only_0(h)
    assert leases(h).frontend_take(0)
    a = direct(h, 0, _req(h, 900))
    h.handle(a)
    _drain(h, _reoffered(h, a))  # A's re-offer read: counted as on offer
    assert h.core.handoffs.offered == {0}
    assert leases(h).frontend_take(0)  # a frontend takes A's post for B
    b = direct(h, 0, _req(h, 901))
    end_b = _reoffered(h, b)  # B ran; its worker posted again
    assert leases(h).frontend_take(0)  # ... taken for C
    c = direct(h, 0, _req(h, 902))
    end_c = _reoffered(h, c)  # C ran; posted again: on offer, unread
    queued = h.request("nodelay")  # the pass takes the lease back: C's post
    ((inst, batch),) = h.dispatch()
    assert (inst, batch.requests) == (0, (queued,))
    assert leases(h).value == {0: 0}
    _drain(h, b, c, end_b, end_c)  # read late: they wait for the scheduler's batch
    _drain(h, done(h, 0, batch.batch_id))  # it ends: B and C start, and end at once
    assert leases(h).value == {0: 0}
    assert 0 not in h.core.handoffs.offered, "C's post was taken back, yet counted on offer"
