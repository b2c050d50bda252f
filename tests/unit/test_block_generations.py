"""Block generations (``ipc.tensor_pool``): every allocation's number is in its header and in
its ``BlockRef``; ``free_block`` frees only the block the reference names, so a second free,
or one that comes after the block's room was reused, writes nothing and is counted.

No processes: arenas named ``/triton_mp_<pid>_test_gen<n>``, unlinked by the fixture.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
from collections.abc import Iterator

import numpy as np
import pytest

from triton_mp.frontend.native import input_arena_type
from triton_mp.ipc.protocol.messages import AnswerBatch, BlockRef, Handoff, InferResponse
from triton_mp.ipc.tensor_pool import (
    BLOCK_HEADER_BYTES,
    FREE,
    LIVE,
    ArenaAllocator,
    SegmentCache,
    SharedBlocks,
    block_ref,
    free_block,
    stray_frees,
)

_prefixes = itertools.count()
TWIN = input_arena_type()
_HEADER = struct.Struct("<IIQ")


@pytest.fixture(params=["python", "native"])
def pool(request: pytest.FixtureRequest) -> Iterator[ArenaAllocator]:
    """An allocator with the Python arenas, and one with their C++ twin (``InputArena``)."""
    prefix = f"/triton_mp_{os.getpid()}_test_gen{next(_prefixes)}"
    if request.param == "native":
        if TWIN is None:
            pytest.skip("native extension not built")
        alloc = ArenaAllocator(prefix, 4096, 1 << 20, arena_type=TWIN)
    else:
        alloc = ArenaAllocator(prefix, 4096, 1 << 20)
    yield alloc
    alloc.close_and_unlink()


def test_each_block_has_its_own_generation_in_its_header_and_its_reference(
    pool: ArenaAllocator,
) -> None:
    refs = [block_ref(*pool.alloc(100)) for _ in range(3)]
    assert [r.generation for r in refs] == [1, 2, 3]
    seg = next(pool.segments())
    for r in refs:
        assert _HEADER.unpack_from(seg.buf, r.offset)[:2] == (LIVE, r.generation)


def test_generations_wrap_around_without_zero(pool: ArenaAllocator) -> None:
    block_ref(*pool.alloc(100))
    pool._arenas[0].generation = 2**32 - 2
    assert [block_ref(*pool.alloc(100)).generation for _ in range(3)] == [2**32 - 1, 1, 2]


def test_a_free_frees_the_block_it_names(pool: ArenaAllocator) -> None:
    seg, off = pool.alloc(100)
    before = stray_frees()
    assert free_block(seg, block_ref(seg, off))
    assert _HEADER.unpack_from(seg.buf, off)[0] == FREE
    assert stray_frees() == before


def test_a_second_free_of_a_block_writes_nothing_and_is_counted(pool: ArenaAllocator) -> None:
    seg, off = pool.alloc(100)
    ref = block_ref(seg, off)
    assert free_block(seg, ref)
    before = stray_frees()
    assert not free_block(seg, ref)
    assert stray_frees() == before + 1


def test_a_late_free_of_a_block_whose_room_was_reused_leaves_the_new_block_live(
    pool: ArenaAllocator,
) -> None:
    """Everything freed: the next block starts at the same offset (a new generation); the
    old reference's free must not free it."""
    seg, off = pool.alloc(100)
    old = block_ref(seg, off)
    assert free_block(seg, old)
    seg2, off2 = pool.alloc(100)
    new = block_ref(seg2, off2)
    assert (new.segment, new.offset) == (old.segment, old.offset)
    assert new.generation != old.generation
    before = stray_frees()
    assert not free_block(seg, old)
    assert _HEADER.unpack_from(seg.buf, off)[0] == LIVE
    assert stray_frees() == before + 1
    assert pool.live_blocks() == 1


def test_a_late_free_that_lands_inside_a_later_blocks_payload_writes_nothing(
    pool: ArenaAllocator,
) -> None:
    """The soak's wrong answer (element 32 read as 0, on a 64-byte boundary): an old block's
    header offset now lies inside a larger block's payload; a stray free wrote FREE (0)
    there. With generations the payload stays as written."""
    seg, a = pool.alloc(100)
    _, b = pool.alloc(100)
    ra, rb = block_ref(seg, a), block_ref(seg, b)
    assert free_block(seg, ra)
    assert free_block(seg, rb)
    _, c = pool.alloc(1000)
    assert c == a < b < c + BLOCK_HEADER_BYTES + 1000
    payload = np.frombuffer(seg.buf, np.float32, 250, c + BLOCK_HEADER_BYTES)
    payload[:] = 7.0
    assert not free_block(seg, rb)
    assert (payload == 7.0).all()


def test_a_free_past_the_arena_end_writes_nothing(pool: ArenaAllocator) -> None:
    seg, _ = pool.alloc(100)
    before = stray_frees()
    assert not free_block(seg, BlockRef(seg.name, seg.size_bytes - 8, 1))
    assert stray_frees() == before + 1


def test_the_first_refusal_is_logged_and_the_next_ones_only_counted(
    pool: ArenaAllocator, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import triton_mp.ipc.tensor_pool as tensor_pool

    monkeypatch.setattr(tensor_pool, "_stray", 0)
    seg, off = pool.alloc(100)
    ref = block_ref(seg, off)
    free_block(seg, ref)
    with caplog.at_level(logging.ERROR, logger="triton_mp.ipc.tensor_pool"):
        free_block(seg, ref)
        free_block(seg, ref)
    assert stray_frees() == 2
    assert len([r for r in caplog.records if "refused to free block" in r.getMessage()]) == 1


def test_a_count_left_for_an_old_block_does_not_free_a_new_block_at_its_offset() -> None:
    """``SharedBlocks`` counts by reference: a release counted against a block that was
    freed meanwhile (an old generation) does not count for the block that took its offset."""
    old, new = BlockRef("/a", 64, 1), BlockRef("/a", 64, 2)
    shares = SharedBlocks()
    stray = InferResponse(request_id=1, version=1, shared_blocks=(old,))
    assert shares.released(stray) == []  # NOTE: no handoff of ``old`` ever comes
    batch = AnswerBatch(
        responses=(
            InferResponse(request_id=2, version=1, shared_blocks=(new,)),
            InferResponse(request_id=3, version=1, shared_blocks=(new,)),
        ),
        handoffs=(Handoff(new, 2),),
    )
    assert shares.arrived(batch) == []
    assert shares.released(batch.responses[0]) == []
    assert shares.released(batch.responses[1]) == [new]


def _rss_shmem_kib() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssShmem:"))


def test_an_arena_is_mapped_whole_by_its_owner_and_by_a_reader_on_first_use() -> None:
    """Resident memory is flat after warm-up: a process maps every page of an arena when it
    first maps it, not page by page as blocks reach deeper (the soak's +5% RssShmem)."""
    size = 8 << 20
    alloc = ArenaAllocator(f"/triton_mp_{os.getpid()}_test_gen{next(_prefixes)}", size, 4 * size)
    cache = SegmentCache()
    try:
        before = _rss_shmem_kib()
        seg, _ = alloc.alloc(100)
        owner = _rss_shmem_kib() - before
        cache.get(seg.name)  # NOTE: a second mapping of the same pages, as a reader's
        reader = _rss_shmem_kib() - before - owner
        assert owner >= 0.95 * size / 1024
        assert reader >= 0.95 * size / 1024
    finally:
        cache.close()
        alloc.close_and_unlink()
