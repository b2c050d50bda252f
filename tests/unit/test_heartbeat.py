"""The heartbeat board: layout, beats, silence, and the beating thread (no processes)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from triton_mp.ipc.memory.heartbeat import SLOT_BYTES, HeartbeatBoard, start_beating
from triton_mp.ipc.memory.topology import Topology


@pytest.fixture
def board() -> Iterator[HeartbeatBoard]:
    b = HeartbeatBoard.create(Topology(str(os.getpid())).scratch("hb_test"), 4)
    yield b
    b.close()
    b.unlink()


def test_slots_start_silent_and_record_beats(board: HeartbeatBoard) -> None:
    assert board.slots == 4
    assert board.segment.size_bytes == 4 * SLOT_BYTES
    assert [board.last_ns(i) for i in range(4)] == [0, 0, 0, 0]
    board.beat(2, now_ns=5_000_000_000)
    assert board.last_ns(2) == 5_000_000_000
    assert board.last_ns(1) == 0
    # Silence counts from the last beat, or from when judging began if it never beat.
    assert board.silent_for_s(2, since_ns=1, now_ns=7_000_000_000) == 2.0
    assert board.silent_for_s(1, since_ns=6_000_000_000, now_ns=7_000_000_000) == 1.0
    board.reset(2)
    assert board.last_ns(2) == 0


def test_another_mapping_sees_the_beats(board: HeartbeatBoard) -> None:
    other = HeartbeatBoard.attach(board.segment.name)
    try:
        other.beat(3, now_ns=123)
        assert board.last_ns(3) == 123
    finally:
        other.close()


def test_the_beating_thread_keeps_the_slot_fresh(board: HeartbeatBoard) -> None:
    start_beating(board.segment.name, 0, 0.01)
    deadline = time.monotonic() + 10
    while board.last_ns(0) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    first = board.last_ns(0)
    assert first > 0
    while board.last_ns(0) == first and time.monotonic() < deadline:
        time.sleep(0.01)
    assert board.last_ns(0) > first
    assert board.silent_for_s(0, since_ns=0) < 5
