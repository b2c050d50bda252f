"""Tensor arenas (``ipc.tensor_pool``): allocation, lazy oldest-first reclaim, growth, budget.

Arena segments are named ``/triton_mp_<pid>_test_pool<n>_a<i>``; every allocator is closed
and unlinked by the fixture (or the ``_allocator`` context manager) that made it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import random
import struct
import threading
from collections.abc import Callable, Iterator

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.native import input_arena_type
from triton_mp.ipc.memory import shm as shm_module
from triton_mp.ipc.memory.shm import Segment, ShmExhausted, list_objects
from triton_mp.ipc.tensor_pool import (
    ALIGN,
    ARENA_HEADER_BYTES,
    ARENA_MAGIC,
    BLOCK_HEADER_BYTES,
    FREE,
    LIVE,
    ArenaAllocator,
    ArenaExhausted,
    SegmentCache,
    SegmentGone,
    block_ref,
    free_block,
)

_prefixes = itertools.count()
TWIN = input_arena_type()
_BLOCK = struct.Struct("<IIQ")

Factory = Callable[..., ArenaAllocator]


def _prefix() -> str:
    return f"/triton_mp_{os.getpid()}_test_pool{next(_prefixes)}"


def _block_bytes(payload_bytes: int) -> int:
    """What the documented layout says a block of ``payload_bytes`` takes."""
    return BLOCK_HEADER_BYTES + (max(payload_bytes, 1) + ALIGN - 1) // ALIGN * ALIGN


def _header(seg: Segment, off: int) -> tuple[int, int, int]:
    return _BLOCK.unpack_from(seg.buf, off)


@contextlib.contextmanager
def _allocator(*args: int, **kwargs: object) -> Iterator[ArenaAllocator]:
    alloc = ArenaAllocator(_prefix(), *args, **kwargs)  # type: ignore[arg-type]
    try:
        yield alloc
    finally:
        alloc.close_and_unlink()


@pytest.fixture(params=["python", "native"])
def make_allocator(request: pytest.FixtureRequest) -> Iterator[Factory]:
    """Factory: ``make_allocator(arena_bytes, max_total_bytes, cache=None)``; each test runs
    with the Python allocator and with its C++ twin (``_native.InputArena``)."""
    extra = {}
    if request.param == "native":
        if TWIN is None:
            pytest.skip("native extension not built")
        extra["arena_type"] = TWIN
    with contextlib.ExitStack() as stack:
        yield lambda *a, **kw: stack.enter_context(_allocator(*a, **extra, **kw))


@pytest.fixture
def cache() -> Iterator[SegmentCache]:
    c = SegmentCache()
    yield c
    c.close()


# --------------------------------------------------------------------------- layout


def test_first_block_follows_the_arena_header(make_allocator: Factory) -> None:
    pool = make_allocator(4096, 1 << 20)
    seg, off = pool.alloc(100)
    assert off == ARENA_HEADER_BYTES
    assert seg.name.endswith("_a0")
    assert seg.size_bytes == 4096 + ARENA_HEADER_BYTES
    magic, version, capacity = struct.unpack_from("<IIQ", seg.buf, 0)
    assert (magic, version, capacity) == (ARENA_MAGIC, 1, 4096)
    assert _header(seg, off) == (LIVE, 1, _block_bytes(100))


@pytest.mark.parametrize("payload", [0, 1, 63, 64, 65, 100, 1000])
def test_payloads_are_64_byte_aligned(make_allocator: Factory, payload: int) -> None:
    pool = make_allocator(1 << 16, 1 << 20)
    offsets = [pool.alloc(payload)[1] for _ in range(5)]
    for off in offsets:
        assert (off + BLOCK_HEADER_BYTES) % 64 == 0
    # blocks are contiguous: each is header + payload rounded up to 64 (at least 64)
    steps = {b - a for a, b in itertools.pairwise(offsets)}
    assert steps == {_block_bytes(payload)}


def test_zero_payload_still_takes_one_aligned_unit(make_allocator: Factory) -> None:
    pool = make_allocator(4096, 1 << 20)
    seg, off = pool.alloc(0)
    assert _header(seg, off)[2] == BLOCK_HEADER_BYTES + ALIGN


# --------------------------------------------------------------------------- free / reclaim


def test_free_then_reclaim_returns_the_space(make_allocator: Factory) -> None:
    pool = make_allocator(4096, 1 << 20)
    seg, a = pool.alloc(100)
    _, b = pool.alloc(100)
    assert pool.live_blocks() == 2
    free_block(seg, block_ref(seg, a))
    assert _header(seg, a)[0] == FREE
    assert pool.live_blocks() == 1
    free_block(seg, block_ref(seg, b))
    assert pool.live_blocks() == 0
    # an empty arena starts again at its beginning
    seg2, c = pool.alloc(100)
    assert (seg2.name, c) == (seg.name, ARENA_HEADER_BYTES)


def test_reclaim_is_oldest_first(make_allocator: Factory) -> None:
    pool = make_allocator(4096, 1 << 20)
    seg, a = pool.alloc(10)
    _, b = pool.alloc(10)
    _, c = pool.alloc(10)
    free_block(seg, block_ref(seg, c))
    free_block(seg, block_ref(seg, b))
    # a is the oldest and still live: b and c stay accounted for until a is freed
    assert pool.live_blocks() == 3
    free_block(seg, block_ref(seg, a))
    assert pool.live_blocks() == 0


def test_wraparound_reuses_space_freed_at_the_start(make_allocator: Factory) -> None:
    pool = make_allocator(1024, 1 << 20)  # four 256-byte blocks fill the arena
    seg, a = pool.alloc(192)
    _, b = pool.alloc(192)
    _, c = pool.alloc(192)
    assert (a, b, c) == (64, 320, 576)
    free_block(seg, block_ref(seg, a))
    seg_d, d = pool.alloc(192)  # the last slot before the end
    assert (seg_d.name, d) == (seg.name, 832)
    seg_e, e = pool.alloc(192)  # wraps into the slot a left
    assert (seg_e.name, e) == (seg.name, 64)
    assert len(list(pool.segments())) == 1
    # the arena is full again: [b, c, d, e]
    seg_f, f = pool.alloc(192)
    assert seg_f.name != seg.name
    for off in (b, c, d, e):
        free_block(seg, block_ref(seg, off))
    free_block(seg_f, block_ref(seg_f, f))
    assert pool.live_blocks() == 0


def test_wrapped_arena_never_allocates_into_the_oldest_live_block(
    make_allocator: Factory,
) -> None:
    pool = make_allocator(1024, 1 << 20)
    seg, a = pool.alloc(192)  # [64, 320)
    pool.alloc(192)  # b: [320, 576), now the oldest once a is freed
    pool.alloc(192)  # c: [576, 832)
    free_block(seg, block_ref(seg, a))
    pool.alloc(192)  # d: [832, 1088), up to the end
    seg_e, e = pool.alloc(64)  # e: 128 bytes, wrapped to [64, 192)
    assert (seg_e.name, e) == (seg.name, 64)
    # 128 bytes are free before b; a 192-byte block must go to a new arena
    seg_f, f = pool.alloc(128)
    assert seg_f.name != seg.name
    # a 128-byte block still fits exactly before b
    seg_g, g = pool.alloc(64)
    assert (seg_g.name, g) in {(seg.name, 192), (seg_f.name, f + 192)}


def test_wraparound_many_times_in_one_arena(make_allocator: Factory) -> None:
    pool = make_allocator(1024, 1024 + ARENA_HEADER_BYTES)  # no room for a second arena
    live: list[tuple[Segment, int]] = []
    seen_offsets = set()
    for i in range(500):
        seg, off = pool.alloc(64 + (i % 3) * 64)  # blocks of 128, 192, 256 bytes
        seg.buf[off + BLOCK_HEADER_BYTES] = i & 0xFF
        live.append((seg, off))
        seen_offsets.add(off)
        if len(live) > 2:
            old_seg, old_off = live.pop(0)
            free_block(old_seg, block_ref(old_seg, old_off))
    assert len(list(pool.segments())) == 1
    assert len(seen_offsets) > 4
    for seg, off in live:
        free_block(seg, block_ref(seg, off))
    assert pool.live_blocks() == 0


def test_out_of_order_frees_do_not_reclaim_past_a_live_block(make_allocator: Factory) -> None:
    pool = make_allocator(1024, 1 << 20)
    blocks = [pool.alloc(192) for _ in range(4)]  # arena 0 full
    seg0 = blocks[0][0]
    for seg, off in blocks[1:]:
        free_block(seg, block_ref(seg, off))
    assert pool.live_blocks() == 4  # the oldest still blocks reclamation
    seg, off = pool.alloc(192)
    assert seg.name != seg0.name
    assert seg.name.endswith("_a1")
    assert len(list(pool.segments())) == 2
    free_block(seg0, block_ref(seg0, blocks[0][1]))
    assert pool.live_blocks() == 1  # now all of arena 0 comes back at once
    free_block(seg, block_ref(seg, off))
    assert pool.live_blocks() == 0


def test_a_block_larger_than_an_arena_gets_its_own_larger_arena(make_allocator: Factory) -> None:
    pool = make_allocator(1024, 1 << 20)
    seg, off = pool.alloc(5000)
    block = _block_bytes(5000)
    assert seg.size_bytes == 2 * block + ARENA_HEADER_BYTES
    assert off == ARENA_HEADER_BYTES
    free_block(seg, block_ref(seg, off))
    assert pool.live_blocks() == 0


# --------------------------------------------------------------------------- budget


def test_arena_exhausted_over_budget_then_recovers(make_allocator: Factory) -> None:
    pool = make_allocator(1024, 1024 + ARENA_HEADER_BYTES)  # exactly one arena
    blocks = [pool.alloc(192) for _ in range(4)]
    with pytest.raises(ArenaExhausted, match="budget of 1088 bytes is exhausted") as info:
        pool.alloc(1)
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert len(list(pool.segments())) == 1
    seg, off = blocks[0]
    free_block(seg, block_ref(seg, off))
    seg2, off2 = pool.alloc(192)
    assert (seg2.name, off2) == (seg.name, off)


def test_an_arena_is_cut_to_what_is_left_of_the_budget(make_allocator: Factory) -> None:
    pool = make_allocator(4096, 4096)  # the first arena would be 4096 + its header
    seg, _ = pool.alloc(1)
    assert seg.size_bytes == 4096
    # 4096 - header - one 128-byte block is left: a block of exactly that fits.
    left = 4096 - ARENA_HEADER_BYTES - _block_bytes(1) - BLOCK_HEADER_BYTES
    seg2, _ = pool.alloc(left)
    assert seg2.name == seg.name


def test_a_block_that_can_never_fit_the_budget(make_allocator: Factory) -> None:
    pool = make_allocator(1024, 1 << 16)
    with pytest.raises(TritonMPError, match="tensors of 100000 bytes exceed the 65536-byte") as e:
        pool.alloc(100_000)
    assert e.value.code == ErrorCode.RESOURCE_EXHAUSTED
    assert "--arena-budget-bytes" in e.value.message
    assert list(pool.segments()) == []
    pool.alloc(1000)  # the allocator still works


def test_a_full_dev_shm_is_an_error_not_a_sigbus(
    make_allocator: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm_module.os, "posix_fallocate", no_room)
    pool = make_allocator(1 << 16, 1 << 20)
    with pytest.raises(ShmExhausted, match="no room in shared memory") as e:
        pool.alloc(10)
    assert e.value.code == ErrorCode.RESOURCE_EXHAUSTED
    assert "--shm-size" in e.value.message
    assert list(pool.segments()) == []
    assert not [n for n in list_objects(str(os.getpid())) if "test_pool" in n]
    monkeypatch.undo()
    pool.alloc(10)


def test_new_segments_have_their_pages_reserved(make_allocator: Factory) -> None:
    pool = make_allocator(1 << 20, 1 << 22)
    seg, _ = pool.alloc(10)
    st = os.stat("/dev/shm/" + seg.name.lstrip("/"))
    assert st.st_blocks * 512 >= seg.size_bytes


# --------------------------------------------------------------------------- reader side


def test_segment_cache_attaches_by_name_and_frees_for_the_owner(
    make_allocator: Factory, cache: SegmentCache
) -> None:
    pool = make_allocator(4096, 1 << 20)
    seg, off = pool.alloc(16)
    seg.buf[off + BLOCK_HEADER_BYTES : off + BLOCK_HEADER_BYTES + 16] = b"0123456789abcdef"

    reader = cache.get(seg.name)
    assert reader is not seg
    assert cache.get(seg.name) is reader  # attached once
    assert bytes(reader.buf[off + BLOCK_HEADER_BYTES : off + BLOCK_HEADER_BYTES + 16]) == (
        b"0123456789abcdef"
    )
    free_block(reader, block_ref(reader, off))  # the reader is the last user
    assert pool.live_blocks() == 0


def test_segment_cache_sees_arenas_created_after_it(
    make_allocator: Factory, cache: SegmentCache
) -> None:
    pool = make_allocator(1024, 1 << 20)
    first = [pool.alloc(192) for _ in range(4)]
    seg1, off1 = pool.alloc(192)  # a new arena
    assert bytes(cache.get(seg1.name).buf[off1 : off1 + 4]) == struct.pack("<I", LIVE)
    for seg, off in [*first, (seg1, off1)]:
        free_block(cache.get(seg.name), block_ref(seg, off))
    assert pool.live_blocks() == 0


def test_owner_cache_registers_its_own_arenas(make_allocator: Factory) -> None:
    own = SegmentCache()
    pool = make_allocator(1024, 1 << 20, cache=own)
    seg, _ = pool.alloc(10)
    # NOTE: get() returns the owner's mapping, not a second attach.
    assert own.get(seg.name) is seg
    own.close()  # does not unlink: the allocator's teardown still does that


def test_segment_cache_get_unknown_name_raises() -> None:
    c = SegmentCache()
    # NOTE: a TritonMPError (UNAVAILABLE): a request naming a dead owner's arena fails alone.
    with pytest.raises(SegmentGone) as e:
        c.get(f"/triton_mp_{os.getpid()}_test_pool_missing")
    assert e.value.code is ErrorCode.UNAVAILABLE
    c.close()


# --------------------------------------------------------------------------- property


@settings(max_examples=600, deadline=None)
@given(
    arena_bytes=st.sampled_from([1024, 4096]),
    ops=st.lists(
        st.one_of(
            st.tuples(
                st.just("alloc"),
                # whole 64-byte units make exact fits (and near misses) common
                st.one_of(
                    st.integers(0, 6).map(lambda k: 64 * k),
                    st.integers(0, 6).map(lambda k: 64 * k),
                    st.integers(0, 3000),
                ),
            ),
            # index into live blocks in allocation order: mostly the oldest (the common
            # case, which makes arenas wrap), sometimes any
            st.tuples(st.just("free"), st.one_of(st.just(0), st.integers(0, 1 << 30))),
        ),
        max_size=120,
    ),
    final_order=st.randoms(use_true_random=False),
)
def test_live_blocks_never_overlap_and_all_space_comes_back(
    arena_bytes: int, ops: list[tuple[str, int]], final_order: random.Random
) -> None:
    with _allocator(arena_bytes, 64 << 20) as pool:
        live: dict[tuple[str, int], tuple[Segment, int, int, int]] = {}  # -> seg, size, tag
        tag = 0

        def check_no_overlap() -> None:
            by_seg: dict[str, list[tuple[int, int]]] = {}
            for (name, off), (seg, block, _, _) in live.items():
                assert off >= ARENA_HEADER_BYTES
                assert off + block <= seg.size_bytes
                by_seg.setdefault(name, []).append((off, off + block))
            for spans in by_seg.values():
                spans.sort()
                for (_, end), (start, _) in itertools.pairwise(spans):
                    assert end <= start, f"overlapping blocks {spans}"

        def free(key: tuple[str, int]) -> None:
            seg, _, size, t = live.pop(key)
            pay = key[1] + BLOCK_HEADER_BYTES
            # the bytes written at alloc time are intact: nobody else got this space
            assert bytes(seg.buf[pay : pay + size]) == bytes([t]) * size
            free_block(seg, block_ref(seg, key[1]))

        for op, arg in ops:
            if op == "alloc":
                seg, off = pool.alloc(arg)
                assert (off + BLOCK_HEADER_BYTES) % ALIGN == 0
                key = (seg.name, off)
                assert key not in live
                tag = (tag + 1) % 256
                seg.buf[off + BLOCK_HEADER_BYTES : off + BLOCK_HEADER_BYTES + arg] = (
                    bytes([tag]) * arg
                )
                live[key] = (seg, _header(seg, off)[2], arg, tag)
                assert _header(seg, off)[2] == _block_bytes(arg)
                check_no_overlap()
            elif live:
                free(list(live)[arg % len(live)])
        arenas_before = len(list(pool.segments()))
        keys = sorted(live)
        final_order.shuffle(keys)
        for key in keys:
            free(key)
        assert pool.live_blocks() == 0
        # every arena is empty again: a block that fits one needs no new arena
        if arenas_before:
            pool.alloc(arena_bytes // 2)
            assert len(list(pool.segments())) == arenas_before


# ----------------------------------------------------------- a stopping owner's readers


def test_await_readers_returns_at_once_when_every_block_was_freed(make_allocator: Factory) -> None:
    pool = make_allocator(4096, 1 << 20)
    assert pool.await_readers(0.0) == 0  # nothing ever written
    blocks = [pool.alloc(100) for _ in range(3)]
    for seg, off in blocks:
        free_block(seg, block_ref(seg, off))
    assert pool.await_readers(30.0) == 0  # would time out if it waited


def test_await_readers_counts_a_block_freed_behind_an_unfreed_one_as_read(
    make_allocator: Factory,
) -> None:
    pool = make_allocator(4096, 1 << 20)
    (s0, o0), (s1, o1), (s2, o2) = (pool.alloc(100) for _ in range(3))
    free_block(s1, block_ref(s1, o1))  # freed out of order: the oldest stays unfreed
    assert pool.live_blocks() == 3
    assert pool.await_readers(0.01) == 2
    free_block(s0, block_ref(s0, o0))
    assert pool.await_readers(0.01) == 1


def test_await_readers_returns_when_a_reader_frees_the_last_block(
    make_allocator: Factory,
) -> None:
    pool = make_allocator(4096, 1 << 20)
    seg, off = pool.alloc(100)
    reader = threading.Timer(0.05, free_block, args=(seg, block_ref(seg, off)))
    reader.start()
    try:
        assert pool.await_readers(30.0) == 0
    finally:
        reader.cancel()


def test_await_readers_gives_up_after_its_timeout(make_allocator: Factory) -> None:
    pool = make_allocator(4096, 1 << 20)
    pool.alloc(100)
    pool.alloc(100)
    assert pool.await_readers(0.02) == 2
