"""The scheduler's batch writer (``scheduler.assign_push``), C (``scheduler/native/assign_push.cc``)
against the Python twins over random input (hypothesis): ``push_assign`` against
``Ring.push(encode(assign))`` over random batches and ring states (the same answer, and every
byte of the two rings equal after each step: a push, a batch it declines, a full ring, a
record too large, the consumer taking records); ``batch_forms`` against ``batch_forms_py``
(the same objects, in order)."""

from __future__ import annotations

import itertools
import os
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp.ipc.memory.ring import HEAD_OFFSET, TAIL_OFFSET, Ring
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BatchDue,
    BlockRef,
    InferRequest,
    ReplyTo,
    Requester,
)
from triton_mp.ipc.recordio.codec import Decoder, encode
from triton_mp.ipc.recordio.records import RequestRecord
from triton_mp.scheduler import assign_push
from triton_mp.scheduler.assign_push import (
    batch_forms,
    batch_forms_py,
    plain_assign,
    push_assign_py,
)
from triton_mp.scheduler.policies.policy import Queued

native = assign_push.native
needs_native = pytest.mark.skipif(
    native is None or not hasattr(native, "push_assign"), reason="_queue_records not built"
)
_names = itertools.count()
_U64 = struct.Struct("<Q")
INT = st.one_of(
    st.integers(0, 300),
    st.integers(-300, -1),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63]),
    st.sampled_from([-32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1]),
)
PAYLOAD = st.one_of(
    st.binary(max_size=600),
    st.sampled_from([0, 255, 256, 65535, 65536]).map(lambda n: bytes([n % 251]) * n),
)
MESSAGE = InferRequest(
    request_id=7,
    reply_to=ReplyTo(Requester.FRONTEND, 0),
    model="m",
    version=1,
    batch_size=1,
    inputs=(),
    outputs=(),
    block=BlockRef("/seg", 0),
    arrival_ns=0,
)


@st.composite
def assigns(draw: st.DrawFn) -> BatchAssign:
    """A random BatchAssign: mostly plain (record bytes only), sometimes with a message, sequence
    slots or released correlation IDs (declined)."""
    n = draw(st.one_of(st.integers(0, 4), st.integers(5, 20), st.sampled_from([15, 16])))
    requests: list[Any] = draw(st.lists(PAYLOAD, min_size=n, max_size=n))
    if requests and draw(st.integers(0, 9)) == 0:
        requests[draw(st.integers(0, len(requests) - 1))] = MESSAGE
    slots: tuple[int, ...] = ()
    released: tuple[int | str, ...] = ()
    if draw(st.integers(0, 9)) == 0:
        slots = tuple(range(len(requests)))
    if draw(st.integers(0, 9)) == 0:
        released = draw(st.sampled_from([(3,), ("a",)]))
    return BatchAssign(
        batch_id=draw(INT),
        requests=tuple(requests),
        dispatch_ns=draw(INT),
        rows=draw(st.one_of(st.just(0), INT)),
        slots=slots,
        released=released,
    )


def _make(capacity: int, at: int) -> tuple[Ring, Ring]:
    pair = []
    for _ in range(2):
        r = Ring.create(f"/triton_mp_{os.getpid()}_test_apush_{next(_names)}", capacity)
        # NOTE: both rings start at the same point of the byte stream (tail == head == at).
        _U64.pack_into(r.segment.buf, TAIL_OFFSET, at)
        _U64.pack_into(r.segment.buf, HEAD_OFFSET, at)
        pair.append(r)
    return pair[0], pair[1]


def _drop(*rs: Ring) -> None:
    for r in rs:
        r.segment.close()
        r.segment.unlink()


def _native_push(ring: Ring, assign: Any) -> bool:
    return native.push_assign(ring.segment.buf, assign)  # type: ignore[no-any-return,union-attr]


