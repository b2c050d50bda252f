"""``_native.known_*`` (``frontend/native/known_submit.h``): a submit copies the raw bytes
into its block without the submitter's lock (Reserve, CopyInputs, Finish), so the 1 MiB copy
of an id1m call holds up neither the Python thread nor the answer thread. A copy held in
flight (``known_submit(..., hold=True)``) shows it: other calls are sent meanwhile, an
un-teaching returns at once and the held call is then left to Python, and ``known_detach`` /
``known_set_arena`` (whose caller unmaps the arena on return) wait for the copy, whose
block is then freed and whose call is left to Python."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.unit.test_known_submit import UNKNOWN, ArenaSegment, Rig, message, native
from triton_mp.frontend.native import input_arena_type
from triton_mp.ipc.tensor_pool import ARENA_HEADER_BYTES, BLOCK_HEADER_BYTES

pytestmark = pytest.mark.skipif(input_arena_type() is None, reason="native extension not built")

FREE, LIVE = 0, 1
"""A block header's state word (``tensor_pool``)."""


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig(arena_bytes=4 * 128)
    try:
        yield r
    finally:
        native().known_release_held()  # NOTE: a failed test leaves no submit held
        r.close()


class Held:
    """A ``known_submit`` held between its reservation and its copy, on its own thread."""

    def __init__(self, body: bytes) -> None:
        self.result: list[Any] = []
        self.thread = threading.Thread(
            target=lambda: self.result.append(native().known_submit(body, 1, True))
        )
        before = native().known_reserved()
        self.thread.start()
        wait_until(lambda: native().known_reserved() == before + 1)

    def release(self) -> Any:
        native().known_release_held()
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.result[0]


def wait_until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.001)


def states(arena: ArenaSegment) -> list[int]:
    return [
        struct.unpack_from("<I", arena.buf, off)[0]
        for off in range(ARENA_HEADER_BYTES, arena.size_bytes, 128)
    ]


def test_other_calls_are_sent_while_a_copy_is_in_flight(rig: Rig) -> None:
    n = native()
    rig.teach([64])
    held = Held(message([b"h" * 64]))
    # NOTE: the submitter's lock is free during the copy: another call goes through whole
    other = n.known_submit(message([b"o" * 64]), 2)
    assert isinstance(other, tuple)
    assert n.known_ids_left() == 999
    sent = held.release()
    assert isinstance(sent, tuple)
    assert (other[0], sent[0]) == (100, 101)  # NOTE: an id is taken when the call is pushed
    offset = sent[2]
    payload = rig.arena_seg.buf[offset + BLOCK_HEADER_BYTES : offset + BLOCK_HEADER_BYTES + 64]
    assert payload == b"h" * 64
    assert len(rig.ring_seg.records()) == 2
    assert n.known_reserved() == 0


def test_a_detach_waits_for_the_copy_in_flight_and_the_call_is_left_to_python(
    rig: Rig,
) -> None:
    n = native()
    rig.teach([64])
    held = Held(message([b"h" * 64]))
    assert states(rig.arena_seg).count(LIVE) == 1
    detach = threading.Thread(target=n.known_detach)
    detach.start()
    detach.join(0.3)
    # NOTE: its caller unmaps the arena on return: never while the copy may write into it
    assert detach.is_alive()
    assert held.release() == UNKNOWN
    detach.join(10)
    assert not detach.is_alive()
    assert states(rig.arena_seg) == [FREE] * 4  # NOTE: freed before the detach returned
    assert rig.ring_seg.records() == []
    assert n.known_reserved() == 0


def test_a_new_arena_waits_for_the_copy_into_the_old_one(rig: Rig) -> None:
    n = native()
    rig.teach([64])
    held = Held(message([b"h" * 64]))
    other = ArenaSegment(4 * 128)
    other_arena = n.InputArena(other)
    switch = threading.Thread(target=n.known_set_arena, args=(other_arena,))
    switch.start()
    switch.join(0.3)
    assert switch.is_alive()
    assert held.release() == UNKNOWN
    switch.join(10)
    assert not switch.is_alive()
    assert states(rig.arena_seg) == [FREE] * 4
    assert states(other) == [FREE] * 4
    assert rig.ring_seg.records() == []


def test_an_unteaching_during_a_copy_returns_at_once_and_the_call_is_left_to_python(
    rig: Rig,
) -> None:
    n = native()
    rig.teach([64])
    held = Held(message([b"h" * 64]))
    n.known_clear()  # NOTE: returns while the copy is in flight (the test would hang else)
    assert held.release() == UNKNOWN
    assert states(rig.arena_seg) == [FREE] * 4
    # NOTE: taught again meanwhile, a call reserved under the old lesson is not sent by it
    rig.teach([64])
    held = Held(message([b"h" * 64]))
    rig.teach([64], lesson=8)
    assert held.release() == UNKNOWN
    assert rig.ring_seg.records() == []
    # NOTE: the lesson taught now sends
    assert n.known_submit(message([b"h" * 64]), 1)[1] == 8
