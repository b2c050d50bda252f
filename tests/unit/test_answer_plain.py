"""One frontend's plain batch answered in one C call (``_answer_writer.answer_plain``: the
test of ``answering._one_frontend``, the writer, the push into the frontend's ring) and its
ring push (``push_record``, ``ipc/native/ring_push.h``), against their Python twins.

- ``push_record`` against ``Ring.push``: random pushes (every size class, some too large for
  the ring) and pops on two rings of one capacity leave both segments byte for byte the same,
  with the same outcome (pushed, full, too large); a buffer that holds no ring is refused.
- ``answer_plain`` against ``_one_frontend`` + the Python loop of ``write_answer_batch`` +
  ``Ring.push``: on random batches (the same ``ReplyTo`` object or an equal other one, a
  BLS requester, a traced request, an error, a dict subclass with parameters, odd outputs)
  it answers exactly the batches the twins answer as one frontend's ``AnswerBatch``, leaves
  the same ring bytes and the same block bytes, and declines the others before allocating.
- ``Answers.answer`` with the frontends' senders: the ring gets what ``send_answer`` would
  have sent and the frontend one wake-up; a full ring or a missing sender goes to
  ``send_answer`` with the same bytes.

No processes: rings and arenas of this test process (``/triton_mp_<pid>_test_ap*``).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from triton_mp.backends.base import RESCHEDULED, Outputs, response_parameters
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.memory.ring import RecordTooLarge, Ring, RingFull
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    ErrorInfo,
    InferRequest,
    ReplyTo,
    Requester,
)
from triton_mp.ipc.protocol.trace_messages import TraceContext
from triton_mp.ipc.recordio import codec
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, ArenaAllocator, free_block
from triton_mp.workers.answering import Answers, _one_frontend
from triton_mp.workers.tensors.answer_batch import alloc_block, write_answer_batch
from triton_mp.workers.tensors.tensor_io import WIRE_OF, ClientRegions
from triton_mp.workers.traces import Traces

from .test_answer_writer import ORIGIN, Recording, _plain, members

native = pytest.importorskip("triton_mp.workers._answer_writer")

_names = itertools.count()
PID = os.getpid()
SLOW = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]


def _ring(capacity: int) -> Ring:
    return Ring.create(f"/triton_mp_{PID}_test_ap_r{next(_names)}", capacity)


def _drop(*rings: Ring) -> None:
    for ring in rings:
        seg = ring.segment
        ring.close()
        seg.unlink()


@pytest.fixture
def arena() -> Iterator[ArenaAllocator]:
    alloc = ArenaAllocator(f"/triton_mp_{PID}_test_ap_a{next(_names)}", 1 << 21, 1 << 25)
    yield alloc
    alloc.close_and_unlink()


OUTCOME = {RingFull: 1, RecordTooLarge: 2}


def _py_push(ring: Ring, data: bytes) -> int:
    try:
        ring.push(data)
    except (RingFull, RecordTooLarge) as e:
        return OUTCOME[type(e)]
    return 0


@settings(max_examples=100, deadline=None)
@given(
    capacity=st.sampled_from([64, 96, 128, 256, 1000, 4096]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.integers(0, 2100)),
            st.tuples(st.just("push"), st.integers(0, 60)),
            st.tuples(st.just("pop"), st.just(0)),
        ),
        max_size=40,
    ),
)
def test_push_record_writes_what_ring_push_writes(
    capacity: int, ops: list[tuple[str, int]]
) -> None:
    a, b = _ring(capacity), _ring(capacity)
    try:
        for op, n in ops:
            if op == "pop":
                assert a.pop_all() == b.pop_all()
            else:
                data = bytes((i * 7 + n) % 256 for i in range(n))
                assert native.push_record(b.segment.buf, data) == _py_push(a, data)
            assert bytes(a.segment.buf) == bytes(b.segment.buf)
    finally:
        _drop(a, b)


def test_push_record_refuses_a_buffer_that_holds_no_ring() -> None:
    assert native.push_record(bytearray(100), b"x") == 3
    ring = _ring(256)
    try:
        buf = bytearray(ring.segment.buf)
        buf[0] ^= 1  # NOTE: the magic
        assert native.push_record(buf, b"x") == 3
        buf = bytearray(ring.segment.buf)[:200]  # NOTE: the capacity past the mapping
        assert native.push_record(buf, b"x") == 3
    finally:
        _drop(ring)


TO = ReplyTo(Requester.FRONTEND, 3)


@st.composite
def batches(draw: st.DrawFn) -> tuple[tuple[InferRequest, ...], list[Any]]:
    """A batch of requests with their results: one frontend's (the same ``ReplyTo``
    object, as the record decoder interns it) or not quite (module docstring)."""
    group = draw(members())
    reqs = [msgspec.structs.replace(req, reply_to=TO) for req, _ in group]
    results: list[Any] = [dict(res) for _, res in group]  # NOTE: Outputs: the "params" twist
    i = draw(st.integers(0, len(reqs) - 1))
    twist = draw(st.sampled_from(["none"] * 6 + ["equal", "bls", "traced", "error", "params"]))
    if twist == "equal":
        reqs[i] = msgspec.structs.replace(reqs[i], reply_to=ReplyTo(Requester.FRONTEND, 3))
    elif twist == "bls":
        to = ReplyTo(Requester.BLS, 3)
        reqs = [msgspec.structs.replace(r, reply_to=to) for r in reqs]
    elif twist == "traced":
        reqs[i] = msgspec.structs.replace(reqs[i], trace=TraceContext(1))
    elif twist == "error":
        results[i] = ErrorInfo(ErrorCode.INTERNAL, "no", ORIGIN)
    elif twist == "params":
        results[i] = Outputs(dict(results[i]), '{"p": 1}')
    return tuple(reqs), results


def _payload(rec: Recording) -> bytes:
    assert rec.last is not None
    seg, offset = rec.last
    start = offset + BLOCK_HEADER_BYTES
    return bytes(seg.buf[start : start + rec.payload])


@settings(max_examples=120, deadline=None, suppress_health_check=SLOW)
@given(batch=batches(), capacity=st.sampled_from([512, 1 << 22]))
def test_answer_plain_answers_what_the_twins_answer(
    arena: ArenaAllocator, batch: tuple[tuple[InferRequest, ...], list[Any]], capacity: int
) -> None:
    reqs, results = batch
    group = list(zip(reqs, results, strict=True))
    rec = Recording(arena)
    c_ring, py_ring = _ring(capacity), _ring(capacity)
    try:
        got = native.answer_plain(
            reqs,
            results,
            Requester.FRONTEND,
            {TO.id: c_ring.segment.buf},
            WIRE_OF,
            response_parameters,
            alloc_block,
            rec,
            None,
        )
        taken = _one_frontend(reqs, results) is not None and _plain(group)
        event("declined" if got is None else "pushed" if got[1] is None else "too large")
        if got is None:
            assert not taken
            assert rec.allocs == 0
            assert c_ring.pending_bytes() == 0
            return
        assert taken
        frontend_id, data, block = got
        assert frontend_id == TO.id
        c_payload = _payload(rec) if block is not None else b""
        if rec.last is not None:  # NOTE: the twin writes over the same block, zeroed
            seg, offset = rec.last
            start = offset + BLOCK_HEADER_BYTES
            seg.buf[start : start + rec.payload] = bytes(rec.payload)
        rec.replay = True
        msg, block2, failed = write_answer_batch(rec, ClientRegions(), group, ORIGIN)  # type: ignore[arg-type]
        assert isinstance(msg, AnswerBatch)
        assert failed == []
        assert block2 == block
        expected = codec.encode(msg)
        pushed = _py_push(py_ring, expected)
        if data is None:
            assert pushed == 0
        else:  # NOTE: too large for the ring: the bytes come back, the ring untouched
            assert pushed == 2
            assert data == expected
        assert bytes(c_ring.segment.buf) == bytes(py_ring.segment.buf)
        if block is not None:
            assert c_payload == _payload(rec)
            free_block(rec.last[0], block)  # type: ignore[index]
    finally:
        _drop(c_ring, py_ring)


def _plain_batch(n: int, to: ReplyTo = TO) -> tuple[tuple[InferRequest, ...], list[Any]]:
    group = [
        (
            InferRequest(
                request_id=i,
                reply_to=to,
                model="m",
                version=1,
                batch_size=1,
                inputs=(),
                outputs=("A",),
                block=None,
                arrival_ns=0,
            ),
            {"A": np.full(4, i, np.float32)},
        )
        for i in range(n)
    ]
    return tuple(r for r, _ in group), [res for _, res in group]


def test_a_full_ring_or_no_ring_gives_the_bytes_back(arena: ArenaAllocator) -> None:
    reqs, results = _plain_batch(3)
    ring = _ring(256)
    try:
        for size in (100, 0):
            while _py_push(ring, bytes(size)) == 0:
                pass
        before = bytes(ring.segment.buf)
        for rings in ({TO.id: ring.segment.buf}, {}):
            got = native.answer_plain(
                reqs, results, Requester.FRONTEND, rings, WIRE_OF, response_parameters,
                alloc_block, arena, None,
            )  # fmt: skip
            assert got is not None
            frontend_id, data, block = got
            assert frontend_id == TO.id
            assert isinstance(data, bytes)
            assert len(codec.Decoder(AnswerBatch).decode(data).responses) == 3
            assert bytes(ring.segment.buf) == before
            seg = next(s for s in arena.segments() if s.name == block.segment)
            assert free_block(seg, block)
    finally:
        _drop(ring)


class FakeSender:
    """A frontend's sender as ``Answers`` reads it: its ring, and its wake-ups counted."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


