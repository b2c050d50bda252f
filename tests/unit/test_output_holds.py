"""The record of which frontend process holds a worker's output block in place, and the
copy mark (``ipc.output_holds``): a block starts with no holder (a stale one from its room's
previous block is cleared), ``free_held_by`` frees exactly the LIVE blocks of a dead holder
(never a block another process holds, one with no holder, or one its holder freed), and
blocks allocated past the fill mark are flagged ``COPY``. The C++ holder's side (the pid
written when a hold is armed, a ``COPY`` block copied) is in test_held_block_owner.py."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp.ipc.memory.shm import Segment
from triton_mp.ipc.output_holds import COPY, OutputArenas, hold_block, hold_of
from triton_mp.ipc.protocol.messages import BlockRef
from triton_mp.ipc.tensor_pool import FREE, LIVE, block_ref, free_block, stray_frees

_prefixes = itertools.count()
KIB = 1024


def _state(seg: Segment, off: int) -> int:
    return int.from_bytes(seg.buf[off : off + 4], "little")


@pytest.fixture
def arenas() -> Iterator[OutputArenas]:
    """Output arenas of 64 KiB each, a 1 MiB budget (the copy mark at 512 KiB)."""
    alloc = OutputArenas(f"/triton_mp_{os.getpid()}_test_oh{next(_prefixes)}", 64 * KIB, 1 << 20)
    try:
        yield alloc
    finally:
        alloc.close_and_unlink()


def test_a_new_block_names_no_holder_even_where_a_held_block_was(arenas: OutputArenas) -> None:
    seg, off = arenas.alloc(1000)
    assert hold_block(seg, block_ref(seg, off), 4242)
    assert hold_of(seg, off) == (4242, 0)
    assert free_block(seg, block_ref(seg, off))
    seg2, off2 = arenas.alloc(1000)
    assert (seg2.name, off2) == (seg.name, off)  # NOTE: the only block was freed: its room
    assert hold_of(seg2, off2) == (0, 0)
    assert arenas.free_held_by(4242) == 0
    assert _state(seg2, off2) == LIVE


def test_a_dead_holders_blocks_are_freed_and_no_one_elses(arenas: OutputArenas) -> None:
    blocks = [arenas.alloc(4 * KIB) for _ in range(5)]
    refs = [block_ref(seg, off) for seg, off in blocks]
    dead, alive = 1111, 2222
    assert hold_block(blocks[0][0], refs[0], dead)
    assert hold_block(blocks[1][0], refs[1], alive)
    assert hold_block(blocks[2][0], refs[2], dead)
    assert hold_block(blocks[3][0], refs[3], dead)
    assert free_block(blocks[3][0], refs[3])  # NOTE: its holder freed it before it died
    strays = stray_frees()
    assert arenas.free_held_by(0) == 0
    assert arenas.free_held_by(dead) == 2
    states = [_state(seg, off) for seg, off in blocks]
    assert states == [FREE, LIVE, FREE, FREE, LIVE]
    assert arenas.free_held_by(dead) == 0
    assert stray_frees() == strays
    # NOTE: the new process's free of what it holds still works (its generation is intact)
    assert free_block(blocks[1][0], refs[1])


def test_hold_block_writes_nothing_on_a_freed_or_reused_block(arenas: OutputArenas) -> None:
    seg, off = arenas.alloc(100)
    ref = block_ref(seg, off)
    stale = ref.__class__(ref.segment, ref.offset, ref.generation + 1)
    assert not hold_block(seg, stale, 7)
    assert free_block(seg, ref)
    assert not hold_block(seg, ref, 7)
    assert hold_of(seg, off) == (0, 0)


def test_blocks_past_the_fill_mark_are_flagged_copy(arenas: OutputArenas) -> None:
    got = [arenas.alloc(200 * KIB) for _ in range(4)]
    # NOTE: used after each: ~200, ~400, ~600, ~800 KiB of a 1 MiB budget (mark 512 KiB)
    assert [hold_of(seg, off)[1] for seg, off in got] == [0, 0, COPY, COPY]
    assert arenas.used() > 512 * KIB
    for seg, off in got:
        assert free_block(seg, block_ref(seg, off))
    seg, off = arenas.alloc(200 * KIB)
    assert hold_of(seg, off) == (0, 0)


def test_a_copy_mark_of_one_never_flags() -> None:
    alloc = OutputArenas(f"/triton_mp_{os.getpid()}_test_oh{next(_prefixes)}", 64 * KIB, 1 << 20, 1)
    try:
        got = [alloc.alloc(200 * KIB) for _ in range(4)]
        assert [hold_of(seg, off) for seg, off in got] == [(0, 0)] * 4
    finally:
        alloc.close_and_unlink()


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "hold", "free", "die"]), st.integers(0, 40)),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_freeing_a_dead_holders_blocks_matches_a_model(drawn: list[tuple[str, int]]) -> None:
    """Random allocations, holds by pids 1-3, frees by their holders and deaths: after each
    death exactly the blocks the model says are live stay LIVE, and no free is refused."""
    alloc = OutputArenas(f"/triton_mp_{os.getpid()}_test_oh{next(_prefixes)}", 64 * KIB, 1 << 20)
    live: dict[tuple[str, int], tuple[Segment, int, int]] = {}  # -> (segment, generation, holder)
    strays = stray_frees()
    try:
        for op, n in drawn:
            keys = sorted(live)
            if op == "alloc":
                try:
                    seg, off = alloc.alloc(1 + n * 1000)
                except Exception:  # noqa: BLE001 - the budget is full: a legitimate outcome
                    continue
                live[(seg.name, off)] = (seg, block_ref(seg, off).generation, 0)
            elif op == "hold" and keys:
                key = keys[n % len(keys)]
                seg, gen, holder = live[key]
                if holder == 0:
                    assert hold_block(seg, block_ref(seg, key[1]), 1 + n % 3)
                    live[key] = (seg, gen, 1 + n % 3)
            elif op == "free" and keys:
                key = keys[n % len(keys)]
                seg, _, _ = live.pop(key)
                assert free_block(seg, block_ref(seg, key[1]))
            elif op == "die":
                dead = 1 + n % 3
                expect = sum(1 for *_, h in live.values() if h == dead)
                assert alloc.free_held_by(dead) == expect
                live = {k: v for k, v in live.items() if v[2] != dead}
            for (_, off), (seg, _, _) in live.items():
                assert _state(seg, off) == LIVE
        assert stray_frees() == strays
    finally:
        alloc.close_and_unlink()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["alloc", "alloc", "free"]), st.integers(0, 300)), max_size=50
    ),
    st.sampled_from([0.05, 0.5, 1.0]),
)
def test_alloc_block_makes_the_block_alloc_and_block_ref_make(
    drawn: list[tuple[str, int]], mark: float
) -> None:
    """``OutputArenas.alloc_block`` (the answer writer's allocator) against its twin,
    ``answer_batch.alloc_block`` (``alloc`` then ``block_ref``), on two allocators given the
    same random allocations (some too large for an arena or the budget) and frees: the same
    payload offset, block reference (its arena by index), outcome, and every arena's bytes
    (headers, COPY flags) the same after each step."""
    from triton_mp.workers.tensors.answer_batch import alloc_block  # noqa: PLC0415

    pair = [
        OutputArenas(f"/triton_mp_{os.getpid()}_test_oh{next(_prefixes)}", 64 * KIB, 1 << 20, mark)
        for _ in range(2)
    ]
    live: list[tuple[BlockRef, BlockRef]] = []
    try:
        for op, n in drawn:
            if op == "free":
                if live:
                    blocks = live.pop(n % len(live))
                    for alloc, block in zip(pair, blocks, strict=True):
                        seg = next(s for s in alloc.segments() if s.name == block.segment)
                        assert free_block(seg, block)
                continue
            got = []
            for alloc, fn in zip(pair, (alloc_block, OutputArenas.alloc_block), strict=True):
                try:
                    buf, pos, block = fn(alloc, n * n * 13)
                except Exception as e:  # noqa: BLE001 - both must refuse alike
                    got.append((type(e), str(e)))
                    continue
                seg = next(s for s in alloc.segments() if s.name == block.segment)
                assert buf is seg.buf
                index = [s.name for s in alloc.segments()].index(block.segment)
                got.append((pos, block.offset, block.generation, index, block))
            assert got[0][:4] == got[1][:4]
            if len(got[0]) == 5:
                live.append((got[0][4], got[1][4]))  # type: ignore[misc]
            a, b = ([bytes(s.buf) for s in alloc.segments()] for alloc in pair)
            assert a == b
    finally:
        for alloc in pair:
            alloc.close_and_unlink()
