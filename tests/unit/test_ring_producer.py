"""``_native.RingProducer`` (``frontend/native/ring_producer.h``) and ``SharedRing``
(``frontend.native.shared_ring``), the frontend's ring to the scheduler with its pushes in C++
under a lock: the same pushes on a ``Ring`` and on a ``SharedRing`` over two copies of one
ring leave the same bytes and raise the same errors; three producers (two pushing without the
GIL, as the gRPC thread does) lose, tear or reorder no record; ``close`` lets go of the mapping.

Every ring a test creates in shared memory is named ``/triton_mp_<pid>_test_rp<n>`` and unlinked
by the test that created it."""

from __future__ import annotations

import itertools
import os
import struct
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp.frontend.native import shared_ring_attach
from triton_mp.frontend.native.shared_ring import SharedRing
from triton_mp.ipc.channel import Sender
from triton_mp.ipc.memory.notify import create_wakeup
from triton_mp.ipc.memory.ring import (
    DATA_OFFSET,
    QUIET_OFFSET,
    RING_MAGIC,
    RecordTooLarge,
    Ring,
    RingFull,
)
from triton_mp.ipc.memory.shm import unlink_quietly

ATTACH = shared_ring_attach()
pytestmark = pytest.mark.skipif(ATTACH is None, reason="native extension not built")
_names = itertools.count()


def _producer_type() -> type:
    from triton_mp.frontend.native import _native  # type: ignore[attr-defined]

    return _native.RingProducer  # type: ignore[no-any-return]


class FakeSegment:
    """What a ring reads of a ``Segment``: its name, writable mapping and ``close``."""

    def __init__(self, capacity: int) -> None:
        self.name = "/fake"
        self.buf = bytearray(DATA_OFFSET + capacity)
        struct.pack_into("<IIQ", self.buf, 0, RING_MAGIC, 1, capacity)

    def close(self) -> None:
        pass


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 140)),  # a record of n bytes
        st.tuples(st.just("pop"), st.just(0)),  # the consumer takes everything
    ),
    max_size=60,
)


def _push(ring: Ring, payload: bytes) -> str:
    try:
        ring.push(payload)
    except RingFull:
        return "full"
    except RecordTooLarge as e:
        return f"too large: {e}"
    return "pushed"


@settings(max_examples=300, deadline=None)
@given(capacity=st.sampled_from([8, 64, 96, 200, 256, 1024]), ops=OPS)
def test_the_shared_ring_pushes_the_bytes_ring_push_does(
    capacity: int, ops: list[tuple[str, int]]
) -> None:
    py_seg, cc_seg = FakeSegment(capacity), FakeSegment(capacity)
    py = Ring(py_seg)  # type: ignore[arg-type]
    cc = SharedRing(cc_seg, _producer_type())  # type: ignore[arg-type]
    fill = itertools.count(1)
    for op, n in ops:
        if op == "push":
            payload = bytes((next(fill) + i) % 251 for i in range(n))
            assert _push(cc, payload) == _push(py, payload)
        else:
            assert cc.pop_all() == py.pop_all()
        assert cc_seg.buf == py_seg.buf, "every byte of the ring, its header included"
    cc.close()
    py.close()


def test_the_shared_ring_reads_the_quiet_word_and_refuses_a_non_ring() -> None:
    seg = FakeSegment(256)
    ring = SharedRing(seg, _producer_type())  # type: ignore[arg-type]
    ring.set_quiet_word(0b1010)  # NOTE: the consumer's store; the producer reads it
    assert ring.producer.quiet_word() == 0b1010 == ring.quiet_word()
    assert struct.unpack_from("<Q", seg.buf, QUIET_OFFSET)[0] == 0b1010
    ring.close()
    not_a_ring = FakeSegment(256)
    not_a_ring.buf[0:4] = b"XXXX"
    with pytest.raises(ValueError, match="not a triton-mp ring"):
        _producer_type()(not_a_ring)
    short = FakeSegment(256)
    struct.pack_into("<Q", short.buf, 8, 4096)  # NOTE: a capacity past the mapping
    with pytest.raises(ValueError, match="not a triton-mp ring"):
        _producer_type()(short)


def test_close_lets_go_of_the_mapping_and_stops_the_producer() -> None:
    name = f"/triton_mp_{os.getpid()}_test_rp{next(_names)}"
    owner = Ring.create(name, 4096)
    try:
        assert ATTACH is not None
        ring = ATTACH(name)
        assert isinstance(ring, SharedRing)
        ring.push(b"one")
        producer = ring.producer
        ring.close()  # NOTE: mmap.close raises BufferError while the producer exports it
        with pytest.raises(ValueError, match="released"):
            producer.push(b"two")
        assert producer.push_all([b"three"], 0.0) == 0
        assert producer.quiet_word() == 0
        assert owner.pop_all() == [b"one"]
    finally:
        owner.close()
        unlink_quietly(name)


