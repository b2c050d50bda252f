"""Single-producer/single-consumer byte ring over a shared-memory segment.

Imported by ``ipc.channel``; knows nothing of messages. One process pushes, one pops. (A
frontend's ring to the scheduler is pushed by two threads, each push under one lock, in C++:
``frontend.native.shared_ring``, this layout's twin.)

Layout (all integers little-endian, offsets in bytes)::

    0   u32  magic     RING_MAGIC
    4   u32  version   1
    8   u64  capacity  bytes in the data area (a multiple of 8)
    64  u64  tail      bytes ever written; written only by the producer
    128 u64  head      bytes ever consumed; written only by the consumer
    136 u64  quiet     Written only by the consumer, read by the producer; 0 (a new
                       ring): every push wakes. A worker's ring (``BatchDone``): 1 lets
                       ``Sender.send_lazy`` pushes go without a wake-up (``set_quiet``). A
                       frontend's ring (requests): a mask of model buckets whose
                       requests may go without one (``set_quiet_word``;
                       ``ipc.recordio.quiet_requests``). The consumer reads what came
                       quietly on its next pass.
    144 u64  forming   A frontend's ring only, written by the consumer, read by the
                       producer (``set_forming``, ``forming``): the model buckets whose
                       batch is forming within its batching delay and may take more
                       rows unread (``scheduler.forming``).
    152 u64  allowance The rows (low 32 bits) a producer may push quietly for those
                       buckets while the epoch (high 32 bits) stays the same.
    160 u64  floor     The earliest arrival stamp (CLOCK_MONOTONIC ns) such a request
                       may carry: an earlier one would move the batch's deadline.
    192 ...  data area, ``capacity`` bytes

A record is ``u32 length`` + payload, padded to 8 bytes. A record never wraps: when it does
not fit before the end of the data area, the producer writes ``WRAP`` as the length (when at
least 4 bytes remain) and continues at the start.

``tail`` and ``head`` sit on separate cache lines and are read and written through
one-element native ``u64`` memoryviews, so each store is one aligned 8-byte write (native
byte order: little-endian on the machines we run on). The producer writes the record before
it publishes ``tail``, and the consumer reads the record before it publishes ``head``
(x86-64 and arm64 keep aligned 8-byte stores atomic; x86 keeps store order, which is what
we run on).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TypeVar

from triton_mp.ipc.memory.shm import Segment

T = TypeVar("T")

RING_MAGIC = 0x54524E47  # "TRNG"
_HEADER = struct.Struct("<IIQ")
_U32 = struct.Struct("<I")
TAIL_OFFSET = 64
HEAD_OFFSET = 128
QUIET_OFFSET = 136
FORMING_OFFSET = 144
"""The three forming words (mask, allowance, floor), one u64 each."""
DATA_OFFSET = 192
WRAP = 0xFFFFFFFF


class RingFull(Exception):
    """A push found no room; the consumer is behind."""


class RecordTooLarge(ValueError):
    """A record larger than half the ring: it can never be pushed."""


class Ring:
    """SPSC ring of byte records. See the module docstring for the layout.

    Use ``Ring.create`` in the owning process (it unlinks) and ``Ring.attach`` elsewhere.
    """

    __slots__ = ("segment", "capacity", "_buf", "_mv", "_tail", "_head", "_quiet", "_forming")

    def __init__(self, segment: Segment) -> None:
        magic, _version, capacity = _HEADER.unpack_from(segment.buf, 0)
        if magic != RING_MAGIC:
            raise ValueError(f"{segment.name} is not a triton-mp ring")
        self.segment = segment
        self.capacity = capacity
        self._buf = segment.buf
        self._mv = memoryview(segment.buf)
        # NOTE: one-element native u64 views: an item store is one aligned 8-byte write
        # (struct.pack_into copies byte by byte), so the other side never sees a torn index.
        self._tail = self._mv[TAIL_OFFSET : TAIL_OFFSET + 8].cast("Q")
        self._head = self._mv[HEAD_OFFSET : HEAD_OFFSET + 8].cast("Q")
        self._quiet = self._mv[QUIET_OFFSET : QUIET_OFFSET + 8].cast("Q")
        self._forming = self._mv[FORMING_OFFSET : FORMING_OFFSET + 24].cast("Q")

    @classmethod
    def create(cls, name: str, capacity_bytes: int) -> Ring:
        """Create a ring whose data area holds ``capacity_bytes`` (rounded up to 8)."""
        capacity = (capacity_bytes + 7) & ~7
        seg = Segment.create(name, DATA_OFFSET + capacity)
        _HEADER.pack_into(seg.buf, 0, RING_MAGIC, 1, capacity)
        return cls(seg)

    @classmethod
    def attach(cls, name: str) -> Ring:
        """Map an existing ring."""
        return cls(Segment.attach(name))

    def push(self, payload: bytes | memoryview) -> None:
        """Append one record (producer only).

        Raises:
            RingFull: not enough free space now.
            RecordTooLarge: the record can never fit (more than half the capacity).
        """
        n = len(payload)
        need = (4 + n + 7) & ~7
        cap = self.capacity
        if need > cap // 2:
            raise RecordTooLarge(f"record of {n} bytes does not fit a ring of {cap} bytes")
        buf = self._buf
        tail = self._tail[0]
        head = self._head[0]
        pos = tail % cap
        room_to_end = cap - pos
        skip = room_to_end if need > room_to_end else 0
        if (tail - head) + skip + need > cap:
            raise RingFull
        if skip:
            if room_to_end >= 4:
                _U32.pack_into(buf, DATA_OFFSET + pos, WRAP)
            tail += skip
            pos = 0
        at = DATA_OFFSET + pos
        _U32.pack_into(buf, at, n)
        self._mv[at + 4 : at + 4 + n] = payload
        self._tail[0] = tail + need

    def fits(self, n: int) -> bool:
        """Whether a record of ``n`` bytes can ever be pushed (``RecordTooLarge`` otherwise)."""
        return (4 + n + 7) & ~7 <= int(self.capacity) // 2

    def pop_all(self) -> list[bytes]:
        """Take every record published so far (consumer only), oldest first, each copied
        out (``pop_each`` with ``bytes``: the cold path, e.g. a ring whose producer is gone)."""
        return self.pop_each(bytes)

    def pop_each(self, fn: Callable[[memoryview], T]) -> list[T]:
        """``fn`` of every record published so far (consumer only), oldest first: each is
        read in place, before ``head`` is published, so no record is copied out first
        (``fn`` must not keep the view: a decoder copies what it returns). A record whose
        ``fn`` raises is consumed with those before it, and the error propagates."""
        buf = self._buf
        tail = self._tail[0]
        head = self._head[0]
        out: list[T] = []
        if head == tail:
            return out
        cap = self.capacity
        mv = self._mv
        try:
            while head < tail:
                pos = head % cap
                room_to_end = cap - pos
                if room_to_end < 4:
                    head += room_to_end
                    continue
                n = _U32.unpack_from(buf, DATA_OFFSET + pos)[0]
                if n == WRAP:
                    head += room_to_end
                    continue
                at = DATA_OFFSET + pos + 4
                head += (4 + n + 7) & ~7
                out.append(fn(mv[at : at + n]))
        finally:
            self._head[0] = head
        return out

    def pop_native(
        self,
        pop: Callable[[memoryview, int, Callable[[memoryview], T]], list[T]],
        fn: Callable[[memoryview], T],
    ) -> list[T]:
        """``pop_each(fn)`` by its compiled twin ``pop`` (``pop_records`` of
        ``ipc/native/ring_records.cc``: it reads REQUEST records itself and hands every
        other record to ``fn``; the same list, the same head, the same error)."""
        return pop(self._mv, self.capacity, fn)

    def has_records(self) -> bool:
        """Whether records are published and not yet consumed (two loads, no copy)."""
        return self._tail[0] != self._head[0]

    def set_quiet(self, quiet: bool) -> None:
        """Consumer only: let ``Sender.send_lazy`` pushes go without a wake-up (True), or
        ask for one again (False). After asking again, the consumer fences
        (``notify.fence``) and rechecks its rings before it sleeps: a lazy push that read
        the flag before the change posted nothing (``channel.Sender.send_lazy``)."""
        self._quiet[0] = 1 if quiet else 0

    def quiet(self) -> bool:
        """Whether the consumer lets lazy pushes go without a wake-up (one load)."""
        return self._quiet[0] != 0

    def set_quiet_word(self, word: int) -> None:
        """Consumer only: store the whole quiet word (a frontend ring's mask of model
        buckets, ``ipc.recordio.quiet_requests``), one aligned 8-byte store. After clearing
        a bit the consumer fences and rechecks its rings before it sleeps, as after
        ``set_quiet(False)``."""
        self._quiet[0] = word

    def quiet_word(self) -> int:
        """The quiet word as stored (producer: after its record and a fence; one load)."""
        return int(self._quiet[0])

    def set_forming(self, mask: int, allowance: int, floor_ns: int) -> None:
        """Consumer only: store the forming words (module docstring; each an aligned 8-byte
        store, the mask last). After any change the consumer fences and rechecks its rings
        before it sleeps: a producer that read the words mid-change pushed its record
        before its read, so the recheck finds it (``scheduler.forming``)."""
        words = self._forming
        words[1] = allowance
        words[2] = floor_ns
        words[0] = mask

    def forming(self) -> tuple[int, int, int]:
        """(mask, allowance, floor_ns) as stored (producer: after its record and a fence,
        ``quiet_word``; three loads)."""
        words = self._forming
        return words[0], words[1], words[2]

    def pending_bytes(self) -> int:
        """Bytes published and not yet consumed (for stats and tests)."""
        return int(self._tail[0] - self._head[0])

    def close(self) -> None:
        """Unmap this process's view."""
        self._tail.release()
        self._head.release()
        self._quiet.release()
        self._forming.release()
        self._mv.release()
        self.segment.close()
