"""The SPSC byte ring (``ipc.memory.ring``) in one process: records, wraparound, fullness, a model.

Every ring a test creates is named ``/triton_mp_<pid>_test_ring<n>`` and unlinked by the
fixture (or the state machine's teardown) that created it.
"""

from __future__ import annotations

import collections
import itertools
import os
import struct
from collections.abc import Callable, Iterator

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from triton_mp.ipc.memory.ring import DATA_OFFSET, HEAD_OFFSET, TAIL_OFFSET, WRAP, Ring, RingFull
from triton_mp.ipc.memory.shm import Segment, unlink_quietly

_names = itertools.count()


def _ring_name() -> str:
    return f"/triton_mp_{os.getpid()}_test_ring{next(_names)}"


def _need(n: int) -> int:
    """Bytes one record of ``n`` payload bytes takes (documented layout: u32 + pad to 8)."""
    return (4 + n + 7) & ~7


def _counters(ring: Ring) -> tuple[int, int]:
    """(tail, head) read straight from the header."""
    tail = struct.unpack_from("<Q", ring.segment.buf, TAIL_OFFSET)[0]
    head = struct.unpack_from("<Q", ring.segment.buf, HEAD_OFFSET)[0]
    return tail, head


@pytest.fixture
def make_ring() -> Iterator[Callable[[int], Ring]]:
    """Factory: ``make_ring(capacity_bytes)``; every ring is closed and unlinked after."""
    rings: list[Ring] = []

    def make(capacity_bytes: int) -> Ring:
        ring = Ring.create(_ring_name(), capacity_bytes)
        rings.append(ring)
        return ring

    yield make
    for ring in rings:
        ring.close()
        unlink_quietly(ring.segment.name)


# --------------------------------------------------------------------------- layout


def test_create_rounds_capacity_up_to_8(make_ring: Callable[[int], Ring]) -> None:
    assert make_ring(100).capacity == 104
    assert make_ring(64).capacity == 64


def test_new_ring_is_empty(make_ring: Callable[[int], Ring]) -> None:
    ring = make_ring(256)
    assert ring.pop_all() == []
    assert ring.pending_bytes() == 0
    assert _counters(ring) == (0, 0)


def test_attach_sees_the_creators_records(make_ring: Callable[[int], Ring]) -> None:
    producer = make_ring(256)
    consumer = Ring.attach(producer.segment.name)
    try:
        assert consumer.capacity == producer.capacity
        producer.push(b"hello")
        assert consumer.pending_bytes() == _need(5)
        assert consumer.pop_all() == [b"hello"]
        # NOTE: head is shared: the producer's view sees the consumer's progress.
        assert producer.pending_bytes() == 0
    finally:
        consumer.close()


def test_attach_rejects_a_segment_that_is_not_a_ring() -> None:
    name = _ring_name()
    seg = Segment.create(name, 4096)
    try:
        with pytest.raises(ValueError, match="not a triton-mp ring"):
            Ring.attach(name)
    finally:
        seg.close()
        seg.unlink()


# --------------------------------------------------------------------------- round trips


def test_empty_record_round_trips(make_ring: Callable[[int], Ring]) -> None:
    ring = make_ring(64)
    ring.push(b"")
    assert ring.pending_bytes() == 8
    assert ring.pop_all() == [b""]


@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 8, 9, 13, 27])
def test_odd_sized_records_round_trip(make_ring: Callable[[int], Ring], n: int) -> None:
    ring = make_ring(256)
    payloads = [bytes([n, i]) * n for i in range(3)]
    payloads = [p[:n] for p in payloads]
    for p in payloads:
        ring.push(p)
    assert ring.pending_bytes() == 3 * _need(n)
    assert ring.pop_all() == payloads


def test_memoryview_payload_round_trips(make_ring: Callable[[int], Ring]) -> None:
    ring = make_ring(256)
    data = bytearray(b"0123456789")
    ring.push(memoryview(data)[2:7])
    assert ring.pop_all() == [b"23456"]


def test_largest_record_that_fits_round_trips(make_ring: Callable[[int], Ring]) -> None:
    ring = make_ring(1024)
    # NOTE: a record may take at most half the data area, so that it always fits an empty
    # ring wherever the tail is: 4 + 508 bytes = 512.
    big = bytes(range(256)) * 2
    big = big[:508]
    ring.push(big)
    assert ring.pop_all() == [big]
    ring.push(big)  # tail now at 512: the second copy also fits, exactly to the end
    assert ring.pop_all() == [big]