def _answers(
    arena: ArenaAllocator, sent: list[tuple[int, bytes]], frontends: dict[int, Any] | None
) -> Answers:
    return Answers(
        0, arena, ClientRegions(), ORIGIN, False, threading.RLock(),
        Traces(False, lambda ref: np.zeros(0)), set(),
        lambda to, msg: sent.append((-1, codec.encode(msg))),
        lambda msg: None,
        lambda frontend_id, data: sent.append((frontend_id, data)),
        frontends,
    )  # fmt: skip


def _messages(data: bytes) -> list[tuple[int, int, int]]:
    """(request_id, outputs, handoffs) of an encoded AnswerBatch: what it answers, not
    where its block is."""
    msg = codec.Decoder(AnswerBatch).decode(data)
    return [(r.request_id, len(r.outputs), len(msg.handoffs)) for r in msg.responses]


def test_answers_pushes_one_frontends_batch_and_posts_one_wake(arena: ArenaAllocator) -> None:
    reqs, results = _plain_batch(4)
    ring = _ring(1 << 16)
    try:
        sender = FakeSender(ring)
        via_ring: list[tuple[int, bytes]] = []
        assert _answers(arena, via_ring, {TO.id: sender}).answer(reqs, list(results)) == ((), ())
        assert via_ring == []
        assert sender.wakes == 1
        (pushed,) = ring.pop_all()
        sent: list[tuple[int, bytes]] = []
        assert _answers(arena, sent, None).answer(reqs, list(results)) == ((), ())
        ((frontend_id, data),) = sent
        assert frontend_id == TO.id
        assert _messages(pushed) == _messages(data)
        for raw in (pushed, data):
            (handoff,) = codec.Decoder(AnswerBatch).decode(raw).handoffs
            seg = next(s for s in arena.segments() if s.name == handoff.block.segment)
            assert free_block(seg, handoff.block)
        # NOTE: a full ring: Python's send takes the same bytes, nothing is posted here.
        for size in (4000, 0):
            while _py_push(ring, bytes(size)) == 0:
                pass
        sent = []
        assert _answers(arena, sent, {TO.id: sender}).answer(reqs, list(results)) == ((), ())
        assert sender.wakes == 1
        ((frontend_id, data),) = sent
        assert _messages(data) == _messages(pushed)
        (handoff,) = codec.Decoder(AnswerBatch).decode(data).handoffs
        seg = next(s for s in arena.segments() if s.name == handoff.block.segment)
        assert free_block(seg, handoff.block)
    finally:
        _drop(ring)


