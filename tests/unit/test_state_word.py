"""A block's state word, the hand-over between an arena's owner and its reader (#37).

The owner writes ``LIVE`` into a block's header, a reader writes ``FREE`` once it is done,
and the owner takes the room over as soon as it reads ``FREE`` (``ipc.tensor_pool``). Each
change must therefore be one store, made once: ``struct.pack_into`` zero-fills a field and
then writes it again byte by byte, so a free through it published ``FREE`` early and wrote
the word again later, over the ``LIVE`` of the block the owner had put in that room
meanwhile (the server logged "refused to free block ...: state 0" with the new block's
generation). These tests pin the stores each side makes, and that a reader maps other
processes' arenas read-only, so any other store of a reader faults where it is made.

Segments are named ``/triton_mp_<pid>_test_word<n>_a<i>`` and unlinked by the fixtures.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Iterator

import numpy as np
import pytest

from triton_mp.ipc.memory.shm import Segment
from triton_mp.ipc.protocol.messages import BlockRef
from triton_mp.ipc.tensor_pool import (
    BLOCK_HEADER_BYTES,
    FREE,
    LIVE,
    ArenaAllocator,
    SegmentCache,
    block_ref,
    free_block,
    stray_frees,
)

_prefixes = itertools.count()
_HEADER = struct.Struct("<IIQ")


@pytest.fixture
def owner() -> Iterator[ArenaAllocator]:
    alloc = ArenaAllocator(f"/triton_mp_{os.getpid()}_test_word{next(_prefixes)}", 4096, 1 << 20)
    yield alloc
    alloc.close_and_unlink()


@pytest.fixture
def reader() -> Iterator[SegmentCache]:
    cache = SegmentCache()
    yield cache
    cache.close()


class _Stores:
    """Records every ``Segment.store_u32`` as (offset, value, the header's 16 bytes then)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, int, bytes]] = []
        real = Segment.store_u32

        def store(seg: Segment, offset: int, value: int) -> None:
            self.calls.append((offset, value, bytes(seg.buf[offset : offset + 16])))
            real(seg, offset, value)

        monkeypatch.setattr(Segment, "store_u32", store)


def test_a_reader_maps_another_processs_arena_read_only(
    owner: ArenaAllocator, reader: SegmentCache
) -> None:
    seg, off = owner.alloc(16)
    mapped = reader.get(seg.name)
    assert not mapped.writable
    with pytest.raises(TypeError):
        struct.pack_into("<I", mapped.buf, off, FREE)  # a stray store of a reader
    payload = np.ndarray((4,), np.int32, mapped.buf, off + BLOCK_HEADER_BYTES)
    assert not payload.flags.writeable
    assert _HEADER.unpack_from(seg.buf, off)[0] == LIVE


def test_a_readers_free_reaches_the_owner_and_changes_only_the_state_word(
    owner: ArenaAllocator, reader: SegmentCache
) -> None:
    seg, off = owner.alloc(16)
    ref = block_ref(seg, off)
    _, gen, size = _HEADER.unpack_from(seg.buf, off)
    assert free_block(reader.get(seg.name), ref)
    assert _HEADER.unpack_from(seg.buf, off) == (FREE, gen, size)
    assert owner.live_blocks() == 0
    before = stray_frees()
    assert not free_block(reader.get(seg.name), ref)  # the second free writes nothing
    assert stray_frees() == before + 1


def test_a_free_is_one_store_of_free_into_the_state_word(
    owner: ArenaAllocator, reader: SegmentCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    seg, off = owner.alloc(16)
    ref = block_ref(seg, off)
    own = block_ref(*owner.alloc(16))
    mapped = reader.get(seg.name)
    stores = _Stores(monkeypatch)
    assert free_block(mapped, ref)
    assert free_block(seg, own)  # the owner's own free (an answer never sent) too
    assert [(o, v) for o, v, _ in stores.calls] == [(off, FREE), (own.offset, FREE)]


def test_a_free_through_a_writable_mapping_leaves_the_rest_of_the_header(
    owner: ArenaAllocator,
) -> None:
    seg, off = owner.alloc(16)
    before = bytes(seg.buf[off : off + 16])
    assert free_block(seg, block_ref(seg, off))
    assert bytes(seg.buf[off : off + 16]) == struct.pack("<I", FREE) + before[4:]


def test_the_owner_writes_generation_and_size_before_it_writes_live(
    owner: ArenaAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that reads the header while the owner writes it sees the old block (FREE)
    or the whole new one, never LIVE beside the room's previous generation."""
    seg, first = owner.alloc(16)
    assert free_block(seg, block_ref(seg, first))
    stores = _Stores(monkeypatch)
    seg2, off = owner.alloc(16)  # the same room again: the arena is empty
    assert (seg2, off) == (seg, first)
    ((where, value, header_then),) = stores.calls
    assert (where, value) == (off, LIVE)
    state, gen, size = _HEADER.unpack_from(header_then)
    assert state == FREE  # not yet LIVE, but already the new generation and size
    assert (gen, size) == _HEADER.unpack_from(seg.buf, off)[1:]
    assert gen == 2


def test_store_u32_writes_one_word_of_either_mapping(
    owner: ArenaAllocator, reader: SegmentCache
) -> None:
    seg, off = owner.alloc(16)
    mapped = reader.get(seg.name)
    mapped.store_u32(off + 64, 0xA1B2C3D4)
    assert struct.unpack_from("<I", seg.buf, off + 64)[0] == 0xA1B2C3D4
    seg.store_u32(off + 68, 7)
    assert struct.unpack_from("<II", mapped.buf, off + 64) == (0xA1B2C3D4, 7)
    assert bytes(seg.buf[off + 72 : off + 80]) == bytes(8)


def test_closing_a_segment_unmaps_it_after_a_store(owner: ArenaAllocator) -> None:
    """``store_u32``'s word view must not keep the mapping alive (``close`` would then
    leave it mapped until the process exits)."""
    name = f"/triton_mp_{os.getpid()}_test_word{next(_prefixes)}_x"
    seg = Segment.create(name, 4096)
    try:
        seg.store_u32(64, LIVE)
        seg.close()
        assert seg.buf.closed
    finally:
        seg.unlink()
    attached_owner, _ = owner.alloc(16)
    cache = SegmentCache()
    mapped = cache.get(attached_owner.name)
    mapped.store_u32(64, FREE)
    cache.close()
    assert mapped.buf.closed


def test_a_reference_past_the_arena_is_refused_without_a_write(
    owner: ArenaAllocator, reader: SegmentCache
) -> None:
    seg, _ = owner.alloc(16)
    mapped = reader.get(seg.name)
    before = stray_frees()
    assert not free_block(mapped, BlockRef(seg.name, seg.size_bytes - 4, 1))
    assert stray_frees() == before + 1
