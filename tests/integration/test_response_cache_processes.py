"""The shared response cache across real processes (``ipc.memory.response_cache``).

A process killed while it holds the cache's lock in the middle of an insert must neither
block the others (the kernel drops its ``flock``) nor leave a half-written entry behind (the
next lock holder sees the dirty mark and empties the cache); two processes hammering one
cache never read bytes that were not stored under the key they asked for.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing as mp
import os
from collections.abc import Iterator

import numpy as np
import posix_ipc
import pytest

from triton_mp.ipc.memory import response_cache as rc
from triton_mp.ipc.memory.response_cache import SharedResponseCache

pytestmark = pytest.mark.timeout(60)


def _key(i: int) -> bytes:
    return i.to_bytes(8, "little") + (i ^ 0x5A5A).to_bytes(8, "little")


def _value(i: int) -> bytes:
    return bytes([i % 251]) * (50 + i % 300)


@pytest.fixture
def name() -> Iterator[str]:
    n = f"/triton_mp_{os.getpid()}_itest_cache"
    yield n
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(n)


def _die_mid_insert(name: str, locked: mp.synchronize.Event) -> None:
    """Do what insert() does up to the copy of the bytes, then get killed."""
    cache = SharedResponseCache.attach(name)
    fcntl.flock(cache._fd, fcntl.LOCK_EX)
    header = np.ndarray((rc.HEADER_WORDS,), np.uint64, cache._seg.buf, 0)
    header[rc.H_DIRTY] = 1
    cache._size[0] = 77  # a slot claimed, its bytes never written
    locked.set()
    os.kill(os.getpid(), 9)


def _hammer(name: str, start: int, rounds: int, bad: mp.sharedctypes.Synchronized) -> None:
    cache = SharedResponseCache.attach(name)
    for r in range(rounds):
        i = (start + r * 7) % 90
        got = cache.lookup(_key(i))
        if got is None:
            cache.insert(_key(i), _value(i))
        elif got != _value(i):
            with bad.get_lock():
                bad.value += 1
    cache.close()


def test_a_process_killed_mid_insert_blocks_nobody_and_leaves_no_half_entry(name: str) -> None:
    owner = SharedResponseCache.create(name, 8192)
    assert owner.insert(_key(1), b"before")
    ctx = mp.get_context("spawn")
    locked = ctx.Event()
    child = ctx.Process(target=_die_mid_insert, args=(name, locked))
    child.start()
    assert locked.wait(30)
    child.join(30)
    assert child.exitcode == -9
    # The lock died with it: this does not block, and sees an empty, usable cache.
    assert owner.lookup(_key(1)) is None
    st = owner.stats()
    assert st.recoveries == 1
    assert (st.entries, st.live_bytes) == (0, 0)
    assert owner.insert(_key(2), b"after")
    assert owner.lookup(_key(2)) == b"after"
    owner.close()


def test_two_processes_share_one_cache_without_mixing_entries(name: str) -> None:
    owner = SharedResponseCache.create(name, 16384)
    ctx = mp.get_context("spawn")
    bad = ctx.Value("i", 0)
    procs = [ctx.Process(target=_hammer, args=(name, s, 1500, bad)) for s in (0, 3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(50)
        assert p.exitcode == 0
    st = owner.stats()
    assert bad.value == 0
    assert st.hits > 0
    assert st.evictions > 0
    assert st.live_bytes <= 16384
    assert st.lookups == 3000
    owner.close()
