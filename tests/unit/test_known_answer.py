"""``_native.known_answer_build`` (``frontend/native/known_answer.h``): the response C++
builds for a worker's answer of a known call, without a server. Over a real worker-like
arena (a shared-memory segment with LIVE blocks), for hypothesis-drawn answers the bytes
equal the Python path's (``KnownCalls._response_parts``: ``ResponseHeads.head`` then
``infer_response_parts`` joined); the output blocks are freed by tensor_pool's rule (not a
block of another generation); and everything that asks for a Triton rule (an error, a
trace, a form with no head, blocks not handed over whole) is left to Python with nothing
built or freed; an output the worker wrote in a client's region is an empty entry, as the
Python path's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.known_answer_arena import (
    make_live,
    native,
    output_arena,
    python_bytes,
    state,
    teach,
)
from triton_mp.common.errors import ErrorCode
from triton_mp.frontend.grpc.messages import ResponseHeads
from triton_mp.frontend.grpc.wire import infer_response_parts
from triton_mp.frontend.native import input_arena_type
from triton_mp.ipc.memory.shm import Segment
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BlockRef,
    ErrorInfo,
    Handoff,
    InferResponse,
    TensorRef,
)
from triton_mp.ipc.recordio.codec import encode
from triton_mp.ipc.tensor_pool import FREE, LIVE

pytestmark = pytest.mark.skipif(input_arena_type() is None, reason="native extension not built")

BLOCK = 4096
"""Each test block's room, its 64-byte header included."""


@pytest.fixture
def arena() -> Iterator[Segment]:
    """A worker-like output arena of 8 blocks; C++ forgets its mappings after."""
    with output_arena("tmk", 8, BLOCK) as seg:
        yield seg


def live(seg: Segment, i: int, generation: int) -> BlockRef:
    """Block ``i`` of ``seg`` made LIVE with ``generation``."""
    return make_live(seg, i, generation, BLOCK)


dtypes = st.sampled_from([("FP32", 4), ("INT64", 8), ("UINT8", 1), ("BOOL", 1)])
forms = st.lists(
    st.tuples(st.text(min_size=1, max_size=12), dtypes, st.lists(st.integers(1, 6), max_size=3)),
    min_size=0,
    max_size=3,
)


def outputs_in(
    seg: Segment, block: BlockRef, drawn: Any, data: st.DataObject
) -> tuple[TensorRef, ...]:
    """Tensors of the drawn forms laid out in ``block`` (random bytes written there)."""
    out = []
    at = block.offset + 64
    for name, (dtype, size), shape in drawn:
        n = size
        for d in shape:
            n *= d
        seg.buf[at : at + n] = data.draw(st.binary(min_size=n, max_size=n))
        out.append(TensorRef(name, dtype, tuple(shape), seg.name, at, n))
        at += (n + 63) // 64 * 64
    return tuple(out)


ids = st.one_of(
    st.just(""),
    st.text(max_size=10),
    st.text(min_size=100, max_size=400),  # NOTE: a two-byte length varint
    st.sampled_from(["0", "é", "请求-42", "\U0001f600" * 40]),
)
"""Request ids: empty, short, long, UTF-8 of 2-4 bytes a character."""


@settings(max_examples=60, deadline=None)
@given(forms, ids, ids, st.sampled_from(["", '{"a": 1}']), st.data())
def test_one_answer_is_the_python_paths_bytes_and_frees_its_block(
    drawn: Any, taught_id: str, client_id: str, params: str, data: st.DataObject
) -> None:
    """The head is taught from a call with one id and serves a call with any other: the
    call's own id is written where Python's serializer writes it."""
    with output_arena("tmk", 8, BLOCK) as seg:
        block = live(seg, 1, 7)
        r = InferResponse(
            request_id=5, version=3, outputs=outputs_in(seg, block, drawn, data),
            block=block, parameters_json=params,
        )  # fmt: skip
        expected = python_bytes(r, seg, client_id)
        cid = client_id.encode()
        assert native().known_answer_build(encode(r), [11], False, False, [cid]) is None
        teach(11, r, taught_id)
        assert native().known_answer_build(encode(r), [12], False, False, [cid]) is None
        built, refused = native().known_answer_build(encode(r), [11], True, False, [cid])
        assert built == (expected,)
        assert refused == 0
        assert state(seg, block) == FREE


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.data())
def test_a_batch_is_built_in_order_and_its_shared_block_freed_once(
    n: int, data: st.DataObject
) -> None:
    with output_arena("tmk", 8, BLOCK) as seg:
        block = live(seg, 2, 9)
        responses = []
        for i in range(n):
            t = TensorRef("OUT", "FP32", (1, 4), seg.name, block.offset + 64 + 64 * i, 16)
            seg.buf[t.offset : t.offset + 16] = data.draw(st.binary(min_size=16, max_size=16))
            responses.append(
                InferResponse(request_id=100 + i, version=1, outputs=(t,), shared_blocks=(block,))
            )
        batch = AnswerBatch(responses=tuple(responses), handoffs=(Handoff(block, n),))
        teach(4, responses[0], "id")
        call_ids = [f"call-{i}" * i for i in range(n)]  # NOTE: each call's own; the first ""
        built, refused = native().known_answer_build(
            encode(batch), [4] * n, True, False, [c.encode() for c in call_ids]
        )
        assert built == tuple(
            python_bytes(r, seg, c) for r, c in zip(responses, call_ids, strict=True)
        )
        assert refused == 0
        assert state(seg, block) == FREE
        short = AnswerBatch(responses=tuple(responses), handoffs=(Handoff(block, n + 1),))
        live(seg, 2, 9)
        # NOTE: the block is used by an answer still to come: Python's (SharedBlocks)
        assert native().known_answer_build(encode(short), [4] * n, True) is None
        assert state(seg, block) == LIVE


