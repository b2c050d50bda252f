"""The scheduler's compiled drain of a ring (``pop_records`` in ``ipc/native/ring_records.cc``,
``Ring.pop_native``) against ``Ring.pop_each`` with the inbox's decoder: the same records
(REQUEST records read by the C header reader, everything else by the Python decoder), the
same head, across wrap-arounds; a decoder error consumes its record and propagates, as in
``pop_each``; fuzzed records (corrupt requests, random bytes) read alike or fail alike
(run once under ASan/UBSan)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_request_decoder_native import _random_request
from triton_mp.ipc import channel
from triton_mp.ipc.memory.ring import HEAD_OFFSET, Ring, RingFull
from triton_mp.ipc.memory.shm import unlink_quietly
from triton_mp.ipc.protocol.messages import (
    BatchDone,
    CancelRequest,
    ReplyTo,
    Requester,
    ToScheduler,
)
from triton_mp.ipc.recordio.codec import Decoder, encode
from triton_mp.ipc.recordio.records import RequestRecord, encode_request

pop_records = channel._POP_RECORDS
pytestmark = pytest.mark.skipif(
    pop_records is None,
    reason="ipc._request_decoder not built (python setup.py build_ext --inplace)",
)
SLOTS = (
    "raw", "request_id", "reply_to", "model", "version", "batch_size", "arrival_ns",
    "priority", "timeout_us", "sequence_id", "sequence_flags",
)  # fmt: skip
_names = count()


@contextmanager
def two_rings(capacity: int) -> Iterator[tuple[Ring, Ring]]:
    """Two new rings of ``capacity`` bytes, unlinked at the end."""
    names = [f"/triton_mp_{os.getpid()}_test_pop_{next(_names)}" for _ in range(2)]
    rings = [Ring.create(n, capacity) for n in names]
    try:
        yield rings[0], rings[1]
    finally:
        for ring, name in zip(rings, names, strict=True):
            ring.close()
            unlink_quietly(name)


def _seen(item: Any) -> Any:
    """What a popped item says (a RequestRecord has no equality of its own)."""
    if type(item) is RequestRecord:
        return ("record", *(getattr(item, s) for s in SLOTS))
    return item


def _pop(ring: Ring, native: bool, fn: Callable[[memoryview], Any]) -> Any:
    """The items popped (as ``_seen``) or the error's type, and the head after."""
    try:
        got: Any = [
            _seen(i) for i in (ring.pop_native(pop_records, fn) if native else ring.pop_each(fn))
        ]
    except Exception as e:  # noqa: BLE001 - compared by type
        got = type(e)
    return got, ring._head[0]


def _request(seed: int) -> bytes:
    data = encode_request(_random_request(random.Random(seed)))
    assert data is not None
    return data


def _corrupt(data: bytes, rnd: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        buf[rnd.randrange(min(len(buf), 120))] = rnd.randrange(256)
    if rnd.random() < 0.3:
        del buf[rnd.randrange(len(buf)) :]
    return bytes(buf)


REPLY = ReplyTo(Requester.FRONTEND, 0)


def _records(kinds: list[int], seed: int) -> list[bytes]:
    """Ring records of the kinds a scheduler's inbox sees (and some it must survive)."""
    rnd = random.Random(seed)
    out = []
    for i, kind in enumerate(kinds):
        if kind == 0:
            out.append(_request(seed * 1000 + i))
        elif kind == 1:
            out.append(
                encode(
                    BatchDone(
                        instance_id=i,
                        batch_id=i,
                        start_ns=1,
                        compute_input_ns=0,
                        compute_infer_ns=0,
                        compute_output_ns=0,
                        end_ns=2,
                    )
                )
            )
        elif kind == 2:
            out.append(encode(CancelRequest(reply_to=REPLY, request_id=i, model="m", version=1)))
        elif kind == 3:
            out.append(_corrupt(_request(seed * 1000 + i), rnd))
        else:
            out.append(bytes([0xC1, 1]) + rnd.randbytes(rnd.randrange(0, 200)))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    seed=st.integers(0, 10_000),
    per_pop=st.integers(1, 12),
)
def test_a_native_drain_reads_what_pop_each_reads(
    kinds: list[int], seed: int, per_pop: int
) -> None:
    decode = Decoder(ToScheduler).decode_buffer
    with two_rings(4096) as (python, native):
        pending = [r for r in _records(kinds, seed) if python.fits(len(r))]
        while pending:
            pushed = 0
            for rec in pending[:per_pop]:
                try:
                    python.push(rec)
                except RingFull:
                    break
                native.push(rec)
                pushed += 1
            pending = pending[pushed:]
            # NOTE: a decoder error leaves the records after it for the next pop.
            for _ in range(per_pop + 1):
                assert _pop(native, True, decode) == _pop(python, False, decode)
            assert python._head[0] == python._tail[0] == native._head[0]


def test_requests_are_read_in_c_and_the_rest_by_the_decoder() -> None:
    seen: list[bytes] = []
    decode = Decoder(ToScheduler).decode_buffer

    def fallback(view: memoryview) -> Any:
        seen.append(bytes(view))
        return decode(view)

    records = _records([0, 1, 0, 2, 0], 7)
    with two_rings(4096) as (ring, _):
        for rec in records:
            ring.push(rec)
        got = ring.pop_native(pop_records, fallback)
    assert [type(g) for g in got] == [
        RequestRecord,
        BatchDone,
        RequestRecord,
        CancelRequest,
        RequestRecord,
    ]
    assert seen == [records[1], records[3]]  # NOTE: the requests never reached Python


def test_a_failing_record_is_consumed_with_those_before_it() -> None:
    calls = 0

    def fallback(view: memoryview) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise msgspec.DecodeError("the second")
        return bytes(view)

    records = [b"a", _request(1), b"bb", b"ccc"]
    with two_rings(4096) as (ring, _):
        for rec in records:
            ring.push(rec)
        with pytest.raises(msgspec.DecodeError, match="the second"):
            ring.pop_native(pop_records, fallback)
        assert ring.pop_native(pop_records, fallback) == [b"ccc"]


def test_a_kept_view_is_released_after_its_call() -> None:
    kept: list[memoryview] = []
    with two_rings(4096) as (ring, _):
        ring.push(b"payload")
        ring.pop_native(pop_records, kept.append)
    with pytest.raises(ValueError, match="released"):
        bytes(kept[0])


def test_a_buffer_that_is_not_a_ring_of_that_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="not a ring"):
        pop_records(bytearray(100), 64, bytes)
    with pytest.raises(ValueError, match="not a ring"):
        pop_records(bytearray(HEAD_OFFSET + 64 + 200), 512, bytes)
    with pytest.raises(BufferError):
        pop_records(bytes(4096), 1024, bytes)  # NOTE: read-only: the head cannot be stored
