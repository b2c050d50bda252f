"""``_native.read_answer`` (``frontend/native/answer_reader.h``): a worker's msgpack answer
read in place by C++, without a server. For hypothesis-drawn ``InferResponse`` and
``AnswerBatch`` messages encoded as workers encode them (``ipc.recordio.codec.encode``), the
native reader gives every field msgspec's decode gives (errors and traces only as present);
every other message, and any byte string however broken, is ``None`` (Python decodes it) or
read within its bounds, never past them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp.common.errors import ErrorCode
from triton_mp.frontend.native import input_arena_type
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BlockRef,
    ErrorInfo,
    Handoff,
    InferResponse,
    QueueReply,
    RequestFailed,
    TensorRef,
)
from triton_mp.ipc.recordio.codec import encode
from triton_mp.ipc.recordio.records import encode_answer

pytestmark = pytest.mark.skipif(input_arena_type() is None, reason="native extension not built")

RESPONSE, BATCH = 1, 2
"""``answer_reader.h`` AnswerKind."""


def read(data: bytes) -> Any:
    from triton_mp.frontend.native import _native  # type: ignore[attr-defined]

    return _native.read_answer(data)


u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
text = st.text(max_size=40)
blocks = st.builds(BlockRef, text, u64, u32)
tensors = st.builds(
    TensorRef,
    text,
    st.sampled_from(["FP32", "INT64", "BYTES", "BOOL", "FP16"]),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=8).map(tuple),
    text,
    u64,
    u64,
    st.one_of(st.just(0), u64),
)
errors = st.builds(ErrorInfo, st.sampled_from(list(ErrorCode)), text, text)
responses = st.builds(
    InferResponse,
    request_id=u64,
    version=st.integers(-(2**63), 2**63 - 1),
    outputs=st.lists(tensors, max_size=4).map(tuple),
    block=st.none() | blocks,
    error=st.none() | errors,
    final=st.booleans(),
    empty=st.booleans(),
    extra_blocks=st.lists(blocks, max_size=2).map(tuple),
    parameters_json=st.one_of(st.just(""), text),
    shared_blocks=st.lists(blocks, max_size=2).map(tuple),
    handoffs=st.lists(st.builds(Handoff, blocks, u32), max_size=2).map(tuple),
)
batches = st.builds(
    AnswerBatch,
    responses=st.lists(responses, max_size=6).map(tuple),
    handoffs=st.lists(st.builds(Handoff, blocks, u32), max_size=2).map(tuple),
)


def block_of(b: BlockRef | None) -> Any:
    return None if b is None else (b.segment, b.offset, b.generation)


def expected(r: InferResponse) -> tuple[Any, ...]:
    """``read_answer``'s tuple for ``r`` (``answer_reader_py.cc``)."""
    outputs = tuple(
        (t.name, t.datatype, t.shape, t.segment, t.offset, t.nbytes, t.region_id) for t in r.outputs
    )
    return (
        r.request_id, r.version, outputs, block_of(r.block), r.error is not None, r.final,
        r.empty, r.trace is not None, len(r.extra_blocks), r.parameters_json,
        tuple(block_of(b) for b in r.shared_blocks), len(r.handoffs),
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(responses)
def test_a_response_reads_as_msgspec_decodes_it(r: InferResponse) -> None:
    assert read(encode(r)) == (RESPONSE, (expected(r),), ())


@settings(max_examples=200, deadline=None)
@given(batches)
def test_a_batch_reads_as_msgspec_decodes_it(b: AnswerBatch) -> None:
    handoffs = tuple((block_of(h.block), h.uses) for h in b.handoffs)
    assert read(encode(b)) == (BATCH, tuple(expected(r) for r in b.responses), handoffs)


def test_a_workers_batch_as_sent_at_c16_reads_whole() -> None:
    """The shape add_sub_py's worker sends: outputs in one block every response shares."""
    block = BlockRef("/triton_mp_x_w0_a0", 4096, 17)
    out = [
        InferResponse(
            request_id=100 + i,
            version=1,
            outputs=(
                TensorRef("OUTPUT0", "FP32", (1, 16), block.segment, 4160 + 128 * i, 64),
                TensorRef("OUTPUT1", "FP32", (1, 16), block.segment, 4224 + 128 * i, 64),
            ),
            shared_blocks=(block,),
        )
        for i in range(3)
    ]
    batch = AnswerBatch(responses=tuple(out), handoffs=(Handoff(block, 3),))
    kind, got, handoffs = read(encode(batch))
    assert kind == BATCH
    assert [g[0] for g in got] == [100, 101, 102]
    assert got[2][2][1] == ("OUTPUT1", "FP32", (1, 16), block.segment, 4224 + 256, 64, 0)
    assert handoffs == ((block_of(block), 3),)


def test_what_is_not_a_response_or_a_batch_is_left_to_python() -> None:
    failed = RequestFailed(request_id=3, error=ErrorInfo(ErrorCode.INTERNAL, "x"))
    r = InferResponse(request_id=1, version=1, outputs=(TensorRef("O", "FP32", (1,), "/s", 0, 4),))
    record = encode_answer(r)
    assert record is not None
    for data in (
        encode(failed),
        encode(QueueReply(query_id=1, models=())),
        record,  # NOTE: the binary ANSWERS record (0xC1 first): Python decodes it
        b"",
        encode(r) + b"\x00",  # NOTE: a byte past the message
        encode(r)[:-1],
        msgspec.msgpack.encode(["response", *msgspec.msgpack.decode(encode(r))[1:], 0]),
        msgspec.msgpack.encode(["answers", [], [], 0]),
        msgspec.msgpack.encode(["other", *msgspec.msgpack.decode(encode(r))[1:]]),
    ):
        assert read(data) is None, data


def test_a_trace_and_an_error_are_skipped_whole() -> None:
    """A traced response's TraceRecord is only skipped (any msgpack value: maps, floats,
    bin): the fields after it are still read."""
    raw = msgspec.msgpack.decode(encode(InferResponse(request_id=9, version=2)))
    raw[8] = {"events": [1.5, b"\x00\x01", {"a": [None, True, -7]}], "n": 2**40}
    raw[5] = [3, "message", "origin"]
    got = read(msgspec.msgpack.encode(raw))
    assert got is not None
    (response,) = got[1]
    assert response[0] == 9
    assert response[4] is True  # NOTE: has_error
    assert response[7] is True  # NOTE: traced
    deep: Any = 0
    for _ in range(100):
        deep = [deep]
    raw[8] = deep  # NOTE: nesting past the reader's bound: left to Python, no deep recursion
    assert read(msgspec.msgpack.encode(raw)) is None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_are_read_within_bounds_or_left(data: bytes) -> None:
    got = read(data)
    assert got is None or got[0] in (RESPONSE, BATCH)


@settings(max_examples=150, deadline=None)
@given(batches, st.data())
def test_a_damaged_batch_is_read_within_bounds_or_left(b: AnswerBatch, data: st.DataObject) -> None:
    raw = bytearray(encode(b))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        got = read(bytes(raw[:cut]))
    except UnicodeDecodeError:
        return  # NOTE: a name's bytes damaged into invalid UTF-8: only the test's view fails
    assert got is None or got[0] in (RESPONSE, BATCH)


def test_two_strings_of_invalid_utf8_raise_the_first_ones_error() -> None:
    """The test view stops at the first string it cannot decode (found by the damaged-batch
    fuzz: decoding a second string with the first one's error still set made CPython raise
    SystemError instead)."""
    r = InferResponse(request_id=1, version=1, outputs=(TensorRef("zz", "FP32", (1,), "/s", 0, 4),))
    raw = encode(r)
    damaged = raw.replace(b"\xa2zz", b"\xa2\x80\x80", 1).replace(
        b"\xa4FP32", b"\xa4\x80\x80\x80\x80", 1
    )
    assert damaged.count(b"\x80") == 6
    with pytest.raises(UnicodeDecodeError):
        read(damaged)