def test_what_asks_for_a_triton_rule_is_left_to_python(arena: Segment) -> None:
    block = live(arena, 1, 3)
    t = TensorRef("OUT", "FP32", (1, 1), arena.name, block.offset + 64, 4)
    plain = InferResponse(request_id=1, version=2, outputs=(t,), block=block)
    teach(1, plain, "")
    assert native().known_answer_build(encode(plain), [1]) is not None
    error = ErrorInfo(ErrorCode.INTERNAL, "boom")
    other_shape = TensorRef("OUT", "FP32", (1, 2), arena.name, block.offset + 64, 8)
    cases = {
        "error": InferResponse(request_id=1, version=2, outputs=(t,), block=block, error=error),
        "not final": InferResponse(request_id=1, version=2, outputs=(t,), block=block, final=False),
        "another shape": InferResponse(request_id=1, version=2, outputs=(other_shape,)),
        "another version": InferResponse(request_id=1, version=3, outputs=(t,), block=block),
        "parameters": InferResponse(
            request_id=1, version=2, outputs=(t,), block=block, parameters_json='{"x": 1}'
        ),
        "extra blocks": InferResponse(
            request_id=1, version=2, outputs=(t,), block=block, extra_blocks=(block,)
        ),
        "shared, no handoff": InferResponse(
            request_id=1, version=2, outputs=(t,), shared_blocks=(block,)
        ),
        "past the arena": InferResponse(
            request_id=1,
            version=2,
            outputs=(TensorRef("OUT", "FP32", (1, 1), arena.name, 8 * BLOCK - 2, 4),),
        ),  # fmt: skip
        "a gone arena": InferResponse(
            request_id=1,
            version=2,
            outputs=(TensorRef("OUT", "FP32", (1, 1), "/tmk_gone_arena", 64, 4),),
        ),  # fmt: skip
    }
    for why, r in cases.items():
        assert native().known_answer_build(encode(r), [1], True) is None, why
        assert state(arena, block) == LIVE, why
    assert native().known_answer_build(encode(plain), [1, 1]) is None  # NOTE: lessons' count


def test_an_output_in_a_client_region_is_an_empty_entry_as_pythons(arena: Segment) -> None:
    """The worker wrote OUT0 in the client's region (no bytes in the answer): the response
    is the taught head, OUT0's empty raw_output_contents entry and OUT1's bytes, as
    ``KnownCalls._response_parts`` gives them; OUT1's block is freed."""
    block = live(arena, 2, 5)
    arena.buf[block.offset + 64 : block.offset + 72] = b"abcdefgh"
    region = TensorRef("OUT0", "FP32", (1, 4), "/client", 128, 16, region_id=3)
    t = TensorRef("OUT1", "UINT8", (8,), arena.name, block.offset + 64, 8)
    r = InferResponse(request_id=1, version=2, outputs=(region, t), block=block)
    teach(4, r, "cid")
    built, refused = native().known_answer_build(encode(r), [4], True, False, [b"cid"])
    head = ResponseHeads().head("m", 2, "cid", "{}", r.outputs)
    view = memoryview(arena.buf)[t.offset : t.offset + 8]
    expected = b"".join(bytes(p) for p in infer_response_parts(head, [None, view]))
    assert built == (expected,)
    assert refused == 0
    assert state(arena, block) == FREE


def test_a_block_of_another_generation_is_not_freed(arena: Segment) -> None:
    """tensor_pool's rule: the header holds another generation (the block was freed and
    its room reused): the free is refused and counted."""
    block = live(arena, 3, 5)
    t = TensorRef("OUT", "INT64", (1,), arena.name, block.offset + 64, 8)
    r = InferResponse(
        request_id=1, version=1, outputs=(t,), block=BlockRef(arena.name, block.offset, 4)
    )
    teach(2, r, "")
    built, refused = native().known_answer_build(encode(r), [2], True)
    assert len(built) == 1
    assert refused == 1
    assert state(arena, block) == LIVE
