"""The holder's side of the record of who holds an output block in place
(``frontend/native/held_block.h``, ``output_segments.h``; Python twin ``ipc.output_holds``):
a hold armed (the answer committed) writes this process's pid into the block's holder word
before it frees the block, a hold never armed writes nothing, and a block its worker
flagged ``COPY`` (its arenas past their fill mark) is copied into the reply, not held, and
freed at once. Through ``_native.known_answer_build`` (what ``Serve`` builds)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

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
from triton_mp.ipc.output_holds import COPY, HOLDER_OFFSET, hold_of
from triton_mp.ipc.protocol.messages import BlockRef, InferResponse, TensorRef
from triton_mp.ipc.recordio.codec import encode
from triton_mp.ipc.tensor_pool import FREE, LIVE

pytestmark = pytest.mark.skipif(input_arena_type() is None, reason="native extension not built")

BLOCK = 1 << 20
LARGE = 64 * 1024
"""known_answer.h kInPlaceMinBytes."""


@pytest.fixture
def arena() -> Iterator[Segment]:
    with output_arena("tmho", 4, BLOCK) as seg:
        yield seg


def _answer(seg: Segment, i: int, generation: int, flags: int = 0) -> InferResponse:
    """A response whose one large output lies in block ``i`` (LIVE, ``flags`` set)."""
    block: BlockRef = make_live(seg, i, generation, BLOCK)
    seg.buf[block.offset + HOLDER_OFFSET + 4 : block.offset + HOLDER_OFFSET + 8] = flags.to_bytes(
        4, "little"
    )
    at = block.offset + 64
    seg.buf[at : at + LARGE] = bytes(i % 251 for i in range(LARGE))
    t = TensorRef("OUT", "UINT8", (LARGE,), seg.name, at, LARGE)
    return InferResponse(request_id=9, version=1, outputs=(t,), block=block)


def test_an_armed_hold_names_this_process_before_it_frees_the_block(arena: Segment) -> None:
    r = _answer(arena, 1, 5)
    teach(3, r, "")
    built, refused, in_place = native().known_answer_build(encode(r), [3], True, True)
    assert built == (python_bytes(r, arena, ""),)
    assert (refused, in_place) == (0, LARGE)
    assert r.block is not None
    assert state(arena, r.block) == FREE
    assert hold_of(arena, r.block.offset) == (os.getpid(), 0)


def test_a_hold_never_armed_names_no_holder(arena: Segment) -> None:
    r = _answer(arena, 2, 6)
    teach(3, r, "")
    _, _, in_place = native().known_answer_build(encode(r), [3], False, True)
    assert in_place == LARGE
    assert r.block is not None
    assert state(arena, r.block) == LIVE  # NOTE: Python's to free
    assert hold_of(arena, r.block.offset) == (0, 0)


def test_a_block_flagged_copy_is_copied_and_freed_at_once(arena: Segment) -> None:
    r = _answer(arena, 1, 8, COPY)
    teach(3, r, "")
    built, refused, in_place = native().known_answer_build(encode(r), [3], True, True)
    assert built == (python_bytes(r, arena, ""),)
    assert (refused, in_place) == (0, 0)
    assert r.block is not None
    assert state(arena, r.block) == FREE
    assert hold_of(arena, r.block.offset) == (0, COPY)
