"""``Inbox.wait``'s bounded spin: a record already in a ring is taken without sleeping, the
budget shrinks to nothing when work comes seldom, and grows back when sleeps are short."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.helpers.ring_channel import ring_channel
from triton_mp.ipc import Inbox, Sender
from triton_mp.ipc.channel import SPIN_STEP_S
from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.memory.ring import Ring


@pytest.fixture
def channel() -> Iterator[tuple[str, Wakeup]]:
    with ring_channel("spin", 4096) as made:
        yield made


def test_a_record_pushed_without_a_post_is_found_by_the_spin(
    channel: tuple[str, Wakeup],
) -> None:
    ring_name, wakeup = channel
    spinning: Inbox[int] = Inbox(wakeup, [ring_name], int, spin_max_s=1e-3)
    ring = Ring.attach(ring_name)
    try:
        ring.push(b"\x01")  # published, never announced: only a poll can find it
        t0 = time.monotonic()
        assert spinning.wait(5.0)
        assert time.monotonic() - t0 < 1.0
        assert spinning.drain() == [1]
        # without a spin the same record waits for a post (here: the timeout)
        ring.push(b"\x02")
        plain: Inbox[int] = Inbox(wakeup, [ring_name], int)
        assert not plain.wait(0.05)
        assert plain.drain() == [2]
        plain.close()
    finally:
        ring.close()
        spinning.close()


def test_the_budget_halves_to_nothing_when_idle_and_grows_after_short_sleeps(
    channel: tuple[str, Wakeup],
) -> None:
    ring_name, wakeup = channel
    inbox: Inbox[int] = Inbox(wakeup, [ring_name], int, spin_max_s=64 * SPIN_STEP_S)
    sender = Sender(ring_name, wakeup)
    try:
        for _ in range(8):  # every spin runs out and the sleep after it is long
            assert not inbox.wait(0.01)
        assert inbox._spin_s == 0.0
        t0 = time.monotonic()
        assert not inbox.wait(0.02)  # no spin left: it sleeps the whole timeout
        assert time.monotonic() - t0 >= 0.015
        sender.send(7)  # posted before the wait: a short sleep, so the budget grows back
        assert inbox.wait(1.0)
        assert inbox._spin_s >= SPIN_STEP_S
        assert inbox.drain() == [7]
    finally:
        sender.close()
        inbox.close()


@pytest.mark.parametrize("spin_max_s", [0.0, 1e-3])
def test_one_wake_takes_every_post_and_a_stale_post_does_not_end_a_wait(
    channel: tuple[str, Wakeup], spin_max_s: float
) -> None:
    """Three sends, one wait, one drain: no post is left to end the next wait. A post whose
    record was drained already (its producer posts after it pushes) does not end it either;
    ``wake`` does."""
    ring_name, wakeup = channel
    inbox: Inbox[int] = Inbox(wakeup, [ring_name], int, spin_max_s=spin_max_s)
    sender = Sender(ring_name, wakeup)
    ring = Ring.attach(ring_name)
    try:
        for i in range(3):
            sender.send(i)
        assert inbox.wait(1.0)
        assert inbox.drain() == [0, 1, 2]
        assert inbox.waiter._sem is not None
        assert inbox.waiter._sem.value == 0
        assert not inbox.wait(0.02)
        ring.push(b"\x05")
        assert inbox.drain() == [5]
        inbox.waiter.wake()  # the late post of the record drained above
        t0 = time.monotonic()
        assert not inbox.wait(0.05)
        assert time.monotonic() - t0 >= 0.04
        inbox.wake()
        assert inbox.wait(1.0)
        assert inbox.drain() == []
    finally:
        ring.close()
        sender.close()
        inbox.close()


def test_a_spin_on_posts_lets_an_unannounced_record_wait_and_ends_on_a_post(
    channel: tuple[str, Wakeup],
) -> None:
    """The scheduler's spin (``spin_on_posts``): a record pushed without a post (a request
    for a busy model, a quiet ``BatchDone``) neither ends the spin nor the sleep after it;
    a post does, and the drain then takes both. A stale post (its record drained already)
    does not end it."""
    ring_name, wakeup = channel
    inbox: Inbox[int] = Inbox(wakeup, [ring_name], int, spin_max_s=1e-3, spin_on_posts=True)
    ring = Ring.attach(ring_name)
    sender = Sender(ring_name, wakeup)
    try:
        ring.push(b"\x01")
        assert not inbox.wait(0.05)
        sender.send(2)
        assert inbox.wait(5.0)
        assert inbox.drain() == [1, 2]
        sender.send(3)
        assert inbox.drain() == [3]  # taken by a pass before its post was seen
        assert not inbox.wait(0.05)  # the stale post ends neither the spin nor the sleep
    finally:
        sender.close()
        ring.close()
        inbox.close()
