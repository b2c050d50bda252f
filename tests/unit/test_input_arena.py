"""``_native.InputArena`` (``frontend/native/input_arena.h``), the C++ twin of
``ipc.tensor_pool._Arena``: the same operations on both, over two copies of one arena, give the
same offsets, the same bytes in every header and the same counts; its binding refuses what
would break the layout. (``test_tensor_pool.py`` and ``test_block_generations.py`` run their
allocator tests over both as well.)"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp.frontend.native import input_arena_type
from triton_mp.ipc.tensor_pool import ARENA_HEADER_BYTES, FREE, _Arena

TWIN = input_arena_type()
pytestmark = pytest.mark.skipif(TWIN is None, reason="native extension not built")
_U32 = struct.Struct("<I")


class FakeSegment:
    """What an arena allocator reads of a ``Segment``: its name, size and writable mapping."""

    def __init__(self, size_bytes: int) -> None:
        self.name = "/fake"
        self.size_bytes = size_bytes
        self.buf = bytearray(size_bytes)

    def store_u32(self, offset: int, value: int) -> None:
        _U32.pack_into(self.buf, offset, value)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 24)),  # a block of n * 64 bytes
        st.tuples(st.just("free"), st.integers(0, 63)),  # the k-th unfreed block (mod)
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(
    capacity_blocks=st.integers(1, 40),
    generation=st.sampled_from([0, 7, 2**32 - 3]),
    ops=OPS,
)
def test_the_twin_decides_as_the_python_allocator(
    capacity_blocks: int, generation: int, ops: list[tuple[str, int]]
) -> None:
    size = ARENA_HEADER_BYTES + 64 * capacity_blocks
    py_seg, cc_seg = FakeSegment(size), FakeSegment(size)
    py, cc = _Arena(py_seg), TWIN(cc_seg)  # type: ignore[arg-type, misc]
    py.generation = cc.generation = generation
    assert cc.segment is cc_seg
    assert cc.capacity == py.capacity
    unfreed: list[int] = []
    for op, n in ops:
        if op == "alloc":
            at = py.try_alloc(64 * n)
            assert cc.try_alloc(64 * n) == at
            if at is not None:
                unfreed.append(at)
        elif unfreed:
            at = unfreed.pop(n % len(unfreed))
            for seg in (py_seg, cc_seg):
                _U32.pack_into(seg.buf, at, FREE)  # the reader's free
        assert cc.generation == py.generation
        assert cc_seg.buf == py_seg.buf
        assert (cc.live_blocks(), cc.unfreed_blocks()) == (py.live_blocks(), py.unfreed_blocks())
        assert cc.unfreed_blocks() == len(unfreed)


def test_the_binding_refuses_what_would_break_the_layout() -> None:
    assert TWIN is not None
    arena = TWIN(FakeSegment(ARENA_HEADER_BYTES + 1024))  # type: ignore[arg-type]
    for bad in (0, 32, 100):
        with pytest.raises(ValueError, match="multiple of 64"):
            arena.try_alloc(bad)
    with pytest.raises(OverflowError):
        arena.try_alloc(-64)
    with pytest.raises(OverflowError):
        arena.generation = 2**32
    assert arena.try_alloc(2048) is None  # more than the arena holds
    with pytest.raises(ValueError, match="header"):
        TWIN(FakeSegment(32))  # type: ignore[arg-type]
    small = FakeSegment(ARENA_HEADER_BYTES + 1024)
    arena = TWIN(small)  # type: ignore[arg-type]
    small.buf = bytearray(64)  # a mapping smaller than the arena: never written past
    with pytest.raises(ValueError, match="smaller"):
        arena.try_alloc(64)
    small.buf = bytes(ARENA_HEADER_BYTES + 1024)  # type: ignore[assignment]
    with pytest.raises(BufferError):
        arena.try_alloc(64)  # a read-only mapping
