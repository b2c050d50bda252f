"""A ``BatchDone`` that changes no decision reaches the scheduler without waking it.

The protocol (``ipc.memory.notify``: Dekker's, a fence on each side): a worker pushes its
``BatchDone`` with ``Sender.send_lazy`` (push, fence, read the ring's quiet flag, post only
when it is clear); the scheduler clears a flag, fences, and rechecks its rings before it
sleeps. Checked here on the real ring and semaphore in every interleaving of the two sides'
steps, in a stress run across two processes, and for the scheduler core's choice of which
instances may be quiet (``scheduler.done_wakeups``) and the loop's order (``done_first``).
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Iterator

import pytest

from tests.helpers.ring_channel import ring_channel
from tests.unit.scheduler_harness import DYNAMIC, PLAIN, Harness
from triton_mp.ipc import Inbox, Sender
from triton_mp.ipc.memory.notify import Waiter, Wakeup, fence
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.protocol.messages import BatchDone, DirectSent, StatsQuery, WorkerDied
from triton_mp.scheduler.main import done_first


@pytest.fixture
def channel() -> Iterator[tuple[str, Wakeup]]:
    with ring_channel("quiet", 1 << 16) as made:
        yield made


def test_a_new_ring_asks_for_wake_ups_and_a_quiet_one_gets_none(
    channel: tuple[str, Wakeup],
) -> None:
    ring_name, wakeup = channel
    inbox: Inbox[int] = Inbox(wakeup, [ring_name], int)
    sender = Sender(ring_name, wakeup)
    try:
        assert sender.send_lazy(b"\x01")  # never set quiet: it posts, as send_bytes does
        assert inbox.wait(1.0)
        assert inbox.drain() == [1]
        inbox.set_quiet(ring_name, True)
        assert not sender.send_lazy(b"\x02")
        assert not inbox.wait(0.02)  # no post: the record waits for the next pass
        assert inbox.drain() == [2]
        inbox.set_quiet(ring_name, False)
        assert sender.send_lazy(b"\x03")
        assert inbox.wait(1.0)
        assert inbox.drain() == [3]
    finally:
        sender.close()
        inbox.close()


# The two sides' steps, as the code runs them (``Sender.send_lazy``; ``Router.quiet_done``
# then the loop's recheck before ``Inbox.wait``). The flag starts set (quiet).
PRODUCER = ("push", "read_flag_and_maybe_post")
CONSUMER = ("clear_flag", "recheck_rings")


def _interleavings() -> Iterator[tuple[str, ...]]:
    for where in itertools.combinations(range(4), 2):
        steps: list[str] = []
        p = iter(PRODUCER)
        c = iter(CONSUMER)
        for i in range(4):
            steps.append(next(p) if i in where else next(c))
        yield tuple(steps)


@pytest.mark.parametrize("order", list(_interleavings()), ids="-".join)
def test_no_interleaving_loses_the_wake_up(channel: tuple[str, Wakeup], order: tuple[str]) -> None:
    """Whatever the order, the consumer either finds the record before it sleeps or is
    posted: never asleep with a record it was not told of. Without the recheck, the
    interleavings where the producer reads the flag before it is cleared would lose it."""
    ring_name, wakeup = channel
    consumer_ring = Ring.attach(ring_name)
    producer_ring = Ring.attach(ring_name)
    waiter = Waiter(wakeup)
    waker = Sender(ring_name, wakeup)
    consumer_ring.set_quiet(True)
    found = False
    posted = False
    try:
        for step in order:
            if step == "push":
                producer_ring.push(b"\x07")
            elif step == "read_flag_and_maybe_post":
                fence()
                if not producer_ring.quiet():
                    waiter.wake()
                    posted = True
            elif step == "clear_flag":
                consumer_ring.set_quiet(False)
                fence()
            else:
                found = consumer_ring.has_records()
        woken = waiter.wait(0)  # the sleep: returns at once only when posted
        assert found or woken, f"lost wake-up in {order}"
        assert woken == posted
        read_before_clear = order.index("read_flag_and_maybe_post") < order.index("clear_flag")
        assert posted == (not read_before_clear)
        if read_before_clear:
            assert found  # the recheck alone finds it: without it, this wake-up is lost
    finally:
        waker.close()
        waiter.close()
        consumer_ring.close()
        producer_ring.close()


def test_stress_two_processes_never_lose_a_wake_up(channel: tuple[str, Wakeup]) -> None:
    """A child pushes lazily at random gaps while this process flips the flag at random;
    whenever it sleeps with the flag cleared and nothing found by the recheck, a record
    pushed meanwhile must wake it (a long wait that times out with a record pending is a
    lost wake-up)."""
    ring_name, wakeup = channel
    n = 3000
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            sender = Sender(ring_name, wakeup)
            rnd = random.Random(1)
            for i in range(n):
                sender.send_lazy(bytes([i % 100]))
                gap = rnd.random()
                if gap < 0.3:
                    time.sleep(gap * 1e-4)
            code = 0
        finally:
            os._exit(code)
    inbox: Inbox[int] = Inbox(wakeup, [ring_name], int)
    ring = Ring.attach(ring_name)
    rnd = random.Random(2)
    got = lost = 0
    deadline = time.monotonic() + 60
    try:
        while got < n and time.monotonic() < deadline:
            quiet = rnd.random() < 0.5
            ring.set_quiet(quiet)
            if not quiet:
                fence()
                if inbox.has_pending():
                    got += len(inbox.drain())
                    continue
                if not inbox.wait(2.0) and inbox.has_pending():
                    lost += 1
            else:
                inbox.wait(1e-4)
            got += len(inbox.drain())
    finally:
        _, status = os.waitpid(pid, 0)
        ring.close()
        inbox.close()
    assert os.waitstatus_to_exitcode(status) == 0
    assert got == n
    assert lost == 0


# ------------------------------------------------------------------ the scheduler's side
def test_an_instance_is_quiet_only_while_nothing_waits_for_its_version() -> None:
    h = Harness()
    h.ready(0, 1, 2)
    assert {0, 1} <= h.core.quiet_done()
    # NOTE: instance 2's version is leased to the frontends: its worker re-offers the lease
    # itself while its ring is quiet (ipc.direct.worker_reoffers), so its BatchDone may be.
    assert 2 in h.core.quiet_done()
    for _ in range(4):
        h.request()
    ((iid, batch),) = h.dispatch()  # a preferred batch of 4 left at once
    assert {0, 1} <= h.core.quiet_done()
    h.request()  # queued: a batch forms for the other instance (scheduler.forming)
    assert iid in h.core.quiet_done()  # its BatchDone would only queue one more idle one
    h.request(batch_size=2)  # 3 rows: one more completes the preferred batch of 4
    assert not {0, 1} & h.core.quiet_done()
    h.clock.advance_us(200)
    h.dispatch()
    assert {0, 1} <= h.core.quiet_done()
    h.done(iid, batch)
    assert h.stats("add_sub").execution_count == 1


def test_nothing_is_quiet_while_the_server_stops_or_holds_deferred_requests() -> None:
    h = Harness(models=(DYNAMIC, PLAIN))
    h.ready(0, 1, 2)
    assert h.core.quiet_done()
    h.core.stopping = True
    assert not h.core.quiet_done()
    h.core.stopping = False
    h.core.defer_unknown = True
    h.request(model="not_yet_activated")  # held until its version is known
    assert h.core.deferred
    assert not h.core.quiet_done()


def test_a_drain_is_handled_batch_done_first() -> None:
    done = BatchDone(
        instance_id=0,
        batch_id=1,
        start_ns=0,
        compute_input_ns=0,
        compute_infer_ns=0,
        compute_output_ns=0,
        end_ns=0,
    )
    query = StatsQuery(query_id=1, frontend_id=0)
    died = WorkerDied(instance_id=0, exitcode=-9)
    assert done_first([query, died, done]) == [done, query, died]
    assert done_first([query, died]) == [query, died]
    req = Harness(models=()).request("m")
    sent = DirectSent(instance_id=0, batch_id=-5, dispatch_ns=0, request=req)
    assert done_first([query, sent, died, done]) == [done, sent, query, died]
    single = [query]
    assert done_first(single) is single
