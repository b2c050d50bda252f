"""One answer per batch and frontend (``workers.tensors.answer_batch``) and its accounting at the
frontend (``frontend.dispatch.pending.PendingTable`` with ``ipc.tensor_pool.SharedBlocks``).

No processes: the worker's arena and a "frontend" ``SegmentCache`` in this process. The
block of an ``AnswerBatch`` must be freed exactly once, after the last response naming it is
released, in any release order, with held (``preserve_ordering``) and orphaned responses
too; a failed member is an error naming no block; nothing is left allocated when the block
cannot be had. Arenas are named ``/triton_mp_<pid>_test_ab<n>`` and unlinked by the fixture.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator

import msgspec
import numpy as np
import pytest

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BlockRef,
    ErrorInfo,
    InferRequest,
    InferResponse,
    ReplyTo,
    Requester,
    ToFrontend,
)
from triton_mp.ipc.recordio import codec
from triton_mp.ipc.tensor_pool import FREE, LIVE, ArenaAllocator, SegmentCache
from triton_mp.workers.tensors.answer_batch import write_answer_batch
from triton_mp.workers.tensors.tensor_io import ClientRegions

_prefixes = itertools.count()
ORIGIN = "worker m_0"


@pytest.fixture
def arena() -> Iterator[ArenaAllocator]:
    alloc = ArenaAllocator(f"/triton_mp_{os.getpid()}_test_ab{next(_prefixes)}", 1 << 16, 1 << 20)
    yield alloc
    alloc.close_and_unlink()


@pytest.fixture
def cache() -> Iterator[SegmentCache]:
    c = SegmentCache()
    yield c
    c.close()


def _req(rid: int, outputs: tuple[str, ...] = ("OUT0", "OUT1")) -> InferRequest:
    return InferRequest(
        request_id=rid,
        reply_to=ReplyTo(Requester.FRONTEND, 0),
        model="m",
        version=3,
        batch_size=1,
        inputs=(),
        outputs=outputs,
        block=None,
        arrival_ns=0,
    )


def _outputs(rid: int) -> dict[str, np.ndarray]:
    return {
        "OUT0": np.full((1, 5), rid, np.float32),
        "OUT1": np.arange(rid, rid + 3, dtype=np.int64).reshape(1, 3),
    }


def _state(cache: SegmentCache, block: BlockRef) -> int:
    return int(np.frombuffer(cache.get(block.segment).buf, np.uint32, 1, block.offset)[0])


def _read(cache: SegmentCache, resp: InferResponse, i: int, dtype: type) -> np.ndarray:
    ref = resp.outputs[i]
    buf = cache.get(ref.segment).buf
    return np.frombuffer(buf, dtype, ref.nbytes // np.dtype(dtype).itemsize, ref.offset).reshape(
        ref.shape
    )


def test_every_output_of_the_batch_lies_in_one_block_named_by_each_response(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    members = [(_req(r), _outputs(r)) for r in (1, 2, 3)]
    msg, block, failed = write_answer_batch(arena, ClientRegions(), members, ORIGIN)
    assert failed == []
    assert block is not None
    assert arena.live_blocks() == 1
    assert [r.request_id for r in msg.responses] == [1, 2, 3]
    assert [(h.block, h.uses) for h in msg.handoffs] == [(block, 3)]
    refs = []
    for r, resp in zip((1, 2, 3), msg.responses, strict=True):
        assert (resp.version, resp.block, resp.shared_blocks, resp.error) == (
            3,
            None,
            (block,),
            None,
        )
        assert [(o.name, o.datatype, o.shape) for o in resp.outputs] == [
            ("OUT0", "FP32", (1, 5)),
            ("OUT1", "INT64", (1, 3)),
        ]
        np.testing.assert_array_equal(_read(cache, resp, 0, np.float32), _outputs(r)["OUT0"])
        np.testing.assert_array_equal(_read(cache, resp, 1, np.int64), _outputs(r)["OUT1"])
        refs += resp.outputs
    offsets = [o.offset for o in refs]
    assert all(o.segment == block.segment and o.offset % 64 == 0 for o in refs)
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == len(offsets)
    # the message crosses the ring as any other: decoded by the frontend's union decoder
    assert codec.Decoder(ToFrontend).decode(codec.encode(msg)) == msg


def test_a_member_that_fails_is_an_error_naming_no_block_and_the_others_go_on(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    bad = ErrorInfo(ErrorCode.INVALID_ARG, "bad item", "model")
    missing = {"OUT0": np.zeros((1, 5), np.float32)}  # OUT1 asked for, not produced
    members = [(_req(1), _outputs(1)), (_req(2), bad), (_req(3), missing), (_req(4), _outputs(4))]
    msg, block, failed = write_answer_batch(arena, ClientRegions(), members, ORIGIN)
    assert failed == [1]
    assert block is not None
    ok1, err2, part3, ok4 = msg.responses
    assert (err2.error, err2.shared_blocks, err2.outputs) == (bad, (), ())
    # NOTE: as Triton answers a python model that omits an output: the others, no error.
    assert part3.error is None
    assert [o.name for o in part3.outputs] == ["OUT0"]
    assert ok1.shared_blocks == part3.shared_blocks == ok4.shared_blocks == (block,)
    assert msg.handoffs[0].uses == 3
    np.testing.assert_array_equal(_read(cache, ok4, 0, np.float32), _outputs(4)["OUT0"])


def test_a_batch_of_errors_only_takes_no_block(arena: ArenaAllocator) -> None:
    bad = ErrorInfo(ErrorCode.INTERNAL, "boom", ORIGIN)
    msg, block, failed = write_answer_batch(
        arena, ClientRegions(), [(_req(1), bad), (_req(2), bad)], ORIGIN
    )
    assert (block, msg.handoffs, failed) == (None, (), [0, 1])
    assert arena.live_blocks() == 0


def test_no_room_for_the_one_block_raises_and_leaves_nothing_allocated() -> None:
    alloc = ArenaAllocator(f"/triton_mp_{os.getpid()}_test_ab{next(_prefixes)}", 4096, 4096)
    try:
        big = {"OUT0": np.zeros((1, 800), np.float32), "OUT1": np.zeros((1, 3), np.int64)}
        members = [(_req(r), big) for r in (1, 2)]
        with pytest.raises(TritonMPError):
            write_answer_batch(alloc, ClientRegions(), members, ORIGIN)
        assert alloc.live_blocks() == 0
    finally:
        alloc.close_and_unlink()


# --------------------------------------------------------------------------- the frontend


def _table(cache: SegmentCache, rids: list[int], order: object = None) -> PendingTable:
    table = PendingTable(cache)
    for _ in rids:
        rid = table.new_id()
        table.add_request(rid, None, lambda m: held.append(m), order=order)  # noqa: B023
    return table


held: list[InferResponse] = []


def _batch(arena: ArenaAllocator, rids: list[int]) -> tuple[AnswerBatch, BlockRef]:
    msg, block, _ = write_answer_batch(
        arena, ClientRegions(), [(_req(r), _outputs(r)) for r in rids], ORIGIN
    )
    assert block is not None
    return msg, block


@pytest.mark.parametrize("release_order", [(0, 1, 2), (2, 0, 1), (1, 2, 0)])
def test_the_frontend_frees_the_block_after_the_last_response_in_any_order(
    arena: ArenaAllocator, cache: SegmentCache, release_order: tuple[int, ...]
) -> None:
    async def main() -> None:
        held.clear()
        table = _table(cache, [1, 2, 3])
        msg, block = _batch(arena, [1, 2, 3])
        table.deliver([msg])
        assert [m.request_id for m in held] == [1, 2, 3]
        assert len(table) == 0
        for k, i in enumerate(release_order):
            assert _state(cache, block) == LIVE
            table.release(held[i])
            assert table.shared.pending() == (0 if k == 2 else 1)
        assert _state(cache, block) == FREE
        assert arena.live_blocks() == 0

    asyncio.run(main())


def test_a_response_released_while_delivering_counts_before_the_others_arrive(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    """A sink that copies out and releases at once (the HTTP path may), one response at a
    time: the block outlives the first releases and goes with the last."""

    async def main() -> None:
        table = PendingTable(cache)
        states: list[int] = []
        msg, block = _batch(arena, [1, 2])

        def sink(m: object) -> None:
            assert isinstance(m, InferResponse)
            states.append(_state(cache, block))
            table.release(m)

        for _ in range(2):
            table.add_request(table.new_id(), None, sink)
        table.deliver([msg])
        assert states == [LIVE, LIVE]
        assert _state(cache, block) == FREE
        assert table.shared.pending() == 0

    asyncio.run(main())


def test_held_and_orphaned_responses_of_a_batch_count_too(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    """preserve_ordering holds a response until an earlier request is answered; a response
    for a request already failed (the worker's restart race) is released on arrival."""

    async def main() -> None:
        held.clear()
        table = _table(cache, [1, 2], order=("m", 3))  # requests 1 and 2, in order
        msg, block = _batch(arena, [2, 7])  # 7: nobody waits for it any more
        table.deliver([msg])
        assert held == []  # 2 waits for 1; 7 was released
        assert table.shared.pending() == 1
        table.deliver([InferResponse(request_id=1, version=3)])
        assert [m.request_id for m in held] == [1, 2]
        assert _state(cache, block) == LIVE
        table.release(held[1])
        assert _state(cache, block) == FREE
        assert table.shared.pending() == 0

    asyncio.run(main())


def test_a_decoded_batch_frees_the_same_block(arena: ArenaAllocator, cache: SegmentCache) -> None:
    """Through the ring's codec, the responses' blocks are equal values, not the same object."""

    async def main() -> None:
        held.clear()
        table = _table(cache, [1, 2])
        msg, block = _batch(arena, [1, 2])
        table.deliver([msgspec.msgpack.decode(codec.encode(msg), type=AnswerBatch)])
        for m in list(held):
            table.release(m)
        assert _state(cache, block) == FREE

    asyncio.run(main())


def test_outputs_written_from_their_wire_form_and_one_unwritable_member_fail_alone(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    # NOTE: the inlined hot path of _place_all: a non-contiguous array and a BYTES tensor go
    # through their wire form, an output nobody asked for is left out, and an output of a
    # dtype Triton has no type for fails its request only; the block holds exactly the
    # others' aligned bytes (the failed member's bytes, counted first, are taken back).
    strided = np.arange(10, dtype=np.float32).reshape(1, 10)[:, ::2]
    words = np.array([[b"ab", b"", b"xyz"]], dtype=object)
    odd = {"OUT0": np.zeros((1, 100), np.float32), "OUT1": np.zeros((1, 2), np.complex64)}
    members = [
        (_req(1), {"OUT0": strided, "EXTRA": np.zeros(4, np.int8)}),
        (_req(2), odd),
        (_req(3, ("OUT0",)), {"OUT0": words}),
    ]
    msg, block, failed = write_answer_batch(arena, ClientRegions(), members, ORIGIN)
    assert failed == [1]
    assert block is not None
    first, bad, third = msg.responses
    assert bad.error is not None
    assert bad.error.code == ErrorCode.INTERNAL
    assert (bad.outputs, bad.shared_blocks) == ((), ())
    assert [(o.name, o.datatype, o.shape) for o in first.outputs] == [("OUT0", "FP32", (1, 5))]
    np.testing.assert_array_equal(_read(cache, first, 0, np.float32), strided)
    (ref,) = third.outputs
    assert (ref.datatype, ref.shape, ref.nbytes) == ("BYTES", (1, 3), 3 * 4 + 5)
    raw = bytes(cache.get(ref.segment).buf[ref.offset : ref.offset + ref.nbytes])
    assert raw == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x03\x00\x00\x00xyz"
    assert msg.handoffs[0].uses == 2
    # NOTE: 64 bytes for the 20 of OUT0 and 64 for the 17 of the BYTES output: none of
    # the failed member's 400 + 16 bytes are in the block.
    assert ref.offset - first.outputs[0].offset == 64
    block_bytes = np.frombuffer(cache.get(block.segment).buf, np.uint64, 1, block.offset + 8)[0]
    assert int(block_bytes) == 64 + 64 + 64  # the header, then the two outputs
