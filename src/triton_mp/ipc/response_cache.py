"""The local response cache: one shared-memory index and arena for every frontend process.

Created (zeroed) by the supervisor (``supervisor.wiring``) when ``--cache-config local,size=N``
(or the deprecated ``--response-cache-byte-size N``) is given; attached by every frontend,
which looks responses up and inserts them (``frontend.response_cache``), and read by frontend
0 for the ``nv_cache_*`` metrics. A hit therefore does not depend on which frontend a
connection landed on. Entries are opaque bytes under a 16-byte key; this module knows nothing
of requests or tensors. Imports numpy (the frontend's), so the scheduler never imports it.

Layout of the segment ``/triton_mp_<server>_cache`` (all little-endian uint64):

====================  =========================================================================
part                  what it holds
====================  =========================================================================
header[16]            ``H_*`` fields below: magic, slot count, arena size, the arena's end,
                      live bytes and entries, the LRU clock, the counters, the dirty mark
key_lo[slots]         low 8 bytes of each slot's key
key_hi[slots]         high 8 bytes of each slot's key
offset[slots]         where the slot's bytes start in the arena
size[slots]           how many bytes the slot holds; 0 = the slot is free
tick[slots]           the LRU clock when the slot was last inserted or hit
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

from triton_mp.ipc.shm import Segment

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
HEADER_WORDS = 16
_COLUMNS = 5
"""key_lo, key_hi, offset, size, tick."""

MIN_SLOT_BYTES = 256
"""One index slot per this many arena bytes (at least 64 slots, at most 1 << 16)."""


def slots_for(capacity_bytes: int) -> int:
    """How many index slots a cache of ``capacity_bytes`` gets."""
    return max(64, min(1 << 16, capacity_bytes // MIN_SLOT_BYTES))


def segment_bytes(capacity_bytes: int) -> int:
    """The size of the whole segment for an arena of ``capacity_bytes``."""
    return 8 * (HEADER_WORDS + _COLUMNS * slots_for(capacity_bytes)) + capacity_bytes


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

    def __init__(self, header: np.ndarray) -> None:
        h = [int(x) for x in header]
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
        buf = segment.buf
        self._header = np.ndarray((HEADER_WORDS,), np.uint64, buf, 0)
        if int(self._header[H_MAGIC]) != MAGIC:
            raise ValueError(f"{segment.name} is not a response cache segment")
        n = int(self._header[H_SLOTS])
        cols = np.ndarray((_COLUMNS, n), np.uint64, buf, 8 * HEADER_WORDS)
        self._key_lo, self._key_hi, self._offset, self._size, self._tick = cols
        self._arena_at = 8 * (HEADER_WORDS + _COLUMNS * n)
        self.capacity_bytes = int(self._header[H_CAPACITY])
        self.name = segment.name

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
        header = np.ndarray((HEADER_WORDS,), np.uint64, seg.buf, 0)
        header[H_SLOTS] = slots_for(capacity_bytes)
        header[H_CAPACITY] = capacity_bytes
        header[H_MAGIC] = MAGIC
        del header
        return cls(seg, _open_fd(name))

    @classmethod
    def attach(cls, name: str) -> SharedResponseCache:
        """Map the segment the supervisor created (frontends)."""
        return cls(Segment.attach(name), _open_fd(name))

    def close(self) -> None:
        """Unmap and close this process's descriptor (releasing the lock if held)."""
        del self._header, self._key_lo, self._key_hi, self._offset, self._size, self._tick
        self._seg.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def unlink(self) -> None:
        """Remove the name (the creator only)."""
        self._seg.unlink()

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def _locked(self) -> Iterator[np.ndarray]:
        """Hold the cache's lock; a half-done mutation found on entry is wiped first."""
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                h = self._header
                if h[H_DIRTY]:
                    self._recover()
                yield h
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _recover(self) -> None:
        """Empty the cache: a process died while it changed it (the lock is held)."""
        h = self._header
        self._size[:] = 0
        h[H_END] = h[H_LIVE] = h[H_ENTRIES] = 0
        h[H_RECOVERIES] += 1
        h[H_DIRTY] = 0
        log.warning("response cache: a process died while changing it; the cache was emptied")

    # ------------------------------------------------------------------ lookups
    def _find(self, lo: int, hi: int) -> int:
        hits = np.flatnonzero((self._key_lo == lo) & (self._key_hi == hi) & (self._size > 0))
        return int(hits[0]) if hits.size else -1

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
                at = self._arena_at + int(self._offset[i])
                out = self._seg.buf[at : at + int(self._size[i])]
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
            slot = self._make_room(n)
            end = int(h[H_END])
            if end + n > self.capacity_bytes:
                end = self._compact()
            at = self._arena_at + end
            self._seg.buf[at : at + n] = data
            self._key_lo[slot], self._key_hi[slot] = lo, hi
            self._offset[slot] = end
            h[H_TICK] += 1
            self._tick[slot] = h[H_TICK]
            # NOTE: size last: until it is set, the slot is free to every reader.
            self._size[slot] = n
            h[H_END] = end + n
            h[H_LIVE] += n
            h[H_ENTRIES] += 1
            h[H_INSERTS] += 1
            h[H_DIRTY] = 0
            h[H_INSERT_NS] += self._clock_ns() - t0
        return True

    def _make_room(self, n: int) -> int:
        """Evict LRU entries until ``n`` more bytes fit and a slot is free; that slot."""
        h = self._header
        while True:
            free = np.flatnonzero(self._size == 0)
            if free.size and int(h[H_LIVE]) + n <= self.capacity_bytes:
                return int(free[0])
            used = np.flatnonzero(self._size)
            victim = int(used[np.argmin(self._tick[used])])
            h[H_LIVE] -= self._size[victim]
            h[H_ENTRIES] -= 1
            h[H_EVICTIONS] += 1
            self._size[victim] = 0

    def _compact(self) -> int:
        """Move every live entry down to close the holes; the new end of the arena."""
        used = np.flatnonzero(self._size)
        order = used[np.argsort(self._offset[used], kind="stable")]
        buf, base, pos = self._seg.buf, self._arena_at, 0
        for i in order:
            off, size = int(self._offset[i]), int(self._size[i])
            if off != pos:
                buf[base + pos : base + pos + size] = buf[base + off : base + off + size]
                self._offset[i] = pos
            pos += size
        self._header[H_END] = pos
        return pos

    # -------------------------------------------------------------------- views
    def stats(self) -> CacheStats:
        """A snapshot of the counters (taken under the lock)."""
        with self._locked() as h:
            return CacheStats(h.copy())


def _split(key: bytes) -> tuple[int, int]:
    if len(key) != 16:
        raise ValueError("a cache key is 16 bytes")
    return int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")


def _open_fd(name: str) -> int:
    """This process's own descriptor of the segment (its ``flock`` is the cache's lock)."""
    shm = posix_ipc.SharedMemory(name)
    return int(shm.fd)
