"""The local response cache: one shared-memory index and arena for every frontend process.

Created (zeroed) by the supervisor (``supervisor.processes.wiring``) when ``--cache-config
local,size=N``
(or the deprecated ``--response-cache-byte-size N``) is given; attached by every frontend,
which looks responses up and inserts them (``frontend.cache.response``), and read by frontend
0 for the ``nv_cache_*`` metrics. A hit therefore does not depend on which frontend a
connection landed on. Entries are opaque bytes under a 16-byte key; this module knows nothing
of requests or tensors. Imports numpy (the frontend's), so the scheduler never imports it.

Layout of the segment ``/triton_mp_<server>_cache`` (all little-endian uint64):

====================  =========================================================================
part                  what it holds
====================  =========================================================================
header[24]            ``H_*`` fields below: magic, slot count, arena size, the arena's end,
                      live bytes and entries, the LRU clock, the counters, the dirty mark,
                      the tombstone count
key_lo[slots]         low 8 bytes of each slot's key
key_hi[slots]         high 8 bytes of each slot's key
offset[slots]         where the slot's bytes start in the arena
size[slots]           how many bytes the slot holds; 0 = the slot is free
tick[slots]           the LRU clock when the slot was last inserted or hit
tomb[slots]           1: the slot's entry was evicted (a tombstone on probe paths)
arena[capacity]       entry bytes, packed from 0 up to ``H_END``
====================  =========================================================================

Concurrency: one exclusive ``flock`` on the segment's file (every attacher opens the object
itself, so each process holds its own open file description) guards every read and write of
the index and the arena, including the copy of a hit's bytes out and of a new entry's bytes
in (a few microseconds for typical responses). The kernel drops the lock of a process that
dies, so a frontend killed while it holds the lock never blocks the others.

Crash safety: a mutation (insert, eviction, compaction) sets ``H_DIRTY`` to 1 before it
changes anything and back to 0 when the index and the arena agree again. Whoever takes the
lock and finds ``H_DIRTY`` set knows that the previous holder died in the middle of a
mutation (only a lock holder mutates, and it clears the mark before it unlocks), and empties
the cache before using it (``H_RECOVERIES`` counts it). An entry's ``size`` is written last,
after its bytes, so even a lookup never sees a half-written entry. Emptying is the whole
recovery: the cache holds nothing that cannot be recomputed.

Index: open addressing with linear probing from ``key_lo mod slots``; an evicted entry
leaves a tombstone that lookups step over, the index is rebuilt when tombstones pass a
quarter of the slots, and live entries never pass three quarters (the least recently used
is evicted first), so a lookup touches a few slots whatever the cache's size.

Space: entries are packed one after another; an eviction leaves a hole, and when a new entry
does not fit after the last one the live entries are moved down (compaction, a memmove of at
most ``capacity`` bytes, rare). ``H_LIVE`` (the bytes of live entries) never exceeds the
arena's size: an insert first evicts least recently used entries (lowest ``tick``) until the
new entry fits, or until a slot is free.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import posix_ipc

from triton_mp.ipc.memory.shm import Segment

log = logging.getLogger(__name__)

MAGIC = int.from_bytes(b"TMPCACH1", "little")
H_MAGIC = 0
H_SLOTS = 1
"""Number of index slots."""
H_CAPACITY = 2
"""Arena size in bytes (the ``size`` of ``--cache-config local,size=N``)."""
H_END = 3
"""Arena bytes in use from 0, holes included."""
H_LIVE = 4
"""Bytes of live entries (<= ``H_CAPACITY``)."""
H_ENTRIES = 5
H_TICK = 6
"""The LRU clock: +1 per insert and per hit."""
H_LOOKUPS = 7
H_HITS = 8
H_MISSES = 9
H_EVICTIONS = 10
H_INSERTS = 11
H_LOOKUP_NS = 12
"""Total nanoseconds spent in lookups (lock wait included)."""
H_INSERT_NS = 13
"""Total nanoseconds spent in inserts (lock wait included)."""
H_RECOVERIES = 14
"""Times a lock holder found a mutation a dead process left half done."""
H_DIRTY = 15
"""1 while a mutation is under way (see the module docstring)."""
H_TOMBS = 16
"""Slots whose entry was evicted (tombstones on probe paths)."""
HEADER_WORDS = 24
_LO, _HI, _OFF, _SIZE, _TICK, _TOMB = range(6)
_COLUMNS = 6
"""key_lo, key_hi, offset, size, tick, tomb."""

MIN_SLOT_BYTES = 256
"""One index slot per this many arena bytes (at least 64 slots, at most 1 << 16)."""


def slots_for(capacity_bytes: int) -> int:
    """How many index slots a cache of ``capacity_bytes`` gets."""
    return max(64, min(1 << 16, capacity_bytes // MIN_SLOT_BYTES))


def segment_bytes(capacity_bytes: int) -> int:
    """The size of the whole segment for an arena of ``capacity_bytes``."""
    # NOTE: a whole number of 8-byte words, so the segment can be viewed as uint64s.
    return 8 * (HEADER_WORDS + _COLUMNS * slots_for(capacity_bytes) + -(-capacity_bytes // 8))


class CacheStats:
    """A snapshot of the cache's counters (``nv_cache_*`` metrics).

    Attributes: entries, live_bytes, capacity_bytes, lookups, hits, misses, evictions,
    inserts, lookup_ns, insert_ns, recoveries (see the ``H_*`` fields).
    """

    __slots__ = (
        "capacity_bytes",
        "entries",
        "evictions",
        "hits",
        "insert_ns",
        "inserts",
        "live_bytes",
        "lookup_ns",
        "lookups",
        "misses",
        "recoveries",
    )

    def __init__(self, h: list[int]) -> None:
        self.capacity_bytes = h[H_CAPACITY]
        self.live_bytes = h[H_LIVE]
        self.entries = h[H_ENTRIES]
        self.lookups = h[H_LOOKUPS]
        self.hits = h[H_HITS]
        self.misses = h[H_MISSES]
        self.evictions = h[H_EVICTIONS]
        self.inserts = h[H_INSERTS]
        self.lookup_ns = h[H_LOOKUP_NS]
        self.insert_ns = h[H_INSERT_NS]
        self.recoveries = h[H_RECOVERIES]

    @property
    def utilization(self) -> float:
        """Live bytes over the arena's size, 0..1 (``nv_cache_util``)."""
        return self.live_bytes / self.capacity_bytes if self.capacity_bytes else 0.0


