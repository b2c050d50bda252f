"""Outputs sent in place (``frontend/native/held_block.h``): ``_native.known_answer_build``
with ``in_place`` builds what ``Serve`` sends, an output of 64 KiB or more
(``known_answer.h`` kInPlaceMinBytes) referenced in the worker's arena instead of copied.
Over a real worker-like arena, for hypothesis-drawn answers mixing outputs below and above
the threshold, the bytes equal the Python path's (``KnownCalls._response_parts``); the
bytes in place are exactly the large outputs' that lie inside a block the answer hands
over; a hold armed (the answer committed) frees its block by tensor_pool's rule once the
responses are let go, and a hold never armed (the answer left to Python) frees nothing."""

from __future__ import annotations

from collections.abc import Iterator

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
from triton_mp.frontend.native import input_arena_type
from triton_mp.ipc.memory.shm import Segment
from triton_mp.ipc.protocol.messages import AnswerBatch, BlockRef, Handoff, InferResponse, TensorRef
from triton_mp.ipc.recordio.codec import encode
from triton_mp.ipc.tensor_pool import FREE, LIVE

pytestmark = pytest.mark.skipif(input_arena_type() is None, reason="native extension not built")

BLOCK = 1 << 20
"""Each test block's room, its 64-byte header included."""
LARGE = 64 * 1024
"""known_answer.h kInPlaceMinBytes."""


@pytest.fixture
def arena() -> Iterator[Segment]:
    """A worker-like output arena of 4 blocks; C++ forgets its mappings after."""
    with output_arena("tmkp", 4, BLOCK) as seg:
        yield seg


def live(seg: Segment, i: int, generation: int) -> BlockRef:
    """Block ``i`` of ``seg`` made LIVE with ``generation``."""
    return make_live(seg, i, generation, BLOCK)


def tensor(seg: Segment, name: str, at: int, n: int, fill: int) -> TensorRef:
    """A UINT8 tensor of ``n`` bytes written at ``at`` (bytes ``fill`` + position, mod 251)."""
    seg.buf[at : at + n] = bytes((fill + i) % 251 for i in range(n))
    return TensorRef(name, "UINT8", (n,), seg.name, at, n)


sizes = st.lists(
    st.one_of(st.integers(0, 300), st.integers(LARGE - 2, LARGE + 2), st.integers(LARGE, 200_000)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=25, deadline=None)
@given(sizes, st.text(max_size=6), st.booleans())
def test_large_outputs_go_in_place_with_the_python_paths_bytes(
    drawn: list[int], client_id: str, commit: bool
) -> None:
    with output_arena("tmkp", 4, BLOCK) as seg:
        block = live(seg, 1, 7)
        outputs, at = [], block.offset + 64
        for k, n in enumerate(drawn):
            outputs.append(tensor(seg, f"OUT{k}", at, n, k))
            at += (n + 63) // 64 * 64
        r = InferResponse(request_id=5, version=3, outputs=tuple(outputs), block=block)
        teach(11, r, client_id)
        built, refused, in_place = native().known_answer_build(
            encode(r), [11], commit, True, [client_id.encode()]
        )
        assert built == (python_bytes(r, seg, client_id),)
        assert in_place == sum(n for n in drawn if n >= LARGE)
        assert refused == 0
        # NOTE: armed (committed): freed once the responses were let go; else Python's to free
        assert state(seg, block) == (FREE if commit else LIVE)


def test_a_batchs_handed_over_block_is_held_once_and_freed_after_every_response(
    arena: Segment,
) -> None:
    block = live(arena, 2, 9)
    responses = []
    for i in range(3):
        t = tensor(arena, "OUT", block.offset + 64 + i * 2 * LARGE, LARGE + i, i)
        responses.append(
            InferResponse(request_id=100 + i, version=1, outputs=(t,), shared_blocks=(block,))
        )
    teach(4, responses[0], "id")
    teach(4, responses[1], "id")
    teach(4, responses[2], "id")
    batch = AnswerBatch(responses=tuple(responses), handoffs=(Handoff(block, 3),))
    built, refused, in_place = native().known_answer_build(
        encode(batch), [4] * 3, True, True, [b"id"] * 3
    )
    assert built == tuple(python_bytes(r, arena, "id") for r in responses)
    assert in_place == 3 * LARGE + 3
    assert refused == 0
    assert state(arena, block) == FREE


def test_a_large_output_outside_the_answers_block_is_copied(arena: Segment) -> None:
    """The bytes lie in a block the answer does not hand over: nothing holds them, so they
    are copied (and the answer's own block freed now)."""
    block = live(arena, 1, 3)
    other = live(arena, 3, 4)
    t = tensor(arena, "OUT", other.offset + 64, LARGE, 1)
    r = InferResponse(request_id=1, version=1, outputs=(t,), block=block)
    teach(2, r, "")
    built, refused, in_place = native().known_answer_build(encode(r), [2], True, True)
    assert built == (python_bytes(r, arena, ""),)
    assert (in_place, refused) == (0, 0)
    assert (state(arena, block), state(arena, other)) == (FREE, LIVE)


def test_a_held_block_of_another_generation_is_not_freed(arena: Segment) -> None:
    """tensor_pool's rule when the hold lets go: the header holds another generation (its
    room was reused): the free is refused and counted, the block stays LIVE."""
    block = live(arena, 2, 5)
    t = tensor(arena, "OUT", block.offset + 64, 2 * LARGE, 3)
    r = InferResponse(
        request_id=1, version=1, outputs=(t,), block=BlockRef(arena.name, block.offset, 4)
    )
    teach(3, r, "")
    built, refused, in_place = native().known_answer_build(encode(r), [3], True, True)
    assert built == (python_bytes(r, arena, ""),)
    assert (in_place, refused) == (2 * LARGE, 1)
    assert state(arena, block) == LIVE
