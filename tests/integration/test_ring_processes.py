"""The SPSC ring across two real processes: every record arrives, once, in order.

A spawned producer pushes numbered records of varying sizes into a small ring (so it wraps
and fills many times) and retries on ``RingFull``; this process consumes. The producer is
joined with a timeout and killed in teardown if it is still alive.
"""

from __future__ import annotations

import multiprocessing
import os
import struct
from collections.abc import Iterator
from multiprocessing.process import BaseProcess

import pytest

from triton_mp.ipc.memory.ring import Ring, RingFull
from triton_mp.ipc.memory.shm import unlink_quietly

_SEQ = struct.Struct("<I")
RECORDS = 20_000
JOIN_TIMEOUT_S = 30.0


def _record(i: int) -> bytes:
    """Record ``i``: its number, then ``i % 53`` bytes derived from it."""
    return _SEQ.pack(i) + bytes([i & 0xFF]) * (i % 53)


def _produce(ring_name: str, count: int) -> None:
    """Producer process: push records 0..count-1, retrying while the ring is full."""
    ring = Ring.attach(ring_name)
    try:
        for i in range(count):
            payload = _record(i)
            while True:
                try:
                    ring.push(payload)
                    break
                except RingFull:
                    # NOTE: yield the CPU to the consumer; this is back-pressure, not timing.
                    os.sched_yield()
    finally:
        ring.close()


@pytest.fixture
def ring() -> Iterator[Ring]:
    r = Ring.create(f"/triton_mp_{os.getpid()}_test_ring_procs", 512)
    yield r
    r.close()
    unlink_quietly(r.segment.name)


@pytest.fixture
def spawned() -> Iterator[list[BaseProcess]]:
    """Processes a test starts; joined with a timeout, then killed, at teardown."""
    procs: list[BaseProcess] = []
    yield procs
    for p in procs:
        p.join(JOIN_TIMEOUT_S)
        if p.is_alive():
            p.kill()
            p.join(JOIN_TIMEOUT_S)


@pytest.mark.timeout(120)
def test_producer_process_records_arrive_in_order_and_complete(
    ring: Ring, spawned: list[BaseProcess]
) -> None:
    ctx = multiprocessing.get_context("spawn")
    producer = ctx.Process(target=_produce, args=(ring.segment.name, RECORDS), daemon=True)
    spawned.append(producer)
    producer.start()

    received: list[bytes] = []
    empty_after_exit = 0
    while len(received) < RECORDS:
        got = ring.pop_all()
        if got:
            received.extend(got)
            continue
        if producer.exitcode is not None:
            # NOTE: the producer is gone; one more drain catches records it published last.
            empty_after_exit += 1
            if empty_after_exit > 1:
                break
        os.sched_yield()

    producer.join(JOIN_TIMEOUT_S)
    assert producer.exitcode == 0
    assert len(received) == RECORDS
    numbers = [_SEQ.unpack_from(r)[0] for r in received]
    assert numbers == list(range(RECORDS))
    assert all(r == _record(i) for i, r in enumerate(received))
    assert ring.pop_all() == []
    assert ring.pending_bytes() == 0