def test_large_records_round_trip_in_a_large_ring(make_ring: Callable[[int], Ring]) -> None:
    ring = make_ring(4 << 20)
    payloads = [os.urandom(1 << 20), os.urandom(123_457), b"", os.urandom(1 << 19)]
    for p in payloads:
        ring.push(p)
    assert ring.pop_all() == payloads


@pytest.mark.parametrize(("capacity", "n"), [(1024, 509), (1024, 4096), (64, 29), (64, 1 << 20)])
def test_record_that_can_never_fit_raises_value_error(
    make_ring: Callable[[int], Ring], capacity: int, n: int
) -> None:
    ring = make_ring(capacity)
    with pytest.raises(ValueError, match=f"record of {n} bytes"):
        ring.push(bytes(n))
    assert ring.pending_bytes() == 0
    assert ring.pop_all() == []


def test_value_error_raised_even_when_ring_is_not_empty(make_ring: Callable[[int], Ring]) -> None:
    ring = make_ring(64)
    ring.push(b"a")
    with pytest.raises(ValueError, match="does not fit"):
        ring.push(bytes(64))
    assert ring.pop_all() == [b"a"]


# --------------------------------------------------------------------------- wraparound


def test_wraparound_many_times(make_ring: Callable[[int], Ring]) -> None:
    ring = make_ring(256)
    sizes = itertools.cycle([0, 1, 7, 8, 9, 31, 60, 100, 3, 119])
    expected_tail = 0
    for i in range(2000):
        n = next(sizes)
        payload = (i.to_bytes(4, "little") * 32)[:n]
        pos = expected_tail % ring.capacity
        if _need(n) > ring.capacity - pos:
            expected_tail += ring.capacity - pos
        expected_tail += _need(n)
        ring.push(payload)
        assert ring.pop_all() == [payload]
        assert _counters(ring) == (expected_tail, expected_tail)
    assert expected_tail > 100 * ring.capacity


def test_wraparound_with_several_records_pending(make_ring: Callable[[int], Ring]) -> None:
    ring = make_ring(200)
    seq = 0
    for _ in range(300):
        batch = []
        for _ in range(3):
            payload = seq.to_bytes(8, "little") * (seq % 5)
            seq += 1
            ring.push(payload)
            batch.append(payload)
        assert ring.pop_all() == batch
    assert ring.pending_bytes() == 0


def test_record_that_does_not_fit_before_the_end_wraps_with_a_marker(
    make_ring: Callable[[int], Ring],
) -> None:
    ring = make_ring(64)
    for _ in range(3):
        ring.push(bytes(12))  # 16 bytes each: tail 48, 16 bytes left before the end
    ring.pop_all()
    ring.push(b"x" * 20)  # needs 24: skips the 16 left and lands at the start
    (marker,) = struct.unpack_from("<I", ring.segment.buf, DATA_OFFSET + 48)
    assert marker == WRAP
    assert _counters(ring) == (48 + 16 + 24, 48)
    assert ring.pending_bytes() == 40
    assert ring.pop_all() == [b"x" * 20]
    assert _counters(ring) == (88, 88)


# --------------------------------------------------------------------------- fullness


def test_ring_full_then_recovers_after_pop(make_ring: Callable[[int], Ring]) -> None:
    ring = make_ring(128)
    pushed = []
    for i in range(16):  # 16-byte records: exactly 8 fit
        try:
            ring.push(bytes([i]) * 12)
        except RingFull:
            break
        pushed.append(bytes([i]) * 12)
    assert len(pushed) == 8
    assert ring.pending_bytes() == 128
    with pytest.raises(RingFull):
        ring.push(b"")  # not even an empty record
    assert ring.pending_bytes() == 128  # a refused push changes nothing
    assert ring.pop_all() == pushed
    ring.push(b"again")
    assert ring.pop_all() == [b"again"]


def test_ring_full_while_pending_records_straddle_the_end(
    make_ring: Callable[[int], Ring],
) -> None:
    ring = make_ring(64)
    for _ in range(6):
        ring.push(bytes(4))  # 8 bytes each: tail 48
    ring.pop_all()  # head 48
    for _ in range(3):
        ring.push(b"")  # 8 bytes each at positions 48, 56 and (wrapped) 0
    assert _counters(ring) == (72, 48)
    ring.push(bytes(20))  # 24 bytes at positions [8, 32)
    # pending: 48 bytes; only [32, 48) is free, too small for another 24-byte record
    with pytest.raises(RingFull):
        ring.push(bytes(20))
    assert ring.pop_all() == [b"", b"", b"", bytes(20)]
    ring.push(bytes(20))
    assert ring.pop_all() == [bytes(20)]