def test_answers_of_another_batch_take_the_python_path(arena: ArenaAllocator) -> None:
    # NOTE: two frontends' requests: the C call declines, each group is sent as before.
    reqs_a, results_a = _plain_batch(2)
    reqs_b, results_b = _plain_batch(2, ReplyTo(Requester.FRONTEND, 4))
    ring = _ring(1 << 16)
    try:
        sender = FakeSender(ring)
        sent: list[tuple[int, bytes]] = []
        answers = _answers(arena, sent, {TO.id: sender, 4: sender})
        assert answers.answer(reqs_a + reqs_b, results_a + results_b) == ((), ())
        assert sender.wakes == 0
        assert ring.pending_bytes() == 0
        assert sorted(f for f, _ in sent) == [3, 4]
        for _, data in sent:
            (handoff,) = codec.Decoder(AnswerBatch).decode(data).handoffs
            seg = next(s for s in arena.segments() if s.name == handoff.block.segment)
            assert free_block(seg, handoff.block)
    finally:
        _drop(ring)


def test_a_rescheduled_request_is_reported_and_the_others_answered(arena: ArenaAllocator) -> None:
    # NOTE: the C call declines a batch with a result that is no dict; ``answer`` then
    # reports the rescheduled index (BatchDone.rescheduled) and answers the others in Python.
    reqs, results = _plain_batch(3)
    mixed: list[Any] = list(results)
    mixed[1] = RESCHEDULED
    ring = _ring(1 << 16)
    try:
        sender = FakeSender(ring)
        sent: list[tuple[int, bytes]] = []
        answers = _answers(arena, sent, {TO.id: sender})
        assert answers.answer(reqs, mixed) == ((), (1,))
        assert ring.pending_bytes() == 0
        ((frontend_id, data),) = sent
        assert frontend_id == TO.id
        answered = [r.request_id for r in codec.Decoder(AnswerBatch).decode(data).responses]
        assert answered == [reqs[0].request_id, reqs[2].request_id]
        (handoff,) = codec.Decoder(AnswerBatch).decode(data).handoffs
        seg = next(s for s in arena.segments() if s.name == handoff.block.segment)
        assert free_block(seg, handoff.block)
    finally:
        _drop(ring)