@needs_native
@settings(max_examples=100, deadline=None)
@given(
    capacity=st.sampled_from([512, 4096, 20_000, 300_000]),
    at=st.integers(0, 2**40),
    steps=st.lists(st.one_of(assigns(), st.just("take")), min_size=1, max_size=12),
)
def test_native_push_assign_equals_its_python_twin(
    capacity: int, at: int, steps: list[Any]
) -> None:
    ours, twins = _make(capacity, at)
    try:
        for step in steps:
            if step == "take":
                assert ours.pop_all() == twins.pop_all()
                continue
            try:
                encode(step)
            except OverflowError:
                # NOTE: msgspec refuses ints past 64 bits: the caller's encode raises, so C
                # must write nothing (and the test's twin cannot run).
                assert _native_push(ours, step) is False
                continue
            assert _native_push(ours, step) is push_assign_py(twins, step)
            assert bytes(ours.segment.buf) == bytes(twins.segment.buf)
        records = ours.pop_all()
        assert records == twins.pop_all()
        decode = Decoder(BatchAssign).decode
        assert all(plain_assign(decode(r)) for r in records)
    finally:
        _drop(ours, twins)


@needs_native
def test_native_push_assign_writes_msgspecs_bytes_and_declines_the_rest() -> None:
    ours, twins = _make(1 << 16, 0)
    try:
        plain = BatchAssign(batch_id=300, requests=(b"a" * 300, b""), dispatch_ns=2**40)
        assert _native_push(ours, plain) is True
        assert ours.pop_all() == [encode(plain)]
        for n in (15, 16):
            many = BatchAssign(batch_id=n, requests=(b"r",) * n, dispatch_ns=-1)
            assert _native_push(ours, many) is True
            assert ours.pop_all() == [encode(many)]
        for declined in (
            BatchAssign(batch_id=1, requests=(MESSAGE,), dispatch_ns=1),
            BatchAssign(batch_id=1, requests=(b"x",), dispatch_ns=1, slots=(0,), rows=1),
            BatchAssign(batch_id=1, requests=(b"x",), dispatch_ns=1, released=(4,)),
            BatchAssign(batch_id=1, requests=(bytearray(b"x"),), dispatch_ns=1),  # type: ignore[arg-type]
            BatchAssign(batch_id=2**64, requests=(), dispatch_ns=1),
            BatchAssign(batch_id=1, requests=(b"y" * 40_000,), dispatch_ns=1),  # NOTE: > half
            BatchDue(at_ns=5),
        ):
            assert _native_push(ours, declined) is False
        assert ours.pop_all() == []
        with pytest.raises(BufferError):
            native.push_assign(b"read-only", plain)  # type: ignore[union-attr]
        assert native.push_assign(bytearray(256), plain) is False  # type: ignore[union-attr]
    finally:
        _drop(ours, twins)


def _record(raw: bytes) -> RequestRecord:
    return RequestRecord(raw, 1, ReplyTo(Requester.FRONTEND, 0), "m", 1, 1, 0, 0, 0, 0, 0)


def _queued(payload: Any) -> Queued:
    return Queued((None, 0), 1, (), 0, payload, 0, 0, 0, 0, False, 0, False, False)


_payloads = st.one_of(
    st.binary(max_size=40).map(_record), st.just(MESSAGE), st.just("other"), st.binary(max_size=4)
)


@needs_native
@settings(max_examples=100, deadline=None)
@given(payloads=st.lists(_payloads, max_size=20))
def test_native_batch_forms_equals_its_python_twin(payloads: list[Any]) -> None:
    items = tuple(_queued(p) for p in payloads)
    got = native.batch_forms(items)  # type: ignore[union-attr]
    want = batch_forms_py(items)
    assert got == want
    assert [id(x) for part in got for x in part] == [id(x) for part in want for x in part]
    assert batch_forms(items) == want
    assert batch_forms(list(items)) == want


@needs_native
def test_native_batch_forms_leaves_what_it_cannot_read_to_the_twin() -> None:
    rec = _record(b"abc")
    assert native.batch_forms((_queued(rec), rec)) is None  # type: ignore[union-attr]
    assert native.batch_forms((Queued.__new__(Queued),)) is None  # type: ignore[union-attr]
    assert native.batch_forms(()) == ((), ())  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        native.batch_forms([_queued(rec)])  # type: ignore[union-attr]
