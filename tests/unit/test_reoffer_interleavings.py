"""The worker's lease re-offer with two frontend processes, interleaved step by step
(``tests.unit.reoffer_world``: the real scheduler core, a model of the lease, the worker, two
frontends and the scheduler's ring reads), process-free.

Every schedule ends with the scheduler reading everything left (``World.finish``) and must
leave: every request counted once, no claim on the lease expired (the 1 s stall of
``CLAIM_TIMEOUT_NS``), no batch handed to an instance already handed one, the lease posted
exactly when the scheduler counts it offered, and (``World._count_agrees``, after every step
of the scheduler) never more than one post counted, the offered set and the count agreeing.

On 606e1f3^ (a set of offered leases instead of ``Handoffs._posts``) the random schedules
failed in about 5 in 100; the exhaustive search over one request per frontend (3,527 states)
found a failing schedule there and none on the count.
"""

from __future__ import annotations

import random

import pytest

from tests.unit.reoffer_world import World


def _run(world: World, schedule: str) -> World:
    for step in schedule.split():
        assert world.step(step), step
    return world


def test_a_drain_preempted_while_a_batch_runs_and_another_is_handed_reads_them_reversed() -> None:
    """r7's case. The scheduler reads frontend 0's ring (empty), and is preempted: frontend 0
    hands batch A (the lease the scheduler offered), A runs and its worker re-offers, frontend
    1 takes that lease for B. The drain then reads frontend 1's ring: B's ``DirectSent``
    before A's, which the next drain reads, while the instance already runs B here (A ran
    before it). A request of frontend 0 follows. Nothing may wait for a claim to expire,
    and the lease is the count's. On 606e1f3^ the scheduler kept A's re-offer as on offer
    after B had taken it ("lease 0, offered {0}"), and the request waited 1 s."""
    w = _run(World(requests=(2, 1)), "f0 f0 f1 read f0 f0 run+ f1 f1 read read read read")
    assert w.drains == [[w.taken[1]]]  # B read, A not yet
    inst = w.h.core.lifecycle.instances.get(0)
    assert inst is not None
    assert inst.batch is not None
    assert inst.batch.batch_id == w.taken[1]
    _run(w, "done read read read read read")  # A's DirectSent and BatchDone read
    assert w.read_late()
    assert inst.batch is not None
    assert inst.batch.batch_id == w.taken[1], "A ended, B runs"
    w.finish()
    assert w.check() == []
    st = w.h.stats("nodelay")
    assert (st.inference_count, st.execution_count) == (3, 3)


def test_a_reversed_drain_with_a_request_queued_meanwhile_gives_it_the_instance_at_once() -> None:
    """As above, B's worker does not re-offer (a request woke the scheduler): once B ends the
    request runs on the instance on the next pass, with no claim (``CLAIM_TIMEOUT_NS``)."""
    w = _run(
        World(requests=(2, 1)),
        "f0 f0 f1 read f0 f0 run+ f1 f1 read read read read "  # B read before A
        "done f1 f0 f0 run- done",  # A's BatchDone, B handed, a request sent, B ran
    )
    assert w.lease.value == {0: 0}
    _run(w, "read read read read read")  # the request, A's DirectSent, both BatchDones
    assert w.read_late()
    assert w.h.core.handoffs.claimed == {}
    assert [b.batch_id >= 0 for b in w.inbox] == [True], "the request went to the instance"
    w.finish()
    assert w.check() == []


@pytest.mark.parametrize("requests", [(1, 1), (2, 1), (2, 2), (3, 3)])
def test_random_interleavings_leave_the_lease_and_the_count_in_agreement(
    requests: tuple[int, int],
) -> None:
    """Seeded random schedules: the scheduler reads (``read``) one time in three, so the
    frontends and the worker race it."""
    rnd = random.Random(sum(requests))
    for _ in range(150):
        w = World(requests=requests)
        for _ in range(12 * sum(requests)):
            moves = w.moves()
            if len(moves) > 1 and rnd.random() > 0.3:
                moves = moves[:-1]
            w.step(rnd.choice(moves))
        w.finish()
        assert w.check() == [], (requests, w.taken, w.drains)


def test_every_interleaving_of_one_request_per_frontend() -> None:
    """Exhaustive: every schedule of one request per frontend, states merged (``World.key``)."""
    seen: dict[tuple[object, ...], tuple[str, ...]] = {World().key(): ()}
    settled = 0
    frontier: list[tuple[str, ...]] = [()]
    while frontier:
        nxt = []
        for path in frontier:
            for move in _run(World(), " ".join(path)).moves():
                w = _run(World(), " ".join((*path, move)))
                k = w.key()
                if k in seen:
                    continue
                seen[k] = (*path, move)
                nxt.append((*path, move))
                assert w.errors == [], (*path, move)
                if w.settled():
                    settled += 1
                    w.finish()
                    assert w.check() == [], (*path, move)
        frontier = nxt
    assert len(seen) > 3000
    assert settled


@pytest.mark.parametrize(
    "schedule",
    [
        # NOTE: the worker's re-offer after the request's batch finds the late batch's post.
        "f1 f1 f1 f0 f1 f0 run+ read done read read f0 read f0 read read wait "
        "read f0 f0 run+ done read read read read read read read read run+ done",
        # NOTE: the scheduler's offer after the late batch finds its worker's post.
        "f1 f0 f1 f1 f0 read f1 read run+ done read f0 read f0 read read f0 f0 wait "
        "run- read done read read read read read read read read run+ done",
    ],
)
def test_a_claim_that_expires_before_its_direct_sent_is_read_leaves_the_lease_posted_once(
    schedule: str,
) -> None:
    """The scheduler took the lease back for a queued request and found a frontend held it
    (a claim); its next pass ran ``CLAIM_TIMEOUT_NS`` later (``wait``: the scheduler or that
    frontend stalled), gave the instance to its policy and forgot the post the frontend had
    taken (``Handoffs._expire_claims``), and the frontend's ``DirectSent``, read after, took
    it off the count again. With the count one short, a post was made on a posted lease: a
    value of 2, two frontends could each hand the instance a batch. ``ipc.direct.Lease.offer``
    posts only a lease that is not posted, and ``SelfOffer`` then sends a ``BatchDone`` that
    wakes the scheduler and counts no post."""
    w = _run(World(requests=(2, 1)), schedule)
    w.finish()
    assert w.check() == []
    assert w.lease.value == {0: 1}
    assert 0 in w.h.core.handoffs.offered