def _record(producer: int, seq: int) -> bytes:
    """Record ``seq`` of ``producer``: its ids, then a body whose bytes say who wrote it."""
    n = 8 + (seq * 37) % 300
    return struct.pack("<II", producer, seq) + bytes([producer * 50 + seq % 50]) * (n - 8)


def test_three_producers_lose_tear_and_reorder_nothing() -> None:
    """Two producers push from C++ without the GIL (``push_all``, as the gRPC thread will),
    the third from Python (``SharedRing.push``), into a ring small enough to fill again and
    again, while a consumer thread pops: every record arrives whole, and each producer's in
    its order. (Without the producer's lock the two C++ loops race on the tail.)"""
    count = 3000
    seg = FakeSegment(4096)
    ring = SharedRing(seg, _producer_type())  # type: ignore[arg-type]
    consumer = Ring(seg)  # type: ignore[arg-type]
    got: list[bytes] = []
    done = threading.Event()
    pushed: dict[int, int] = {}

    def consume() -> None:
        while not done.is_set() or consumer.has_records():
            got.extend(consumer.pop_all())
            time.sleep(0)

    def from_cxx(producer: int) -> None:
        records = [_record(producer, i) for i in range(count)]
        pushed[producer] = ring.producer.push_all(records, 30.0)

    threads = [threading.Thread(target=consume)]
    threads += [threading.Thread(target=from_cxx, args=(p,)) for p in (1, 3)]
    for t in threads:
        t.start()
    for i in range(count):
        record = _record(2, i)
        deadline = time.monotonic() + 30
        while True:
            try:
                ring.push(record)
                break
            except RingFull:
                assert time.monotonic() < deadline
                time.sleep(0)
    for t in threads[1:]:
        t.join()
    done.set()
    threads[0].join()
    ring.close()
    assert pushed == {1: count, 3: count}
    seen = {1: 0, 2: 0, 3: 0}
    for record in got:
        producer, seq = struct.unpack_from("<II", record)
        assert record == _record(producer, seq), "a record arrives whole"
        assert seq == seen[producer], "each producer's records in its order"
        seen[producer] += 1
    assert seen == {1: count, 2: count, 3: count}


def test_a_sender_over_the_shared_ring_sends_as_over_a_ring() -> None:
    name = f"/triton_mp_{os.getpid()}_test_rp{next(_names)}"
    owner = Ring.create(name, 256)
    wakeup = create_wakeup("semaphore", f"/triton_mp_{os.getpid()}_test_rpw{next(_names)}")
    try:
        assert ATTACH is not None
        sender = Sender(name, wakeup, full_timeout_s=0.05, attach=ATTACH)
        sender.send_bytes(b"a" * 40)
        assert sender.push_quiet(b"b" * 40)
        assert sender.push_quiet(b"c" * 100)
        assert not sender.push_quiet(b"e" * 100), "full now"
        with pytest.raises(RecordTooLarge):
            sender.push_quiet(b"d" * 200)
        assert owner.pop_all() == [b"a" * 40, b"b" * 40, b"c" * 100]
        sender.close()
    finally:
        owner.close()
        unlink_quietly(name)
        unlink_quietly(wakeup.name)


def test_the_frontend_sends_to_the_scheduler_over_a_shared_ring() -> None:
    """``frontend.main`` builds its Sender to the scheduler over a ``SharedRing`` where the
    extension is built (every other test passes over a plain ``Ring`` too: this one would not)."""
    from types import SimpleNamespace

    from triton_mp.frontend.main import _to_scheduler

    name = f"/triton_mp_{os.getpid()}_test_rp{next(_names)}"
    owner = Ring.create(name, 4096)
    wakeup = create_wakeup("semaphore", f"/triton_mp_{os.getpid()}_test_rpw{next(_names)}")
    try:
        spec = SimpleNamespace(to_scheduler=SimpleNamespace(ring=name, wakeup=wakeup))
        sender = _to_scheduler(spec)  # type: ignore[arg-type]
        assert isinstance(sender._ring, SharedRing)
        sender.send_bytes(b"request")
        assert owner.pop_all() == [b"request"]
        sender.close()
    finally:
        owner.close()
        unlink_quietly(name)
        unlink_quietly(wakeup.name)
