"""``PendingTable`` and answers a worker made from the request's own input block
(``TensorRef``'s rule in ``ipc.protocol.messages``): the input block of a request whose
answer names it stays LIVE until that response is released (its bytes are read after the
answer arrived), and is freed then; a request whose answer names a worker's block, an error,
or an output in a client's region frees its input block as the answer arrives; so does an
answer for a closed ticket's request, released at once. One input arena of this process
(``/triton_mp_<pid>_test_pih*``), no other process."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator

import pytest

from triton_mp.common.errors import ErrorCode
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.ipc import SegmentCache
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BlockRef,
    ErrorInfo,
    InferResponse,
    TensorRef,
)
from triton_mp.ipc.tensor_pool import FREE, LIVE, ArenaAllocator, block_ref

_names = itertools.count()


@pytest.fixture
def arena() -> Iterator[ArenaAllocator]:
    alloc = ArenaAllocator(f"/triton_mp_{os.getpid()}_test_pih{next(_names)}", 1 << 20, 1 << 22)
    yield alloc
    alloc.close_and_unlink()


def _block(arena: ArenaAllocator) -> BlockRef:
    seg, offset = arena.alloc(4096)
    return block_ref(seg, offset)


def _state(arena: ArenaAllocator, b: BlockRef) -> int:
    seg = next(s for s in arena.segments() if s.name == b.segment)
    return int.from_bytes(seg.buf[b.offset : b.offset + 4], "little")


def _out(segment: str, offset: int, region_id: int = 0) -> TensorRef:
    return TensorRef("OUT", "FP32", (1024,), segment, offset, 4096, region_id)


def test_an_answer_from_the_input_block_keeps_it_until_released(arena: ArenaAllocator) -> None:
    async def main() -> None:
        cache = SegmentCache()
        for seg in arena.segments():
            cache.add(seg)
        table = PendingTable(cache)
        got: list[InferResponse] = []
        blocks = [_block(arena) for _ in range(4)]
        for b in blocks:
            table.add_request(table.new_id(), b, got.append)  # type: ignore[arg-type]
        own = [_out(b.segment, b.offset + 64) for b in blocks]
        answers = [
            InferResponse(request_id=1, version=1, outputs=(own[0],)),  # NOTE: from its input
            InferResponse(request_id=2, version=1, outputs=(_out("/a_worker", 64),)),
            InferResponse(request_id=3, version=1, outputs=(_out(own[2].segment, 64, 5),)),
            InferResponse(
                request_id=4, version=1, error=ErrorInfo(ErrorCode.INTERNAL, "no", "worker 0")
            ),
        ]
        table.deliver([AnswerBatch(responses=tuple(answers[:2]), handoffs=()), *answers[2:]])
        assert [r.request_id for r in got] == [1, 2, 3, 4]
        assert [_state(arena, b) for b in blocks] == [LIVE, FREE, FREE, FREE]
        for r in got:
            table.release(r)
        assert _state(arena, blocks[0]) == FREE
        assert len(table) == 0

    asyncio.run(main())


def test_a_closed_sinks_answer_from_its_input_block_frees_it(arena: ArenaAllocator) -> None:
    """A sink that fails (as a cancelled ticket's releases at once) frees the block too."""

    async def main() -> None:
        cache = SegmentCache()
        for seg in arena.segments():
            cache.add(seg)
        table = PendingTable(cache)
        b = _block(arena)

        def sink(msg: object) -> None:
            raise RuntimeError("gone")

        table.add_request(table.new_id(), b, sink)
        table.deliver([InferResponse(request_id=1, version=1, outputs=(_out(b.segment, 64),))])
        assert _state(arena, b) == FREE

    asyncio.run(main())
