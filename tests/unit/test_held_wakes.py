"""``frontend.dispatch.wakes.HeldWakes``: sends inside ``held`` push quietly and wake the
scheduler once at the end; outside, or with a full ring, they send and wake as before."""

from __future__ import annotations

import pytest

from triton_mp.frontend.dispatch.wakes import HeldWakes


class FakeRing:
    """Records pushes ("push", data), sends ("send", data) and wakes ("wake",); ``room``
    is how many quiet pushes fit before the ring is full."""

    def __init__(self, room: int = 100) -> None:
        self.room = room
        self.log: list[tuple[object, ...]] = []

    def push_quiet(self, data: bytes) -> bool:
        if not self.room:
            return False
        self.room -= 1
        self.log.append(("push", data))
        return True

    def send_bytes(self, data: bytes) -> None:
        self.log.append(("send", data))

    def wake(self) -> None:
        self.log.append(("wake",))


def wakes(ring: FakeRing) -> HeldWakes:
    return HeldWakes(ring.push_quiet, ring.send_bytes, ring.wake)


def test_outside_held_each_send_wakes() -> None:
    ring = FakeRing()
    w = wakes(ring)
    w.send(b"a")
    w.send(b"b")
    assert ring.log == [("send", b"a"), ("send", b"b")]


def test_inside_held_the_sends_wake_once_at_the_end_of_the_outermost() -> None:
    ring = FakeRing()
    w = wakes(ring)
    with w.held():
        w.send(b"a")
        with w.held():
            w.send(b"b")
        assert ring.log == [("push", b"a"), ("push", b"b")]
    assert ring.log == [("push", b"a"), ("push", b"b"), ("wake",)]
    with w.held():
        pass
    assert len(ring.log) == 3  # NOTE: nothing owed: no wake


def test_a_full_ring_sends_and_wakes_now_and_an_exception_still_wakes() -> None:
    ring = FakeRing(room=1)
    w = wakes(ring)

    def two_sends_then_a_failure() -> None:
        with w.held():
            w.send(b"a")
            w.send(b"b")
            raise RuntimeError

    with pytest.raises(RuntimeError):
        two_sends_then_a_failure()
    assert ring.log == [("push", b"a"), ("send", b"b"), ("wake",)]
