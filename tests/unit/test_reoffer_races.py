"""Adversarial interleavings of the worker's lease re-offer (``ipc.direct.worker_reoffers``)
and the scheduler's bookkeeping of it (``scheduler.direct``), process-free on the recording
harness with ``test_direct_handoff``'s fake leases (a second post of a posted lease fails).

The worker's real order of an instance's batches is strict: a frontend can take the lease
only after the worker posted it at the end of the previous batch. The scheduler sees that
order only through its drains, which read the rings one after another (``Inbox.drain``):
with two frontend processes, one drain may hold both frontends' ``DirectSent`` notes for
the same instance in the order of their rings, not of their batches.
"""

from __future__ import annotations

import msgspec
import pytest

from tests.unit import test_direct_handoff
from tests.unit.scheduler_harness import Harness
from tests.unit.test_direct_handoff import direct, done, leases
from tests.unit.test_worker_reoffer import _drain, _only_0, _reoffered, _req
from triton_mp.ipc.protocol.messages import (
    CancelRequest,
    DirectSent,
    InstancesRetired,
    Shutdown,
    direct_batch_id,
)

h = test_direct_handoff.h
"""The harness with fake leases (``test_direct_handoff``'s fixture)."""


def _from_frontend(sent: DirectSent, frontend_id: int) -> DirectSent:
    """``sent`` as frontend ``frontend_id`` would have numbered its batch."""
    return msgspec.structs.replace(
        sent, batch_id=direct_batch_id(frontend_id, sent.request.request_id)
    )


@pytest.mark.parametrize("b_ends", ["in_the_drain", "after_the_drain"])
def test_two_frontends_batches_read_in_ring_order_leave_the_lease_to_the_last_batch(
    h: Harness,
    b_ends: str,
) -> None:
    """Frontend 1 hands batch A; its worker re-offers; frontend 0 takes the lease and
    hands batch B; a third request reaches the scheduler meanwhile (no lease was on
    offer), so B's ``BatchDone`` wakes it without a re-offer. The drain reads frontend 0's
    ring first: B's ``DirectSent`` before A's. The lease is nobody's now (the worker did
    not post it after B), so the queued request must go to the instance at once, not wait
    for a claim to expire (``CLAIM_TIMEOUT_NS``, 1 s). Before ``done_first`` ordered the
    ``DirectSent`` s by ``dispatch_ns`` the scheduler applied A's re-offer last, counted the
    lease as offered, and the request waited that second."""
    _only_0(h)
    assert leases(h).frontend_take(0)
    sent_a = _from_frontend(direct(h, 0, _req(h, 900)), 1)
    end_a = _reoffered(h, sent_a)  # the worker posted the lease, then pushed this
    h.clock.advance_us(50)
    assert leases(h).frontend_take(0)
    sent_b = _from_frontend(direct(h, 0, _req(h, 901)), 0)
    end_b = done(h, 0, sent_b.batch_id)  # the scheduler was woken: no re-offer
    if b_ends == "in_the_drain":
        _drain(h, sent_b, sent_a, end_a, end_b)  # frontend 0's ring, 1's, the worker's
        queued = h.request("nodelay")
    else:
        _drain(h, sent_b, sent_a, end_a)
        queued = h.request("nodelay")
        assert h.dispatch() == []  # instance 0 runs B
        _drain(h, end_b)
    assert leases(h).value == {0: 0}
    ((instance, batch),) = h.dispatch()
    assert (instance, batch.requests) == (0, (queued,))
    st = h.stats("nodelay")
    assert (st.inference_count, st.execution_count) == (2, 2)


def test_a_cancel_reaches_the_worker_of_a_direct_batch_that_waits_for_the_reoffering_one(
    h: Harness,
) -> None:
    """A frontend took the lease the worker re-offered after batch A and handed it B; the
    scheduler read B's ``DirectSent`` before A's ``BatchDone`` (B waits, ``Handoffs._after``).
    The client of B goes away: its cancel must reach the instance, which runs or is about
    to run B (the model's ``is_cancelled()``), as it does for any running request."""
    _only_0(h)
    assert leases(h).frontend_take(0)
    first = direct(h, 0, _req(h, 900))
    h.handle(first)
    end_a = _reoffered(h, first)
    assert leases(h).frontend_take(0)
    second = direct(h, 0, _req(h, 901))
    h.handle(second)
    req = second.request
    cancel = CancelRequest(
        request_id=req.request_id, reply_to=req.reply_to, model=req.model, version=req.version
    )
    h.handle(cancel)
    assert h.to_workers[-1:] == [(0, cancel)]
    assert h.failures() == []
    h.handle(end_a)  # B starts; its worker answers it as the model decides
    inst = h.core.lifecycle.instances.get(0)
    assert inst is not None
    assert inst.batch is not None
    assert inst.batch.batch_id == second.batch_id


@pytest.mark.parametrize("taken", [False, True])
def test_a_lease_reoffered_under_a_stale_quiet_flag_during_a_retirement_is_taken_back(
    h: Harness,
    taken: bool,
) -> None:
    """The worker read its quiet flag before the pass that retired its instance cleared
    it, and posted the lease after its batch. The scheduler learns of that post only from
    the ``BatchDone``: the pass that reads it takes the lease back, or, when a frontend took
    it first, waits for that frontend's batch before it stops the instance; never a stop
    while a handed request is on its way, never a lease left posted for a stopped one."""
    _only_0(h)
    assert leases(h).frontend_take(0)
    sent_a = direct(h, 0, _req(h, 900))
    h.handle(sent_a)
    h.handle(InstancesRetired(instance_ids=(0, 1)))
    h.dispatch()
    end_a = _reoffered(h, sent_a)
    if taken:
        assert leases(h).frontend_take(0)
        sent_b = direct(h, 0, _req(h, 901))
    h.handle(end_a)
    h.dispatch()
    assert leases(h).value == {0: 0}
    if taken:
        assert _stopped(h) == set()  # the frontend's batch is on its way
        h.handle(sent_b)
        h.dispatch()
        assert _stopped(h) == set()
        h.handle(done(h, 0, sent_b.batch_id))
        h.dispatch()
    assert 0 in _stopped(h)
    assert leases(h).value == {0: 0}
    assert h.failures() == []


def _stopped(harness: Harness) -> set[int]:
    return {i for i, m in harness.to_workers if isinstance(m, Shutdown)}
