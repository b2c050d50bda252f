"""Outputs a worker answered from the call's own input block (``TensorRef``'s rule in
``ipc.protocol.messages``; ``frontend/native/known_answer.h`` InputBlock): given the call's
input block, ``_native.known_answer_build`` with ``in_place`` sends such an output of 64 KiB
or more from the input arena (bytes equal to the Python path's), holds the input block and
frees it (tensor_pool's rule) only once the responses are let go, never when the answer is
left to Python; a smaller one is copied and its block left to the caller (``FreeInput``);
without the call's input block, or naming another block, the output is copied and nothing
of the input arena is freed."""

from __future__ import annotations

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
from triton_mp.ipc.protocol.messages import AnswerBatch, BlockRef, InferResponse, TensorRef
from triton_mp.ipc.recordio.codec import encode
from triton_mp.ipc.tensor_pool import FREE, LIVE

pytestmark = pytest.mark.skipif(input_arena_type() is None, reason="native extension not built")

BLOCK = 1 << 20
LARGE = 64 * 1024
"""known_answer.h kInPlaceMinBytes (answer_writer.cc kAliasMinBytes)."""


@pytest.fixture
def arena() -> Iterator[Segment]:
    """A frontend-like input arena of 4 blocks; C++ forgets its mappings after."""
    with output_arena("tmki", 4, BLOCK) as seg:
        yield seg


def output(seg: Segment, block: BlockRef, skip: int, n: int) -> TensorRef:
    """A UINT8 output of ``n`` bytes ``skip`` bytes into ``block``'s payload, its bytes
    written there (as the client's input was)."""
    at = block.offset + 64 + skip
    seg.buf[at : at + n] = bytes((7 + i) % 251 for i in range(n))
    return TensorRef("OUT", "UINT8", (n,), seg.name, at, n)


def batch_of(r: InferResponse) -> bytes:
    """``r`` as answer_plain sends it: an AnswerBatch of one, no block handed over."""
    return encode(AnswerBatch(responses=(r,), handoffs=()))


def inputs(block: BlockRef) -> list[tuple[str, int, int]]:
    return [(block.segment, block.offset, block.generation)]


@pytest.mark.parametrize("commit", [True, False])
def test_a_large_output_in_the_input_block_is_sent_from_it_and_freed_when_sent(
    arena: Segment, commit: bool
) -> None:
    block = make_live(arena, 1, 5, BLOCK)
    r = InferResponse(request_id=3, version=1, outputs=(output(arena, block, 128, LARGE + 3),))
    teach(21, r, "a")
    built, refused, in_place = native().known_answer_build(
        batch_of(r), [21], commit, True, [b"a"], inputs(block)
    )
    assert built == (python_bytes(r, arena, "a"),)
    assert in_place == LARGE + 3
    assert refused == 0
    # NOTE: armed (the answer committed): the hold freed it once the responses were let go;
    # not armed (left to Python): Python frees it after reading it
    assert state(arena, block) == (FREE if commit else LIVE)


def test_a_small_output_in_the_input_block_is_copied_and_the_block_left_to_free(
    arena: Segment,
) -> None:
    block = make_live(arena, 0, 2, BLOCK)
    r = InferResponse(request_id=4, version=1, outputs=(output(arena, block, 0, LARGE - 1),))
    teach(22, r, "")
    built, refused, in_place = native().known_answer_build(
        batch_of(r), [22], True, True, None, inputs(block)
    )
    assert built == (python_bytes(r, arena, ""),)
    assert in_place == 0
    assert refused == 0
    assert state(arena, block) == LIVE  # NOTE: the caller's FreeInput frees it


def test_without_the_calls_input_block_the_output_is_copied(arena: Segment) -> None:
    """No InputBlock (an arena of another epoch), or another block of the arena than the
    call's: the bytes are copied and no block of the input arena is held or freed."""
    block = make_live(arena, 2, 8, BLOCK)
    other = make_live(arena, 3, 9, BLOCK)
    r = InferResponse(request_id=5, version=1, outputs=(output(arena, block, 64, LARGE),))
    teach(23, r, "")
    for given in (None, [None], inputs(other)):
        built, refused, in_place = native().known_answer_build(
            batch_of(r), [23], True, True, None, given
        )
        assert built == (python_bytes(r, arena, ""),)
        assert (in_place, refused) == (0, 0)
        assert state(arena, block) == LIVE
        assert state(arena, other) == LIVE


def test_an_output_running_past_the_input_block_is_copied(arena: Segment) -> None:
    block = make_live(arena, 1, 6, BLOCK)
    make_live(arena, 2, 7, BLOCK)
    r = InferResponse(
        request_id=6, version=1, outputs=(output(arena, block, BLOCK - 64 - LARGE + 1, LARGE),)
    )
    teach(24, r, "")
    built, refused, in_place = native().known_answer_build(
        batch_of(r), [24], True, True, None, inputs(block)
    )
    assert built == (python_bytes(r, arena, ""),)
    assert (in_place, refused) == (0, 0)
    assert state(arena, block) == LIVE


def test_input_blocks_are_held_only_under_the_hold_limit(arena: Segment) -> None:
    """known_answer_input_arena's hold_limit: an input block that would take the bytes held
    past it is copied (its block left to the caller's FreeInput); under it, held."""
    block = make_live(arena, 1, 4, BLOCK)
    r = InferResponse(request_id=7, version=1, outputs=(output(arena, block, 0, LARGE),))
    teach(25, r, "")
    for limit, held in ((BLOCK - 1, False), (BLOCK, True)):
        given = [(block.segment, block.offset, block.generation, limit)]
        built, refused, in_place = native().known_answer_build(
            batch_of(r), [25], False, True, None, given
        )
        assert built == (python_bytes(r, arena, ""),)
        assert (in_place, refused) == (LARGE if held else 0, 0)
        assert state(arena, block) == LIVE