def test_skip_to_start_is_counted_as_used_space(make_ring: Callable[[int], Ring]) -> None:
    ring = make_ring(64)
    ring.push(bytes(20))  # 24 bytes at [0, 24)
    ring.pop_all()  # head 24
    ring.push(bytes(20))  # 24 bytes at [24, 48); tail 48, pending 24
    # 40 bytes are free in all, but a 32-byte record would have to skip the 16 bytes left
    # before the end: 24 pending + 16 skipped + 32 > 64.
    with pytest.raises(RingFull):
        ring.push(bytes(28))
    assert ring.pending_bytes() == 24
    assert ring.pop_all() == [bytes(20)]
    ring.push(bytes(28))  # empty ring now: the skip plus the record fit
    assert ring.pop_all() == [bytes(28)]


def test_pop_each_reads_records_in_place_across_the_wrap(
    make_ring: Callable[[int], Ring],
) -> None:
    ring = make_ring(64)
    ring.push(bytes(20))
    ring.pop_all()  # head 24: the next 20-byte record does not fit before the end
    ring.push(b"a" * 12)
    ring.push(b"b" * 20)  # wraps with a marker
    seen: list[type] = []

    def read(view: memoryview) -> bytes:
        seen.append(type(view))
        return bytes(view)

    assert ring.pop_each(read) == [b"a" * 12, b"b" * 20]
    assert seen == [memoryview, memoryview]  # nothing was copied out before ``fn``
    assert ring.pop_each(read) == []
    assert not ring.has_records()


def test_a_record_whose_fn_raises_is_consumed_with_those_before_it(
    make_ring: Callable[[int], Ring],
) -> None:
    ring = make_ring(256)
    for rec in (b"ok", b"bad", b"after"):
        ring.push(rec)

    def read(view: memoryview) -> bytes:
        if bytes(view) == b"bad":
            raise ValueError("undecodable")
        return bytes(view)

    with pytest.raises(ValueError, match="undecodable"):
        ring.pop_each(read)
    assert ring.pop_all() == [b"after"]  # the bad record is not read again


# --------------------------------------------------------------------------- model


class RingModel(RuleBasedStateMachine):
    """Random interleavings of pushes and pop_all against a deque plus the byte accounting
    the module docstring documents (records padded to 8, never split at the end)."""

    def __init__(self) -> None:
        super().__init__()
        self.ring: Ring | None = None
        self.records: collections.deque[bytes] = collections.deque()
        self.tail = 0
        self.head = 0
        self.seq = 0

    @initialize(capacity=st.sampled_from([64, 104, 256, 1000]))
    def create(self, capacity: int) -> None:
        self.ring = Ring.create(_ring_name(), capacity)

    def teardown(self) -> None:
        if self.ring is not None:
            self.ring.close()
            unlink_quietly(self.ring.segment.name)

    @precondition(lambda self: self.ring is not None)
    @rule(n=st.integers(min_value=0, max_value=600))
    def push(self, n: int) -> None:
        ring = self.ring
        assert ring is not None
        self.seq += 1
        payload = (self.seq.to_bytes(4, "little") * (n // 4 + 1))[:n]
        cap = ring.capacity
        need = _need(n)
        if need > cap // 2:
            with pytest.raises(ValueError, match="does not fit"):
                ring.push(payload)
            return
        pos = self.tail % cap
        skip = cap - pos if need > cap - pos else 0
        fits = (self.tail - self.head) + skip + need <= cap
        if not fits:
            with pytest.raises(RingFull):
                ring.push(payload)
            return
        ring.push(payload)
        self.tail += skip + need
        self.records.append(payload)

    @precondition(lambda self: self.ring is not None)
    @rule()
    def pop_all(self) -> None:
        assert self.ring is not None
        assert self.ring.pop_all() == list(self.records)
        self.records.clear()
        self.head = self.tail

    @precondition(lambda self: self.ring is not None)
    @rule()
    def pop_each(self) -> None:
        assert self.ring is not None
        assert self.ring.pop_each(bytes) == list(self.records)
        self.records.clear()
        self.head = self.tail

    @invariant()
    def counters_match(self) -> None:
        if self.ring is None:
            return
        assert _counters(self.ring) == (self.tail, self.head)
        assert 0 <= self.ring.pending_bytes() <= self.ring.capacity


TestRingModel = RingModel.TestCase
TestRingModel.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
