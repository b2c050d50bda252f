"""The shared response cache's index and arena (``ipc.memory.response_cache``): no processes.

Two handles on one segment stand for two frontend processes (each has its own descriptor,
hence its own ``flock``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np
import posix_ipc
import pytest

from triton_mp.ipc.memory import response_cache as rc
from triton_mp.ipc.memory.response_cache import SharedResponseCache


def _key(i: int) -> bytes:
    return i.to_bytes(8, "little") + (i * 7 + 1).to_bytes(8, "little")


@pytest.fixture
def cache_name() -> Iterator[str]:
    name = f"/triton_mp_{os.getpid()}_test_cache"
    yield name
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(name)


def _make(name: str, size: int) -> tuple[SharedResponseCache, SharedResponseCache]:
    owner = SharedResponseCache.create(name, size)
    return owner, SharedResponseCache.attach(name)


def test_an_insert_by_one_process_is_a_hit_for_another(cache_name: str) -> None:
    a, b = _make(cache_name, 4096)
    assert b.lookup(_key(1)) is None
    assert a.insert(_key(1), b"hello")
    assert b.lookup(_key(1)) == b"hello"
    assert b.lookup(_key(2)) is None
    st = a.stats()
    assert (st.lookups, st.hits, st.misses, st.entries, st.live_bytes) == (3, 1, 2, 1, 5)
    assert st.inserts == 1
    b.close()
    a.close()


def test_lru_eviction_keeps_the_cache_within_its_size(cache_name: str) -> None:
    a, b = _make(cache_name, 1000)
    for i in range(4):
        assert a.insert(_key(i), bytes([i]) * 300)
    # 4 x 300 > 1000: the least recently used (0) went.
    assert a.lookup(_key(0)) is None
    assert b.lookup(_key(1)) == b"\x01" * 300  # 1 is now the most recently used
    assert a.insert(_key(9), b"\x09" * 300)  # evicts 2, the LRU one
    assert b.lookup(_key(2)) is None
    assert b.lookup(_key(1)) is not None
    assert b.lookup(_key(3)) is not None
    st = a.stats()
    assert st.live_bytes <= 1000
    assert st.entries == 3
    assert st.evictions == 2
    b.close()
    a.close()


def test_holes_are_compacted_and_bytes_survive(cache_name: str) -> None:
    a, _b = _make(cache_name, 1000)
    rng = np.random.default_rng(0)
    stored: dict[int, bytes] = {}
    for i in range(200):
        data = rng.integers(0, 255, int(rng.integers(1, 400)), dtype=np.uint8).tobytes()
        assert a.insert(_key(i), data)
        stored[i] = data
        st = a.stats()
        assert st.live_bytes <= 1000
    hits = 0
    for i, data in stored.items():
        got = a.lookup(_key(i))
        if got is not None:
            assert got == data
            hits += 1
    assert hits == a.stats().entries >= 2
    _b.close()
    a.close()


def test_an_entry_larger_than_the_cache_is_refused(cache_name: str) -> None:
    a, _b = _make(cache_name, 100)
    assert not a.insert(_key(1), b"x" * 101)
    assert a.stats().entries == 0
    _b.close()
    a.close()


def test_a_mutation_left_half_done_is_wiped_by_the_next_lock_holder(cache_name: str) -> None:
    a, b = _make(cache_name, 4096)
    assert a.insert(_key(1), b"kept?")
    # What a frontend killed inside insert() leaves: the dirty mark, a claimed slot.
    header = np.ndarray((rc.HEADER_WORDS,), np.uint64, a._seg.buf, 0)
    header[rc.H_DIRTY] = 1
    del header
    assert b.lookup(_key(1)) is None
    st = b.stats()
    assert st.recoveries == 1
    assert st.entries == 0
    assert st.live_bytes == 0
    assert b.insert(_key(2), b"fresh")
    assert a.lookup(_key(2)) == b"fresh"
    b.close()
    a.close()


def test_a_second_insert_of_the_same_key_keeps_one_entry(cache_name: str) -> None:
    a, b = _make(cache_name, 4096)
    assert a.insert(_key(5), b"one")
    assert b.insert(_key(5), b"two")
    assert a.stats().entries == 1
    assert b.lookup(_key(5)) == b"one"
    b.close()
    a.close()


def test_a_full_index_evicts_even_when_bytes_remain(cache_name: str) -> None:
    a, _b = _make(cache_name, 1 << 20)
    slots = rc.slots_for(1 << 20)
    for i in range(slots + 10):
        assert a.insert(_key(i), b"z")
    st = a.stats()
    limit = slots * 3 // 4  # the index is kept at most 3/4 full: probe paths stay short
    assert st.entries == limit
    assert st.evictions == slots + 10 - limit
    assert a.lookup(_key(0)) is None
    assert a.lookup(_key(slots + 9)) == b"z"
    _b.close()
    a.close()