class SharedResponseCache:
    """One process's handle on the shared cache segment (``create`` or ``attach``).

    Args:
        segment: the mapped segment; ``fd``: this process's own descriptor of it (the lock).
        clock_ns: the clock of the lookup and insert durations.
    """

    def __init__(
        self, segment: Segment, fd: int, clock_ns: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self._seg = segment
        self._fd = fd
        self._clock_ns = clock_ns
        self._thread_lock = threading.Lock()
        words = memoryview(segment.buf).cast("Q")
        if words[H_MAGIC] != MAGIC:
            words.release()
            raise ValueError(f"{segment.name} is not a response cache segment")
        n = self._n = words[H_SLOTS]
        # NOTE: scalar reads and writes go through memoryviews (fast int indexing); the
        # vector work of evictions and compaction through numpy views of the same memory.
        self._words = words
        self._h = words[:HEADER_WORDS]
        cols = [words[HEADER_WORDS + c * n : HEADER_WORDS + (c + 1) * n] for c in range(_COLUMNS)]
        self._lo, self._hi, self._off, self._size, self._tick, self._tomb = cols
        self._arena_at = 8 * (HEADER_WORDS + _COLUMNS * n)
        self.capacity_bytes = self._h[H_CAPACITY]
        self.name = segment.name

    def _column(self, c: int) -> np.ndarray:
        return np.ndarray((self._n,), np.uint64, self._seg.buf, 8 * (HEADER_WORDS + c * self._n))

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def create(cls, name: str, capacity_bytes: int) -> SharedResponseCache:
        """Create the segment (supervisor only), zeroed, with an empty index.

        Raises:
            ValueError: ``capacity_bytes`` < 1.
            ShmExhausted: ``/dev/shm`` has no room.
        """
        if capacity_bytes < 1:
            raise ValueError("the cache size must be at least 1 byte")
        seg = Segment.create(name, segment_bytes(capacity_bytes))
        words = memoryview(seg.buf).cast("Q")
        words[H_SLOTS] = slots_for(capacity_bytes)
        words[H_CAPACITY] = capacity_bytes
        words[H_MAGIC] = MAGIC
        words.release()
        return cls(seg, _open_fd(name))

    @classmethod
    def attach(cls, name: str) -> SharedResponseCache:
        """Map the segment the supervisor created (frontends)."""
        return cls(Segment.attach(name), _open_fd(name))

    def close(self) -> None:
        """Unmap and close this process's descriptor (releasing the lock if held)."""
        for view in (self._h, self._lo, self._hi, self._off, self._size, self._tick, self._tomb):
            view.release()
        self._words.release()
        self._seg.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def unlink(self) -> None:
        """Remove the name (the creator only)."""
        self._seg.unlink()

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def _locked(self) -> Iterator[memoryview]:
        """Hold the cache's lock; a half-done mutation found on entry is wiped first."""
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                h = self._h
                if h[H_DIRTY]:
                    self._recover()
                yield h
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _recover(self) -> None:
        """Empty the cache: a process died while it changed it (the lock is held)."""
        h = self._h
        self._column(_SIZE)[:] = 0
        self._column(_TOMB)[:] = 0
        h[H_END] = h[H_LIVE] = h[H_ENTRIES] = h[H_TOMBS] = 0
        h[H_RECOVERIES] += 1
        h[H_DIRTY] = 0
        log.warning("response cache: a process died while changing it; the cache was emptied")

    # ------------------------------------------------------------------ the index
    def _find(self, lo: int, hi: int) -> int:
        """The live slot of a key, or -1: linear probing from ``lo mod slots`` until a slot
        that was never used (tombstones of evicted entries are stepped over)."""
        n, size, tomb, klo, khi = self._n, self._size, self._tomb, self._lo, self._hi
        i = lo % n
        for _ in range(n):
            if size[i]:
                if klo[i] == lo and khi[i] == hi:
                    return i
            elif not tomb[i]:
                return -1
            i = i + 1 if i + 1 < n else 0
        return -1

    def _free_slot(self, lo: int) -> int:
        """The first slot on ``lo``'s probe path that holds no live entry."""
        n, size = self._n, self._size
        i = lo % n
        while size[i]:
            i = i + 1 if i + 1 < n else 0
        return i

    def lookup(self, key: bytes) -> bytes | None:
        """The bytes stored under ``key`` (16 bytes), or None; a hit becomes the most
        recently used entry. Counts a lookup and a hit or a miss."""
        lo, hi = _split(key)
        t0 = self._clock_ns()
        with self._locked() as h:
            i = self._find(lo, hi)
            h[H_LOOKUPS] += 1
            if i < 0:
                h[H_MISSES] += 1
                out = None
            else:
                h[H_HITS] += 1
                h[H_TICK] += 1
                self._tick[i] = h[H_TICK]
                at = self._arena_at + self._off[i]
                out = self._seg.buf[at : at + self._size[i]]
            h[H_LOOKUP_NS] += self._clock_ns() - t0
        return out

    def insert(self, key: bytes, data: bytes | bytearray | memoryview) -> bool:
        """Store ``data`` under ``key``, evicting least recently used entries to make room.

        Returns:
            False when ``data`` is larger than the whole cache (nothing changes), else True
            (also when another process stored the key first: that entry is kept).
        """
        n = len(data)
        if n == 0 or n > self.capacity_bytes:
            return False
        lo, hi = _split(key)
        t0 = self._clock_ns()
        with self._locked() as h:
            if self._find(lo, hi) >= 0:
                h[H_INSERT_NS] += self._clock_ns() - t0
                return True
            h[H_DIRTY] = 1
            self._make_room(n)
            end = h[H_END]
            if end + n > self.capacity_bytes:
                end = self._compact()
            at = self._arena_at + end
            self._seg.buf[at : at + n] = data
            slot = self._free_slot(lo)
            if self._tomb[slot]:
                self._tomb[slot] = 0
                h[H_TOMBS] -= 1
            self._lo[slot], self._hi[slot] = lo, hi
            self._off[slot] = end
            h[H_TICK] += 1
            self._tick[slot] = h[H_TICK]
            # NOTE: size last: until it is set, the slot holds no entry for any reader.
            self._size[slot] = n
            h[H_END] = end + n
            h[H_LIVE] += n
            h[H_ENTRIES] += 1
            h[H_INSERTS] += 1
            h[H_DIRTY] = 0
            h[H_INSERT_NS] += self._clock_ns() - t0
        return True

    def _make_room(self, n: int) -> None:
        """Evict LRU entries until ``n`` more bytes fit and the index stays at most 3/4
        full; rebuild the index when tombstones make probe paths long."""
        h = self._h
        limit = max(1, self._n * 3 // 4)
        while h[H_LIVE] + n > self.capacity_bytes or h[H_ENTRIES] >= limit:
            size = self._column(_SIZE)
            used = np.flatnonzero(size)
            victim = int(used[np.argmin(self._column(_TICK)[used])])
            h[H_LIVE] -= self._size[victim]
            h[H_ENTRIES] -= 1
            h[H_EVICTIONS] += 1
            self._size[victim] = 0
            self._tomb[victim] = 1
            h[H_TOMBS] += 1
        if h[H_TOMBS] > self._n // 4:
            self._rehash()

    def _rehash(self) -> None:
        """Put every live entry back on its probe path, tombstones gone."""
        cols = [self._column(c).copy() for c in range(_COLUMNS)]
        live = np.flatnonzero(cols[_SIZE])
        for c in range(_COLUMNS):
            self._column(c)[:] = 0
        for i in live:
            slot = self._free_slot(int(cols[_LO][i]))
            for c in (_LO, _HI, _OFF, _TICK, _SIZE):
                self._words[HEADER_WORDS + c * self._n + slot] = int(cols[c][i])
        self._h[H_TOMBS] = 0

    def _compact(self) -> int:
        """Move every live entry down to close the holes; the new end of the arena."""
        size, offset = self._column(_SIZE), self._column(_OFF)
        used = np.flatnonzero(size)
        order = used[np.argsort(offset[used], kind="stable")]
        buf, base, pos = self._seg.buf, self._arena_at, 0
        for i in order:
            off, n = int(offset[i]), int(size[i])
            if off != pos:
                buf[base + pos : base + pos + n] = buf[base + off : base + off + n]
                offset[i] = pos
            pos += n
        self._h[H_END] = pos
        return pos

    # -------------------------------------------------------------------- views
    def stats(self) -> CacheStats:
        """A snapshot of the counters (taken under the lock)."""
        with self._locked() as h:
            return CacheStats(h.tolist())


def _split(key: bytes) -> tuple[int, int]:
    if len(key) != 16:
        raise ValueError("a cache key is 16 bytes")
    return int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")


def _open_fd(name: str) -> int:
    """This process's own descriptor of the segment (its ``flock`` is the cache's lock)."""
    shm = posix_ipc.SharedMemory(name)
    return int(shm.fd)
