"""Tensor arenas: where tensor bytes live, who writes them, who frees them, and when.

Imported by the frontend (input arenas) and the workers (output arenas); the scheduler
passes ``BlockRef``/``TensorRef`` descriptors along and maps workers' arenas only to free
the blocks of ensemble steps no consumer needs any more.

Ownership rules (the only place they are written down):

- Each arena has exactly one *owner*, the process that created it and allocates from it:
  a frontend owns the arenas that hold request inputs, a worker owns the arenas that hold
  response outputs. Only the owner allocates, and only the owner unlinks.
- An allocation is one *block* holding all tensors of one request (inputs), of one
  response, or of all the responses of one ``AnswerBatch`` (outputs). A block has exactly
  one reader besides the owner, except an ensemble's: the steps reading it and the
  responses naming it (counted by the scheduler, then by the requester: ``SharedBlocks``);
  an ``AnswerBatch``'s is counted by its frontend the same way.
- A block is freed by writing ``FREE`` into its header, by whichever single process is
  done with it last: the frontend frees its own input blocks when the response (or an
  error) for that request arrives, since by then the worker has finished reading; the
  frontend frees a worker's output block once it has copied the bytes into the gRPC
  response. The owner reclaims freed blocks lazily, oldest first, when it next allocates.
- An owner unlinks its arenas when it stops. A worker whose version retired while the
  server serves on first waits (bounded: ``Shutdown.readers_s``) until every block it
  wrote is freed: a reader maps an arena on first use, and may not have read the last
  answer when the worker is told to stop.
- A process maps every page of an arena when it first maps the arena (``map_pages``: one
  read per page), not page by page as blocks reach deeper into it, so its resident memory
  (``RssShmem``) is flat from its warm-up on. The pages exist already (``shm.reserve``):
  this adds nothing to ``/dev/shm``.
- Arenas grow: when no arena has room, the owner maps a new one (at least twice the block),
  up to ``max_total_bytes``; beyond that an allocation fails with ``ArenaExhausted``
  (UNAVAILABLE: it fits once in-flight requests finish). A block larger than the whole
  budget fails with RESOURCE_EXHAUSTED; so does a new arena that ``/dev/shm`` has no room
  for (``shm.ShmExhausted``: segments reserve their pages when created, so a full
  ``/dev/shm`` is an error for one request, never a SIGBUS later).

- A block is named by a ``BlockRef``: its arena, its offset and its *generation*, the
  allocation's number in its arena (u32, counting from 1, never 0), which the owner writes
  into the block's header and every reference carries (in messages, and in the binary ring
  records: ``ipc.recordio.records``). ``free_block`` writes ``FREE`` only while the header still
  holds ``LIVE`` and that generation: a second free of a block, or a free that comes after
  its room was reused by a later block, writes nothing; it is logged once per process and
  counted (``stray_frees``). It cannot tell an early free from a legitimate one (the
  generation still matches until the block is reused): its holders' counts must be right.

Arena layout: a 64-byte header (``u32 magic, u32 version, u64 capacity``), then blocks.
Block layout: ``u32 state`` (``LIVE``/``FREE``), ``u32 generation`` (``BlockRef.generation``;
this field was a reserved 0 before generations), ``u64 block_bytes`` (header included),
``u32 holder`` and ``u32 flags`` (a worker's output blocks: who holds the block in place,
and whether it may be held, ``ipc.output_holds``; 0 when allocated), then the payload at +64
(64-byte aligned, so numpy views are aligned). The state word is
the hand-over between two processes, so each change of it is one aligned 4-byte store
(``Segment.store_u32``), made once: the owner writes the generation and size first, then
``LIVE``; the last reader writes ``FREE``.

Other processes' arenas are mapped read-only (``SegmentCache``); a reader's free is written
through the segment's descriptor, so a stray store of a reader into an arena faults there.
"""

from __future__ import annotations

import collections
import logging
import mmap
import struct
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import posix_ipc

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc.memory.shm import Segment
from triton_mp.ipc.memory.topology import arena_name
from triton_mp.ipc.protocol.messages import AnswerBatch, BlockRef, InferResponse, RequestFailed

log = logging.getLogger(__name__)

ARENA_MAGIC = 0x54415245  # "TARE"
_ARENA_HEADER = struct.Struct("<IIQ")
_STATE = struct.Struct("<I")
_STATE_GEN = struct.Struct("<II")
_GEN_SIZE = struct.Struct("<IQII")  # NOTE: at +4: generation, size, holder 0, flags 0
ARENA_HEADER_BYTES = 64
BLOCK_HEADER_BYTES = 64
ALIGN = 64
LIVE = 1
FREE = 0
_GENERATIONS = 1 << 32


class ArenaExhausted(TritonMPError):
    """No room for a block within the arena budget (UNAVAILABLE: retry later)."""

    code = ErrorCode.UNAVAILABLE


def align(n: int) -> int:
    """``n`` bytes rounded up to the 64-byte payload alignment (where a next tensor starts)."""
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class ArenaBlocks(Protocol):
    """One arena's block allocator, owner side: ``_Arena``, or its C++ twin (the frontend's
    input arenas: ``frontend.native._native.InputArena``, the same decisions)."""

    generation: int
    """The generation of the newest block (``BlockRef.generation``); 0: none yet."""

    @property
    def segment(self) -> Segment: ...

    def try_alloc(self, block_bytes: int, /) -> int | None:
        """Offset (from segment start) of a new LIVE block of ``block_bytes`` (header
        included, a multiple of 64), or None when it does not fit now."""

    def live_blocks(self) -> int:
        """Blocks from the oldest unfreed one to the newest."""

    def unfreed_blocks(self) -> int:
        """Blocks whose reader has not written ``FREE`` yet."""


class _Arena:
    """One segment used as a circular block allocator (owner side; ``ArenaBlocks``)."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.capacity = segment.size_bytes - ARENA_HEADER_BYTES
        self.live: collections.deque[tuple[int, int]] = collections.deque()  # (offset, bytes)
        self.used_bytes = 0
        """Bytes of the blocks in ``live`` (freed ones behind the oldest unfreed one too:
        their room is not reusable yet), as of the last ``_reclaim``."""
        self.generation = 0
        """The generation of the newest block (``BlockRef.generation``)."""

    def _reclaim(self) -> None:
        buf = self.segment.buf
        live = self.live
        while live and _STATE.unpack_from(buf, live[0][0])[0] == FREE:
            self.used_bytes -= live.popleft()[1]

    def try_alloc(self, block_bytes: int) -> int | None:
        """Offset (from segment start) of a new LIVE block, or None when it does not fit."""
        self._reclaim()
        live = self.live
        base = ARENA_HEADER_BYTES
        end = base + self.capacity
        if not live:
            start = base if block_bytes <= self.capacity else None
        else:
            first = live[0][0]
            last_off, last_len = live[-1]
            head = last_off + last_len
            if last_off >= first:  # not wrapped: free space is [head, end) and [base, first)
                if head + block_bytes <= end:
                    start = head
                elif base + block_bytes <= first:
                    start = base
                else:
                    start = None
            else:  # wrapped: free space is [head, first)
                start = head if head + block_bytes <= first else None
        if start is None:
            return None
        gen = self.generation % (_GENERATIONS - 1) + 1  # NOTE: 1 .. 2**32 - 1, never 0
        self.generation = gen
        # NOTE: generation and size first, then LIVE in one store (``Segment.store_u32``):
        # a reader checking the header (``free_block``) never sees LIVE beside the room's
        # previous generation.
        _GEN_SIZE.pack_into(self.segment.buf, start + 4, gen, block_bytes, 0, 0)
        self.segment.store_u32(start, LIVE)
        live.append((start, block_bytes))
        self.used_bytes += block_bytes
        return start

    def live_blocks(self) -> int:
        self._reclaim()
        return len(self.live)

    def used(self) -> int:
        """Bytes of this arena no allocation can take now (``used_bytes``, reclaimed now)."""
        self._reclaim()
        return self.used_bytes

    def unfreed_blocks(self) -> int:
        """Blocks whose reader has not written ``FREE`` yet (``live_blocks`` also counts
        freed blocks behind the oldest unfreed one)."""
        self._reclaim()
        buf = self.segment.buf
        return sum(1 for off, _ in self.live if _STATE.unpack_from(buf, off)[0] != FREE)


class ArenaAllocator:
    """The owner's allocator over a growing list of arenas.

    Args:
        name_prefix: POSIX name prefix for this owner's arenas (``ipc.memory.topology``:
            ``Topology.frontend_arenas`` or a worker process's prefix); arena ``i`` is
            ``topology.arena_name(prefix, i)``.
        arena_bytes: size of the first arena and the minimum size of later ones.
        max_total_bytes: budget over all arenas of this owner.
        cache: when given, every new arena is registered in it, so the owner's own reads
            and frees go through the same cache as the segments it attaches.
        arena_type: builds each arena's block allocator over its segment (``ArenaBlocks``).
    """

    def __init__(
        self,
        name_prefix: str,
        arena_bytes: int,
        max_total_bytes: int,
        cache: SegmentCache | None = None,
        arena_type: Callable[[Segment], ArenaBlocks] = _Arena,
    ) -> None:
        self._cache = cache
        self._arena_type = arena_type
        self._prefix = name_prefix
        self._arena_bytes = arena_bytes
        self._max_total_bytes = max_total_bytes
        self._arenas: list[ArenaBlocks] = []
        self._total_bytes = 0
        self.on_new_arena: Callable[[ArenaBlocks], None] | None = None
        """Called with each new arena once it is the newest (the native known path
        allocates in the newest one: ``frontend.native.known_teach``)."""

    def alloc(self, payload_bytes: int) -> tuple[Segment, int]:
        """Allocate a LIVE block with room for ``payload_bytes``.

        Returns:
            ``(segment, block_offset)``; the payload starts at ``block_offset + 64``; its
            reference is ``block_ref(segment, block_offset)``.

        Raises:
            ArenaExhausted: no arena has room and the budget forbids a new one.
        """
        block_bytes = BLOCK_HEADER_BYTES + align(max(payload_bytes, 1))
        # NOTE: newest arena first: older ones drain as their blocks are freed.
        for arena in reversed(self._arenas):
            off = arena.try_alloc(block_bytes)
            if off is not None:
                return arena.segment, off
        if block_bytes + ARENA_HEADER_BYTES > self._max_total_bytes:
            raise TritonMPError(
                f"tensors of {payload_bytes} bytes exceed the {self._max_total_bytes}-byte "
                "shared-memory budget of one process (--arena-budget-bytes)",
                ErrorCode.RESOURCE_EXHAUSTED,
            )
        room = self._max_total_bytes - self._total_bytes
        # NOTE: a new arena is at least twice the block (room to overlap the next ones),
        # but a block that fits the rest of the budget is never refused for that reason.
        size = min(max(self._arena_bytes, 2 * block_bytes) + ARENA_HEADER_BYTES, room)
        if size < block_bytes + ARENA_HEADER_BYTES:
            raise ArenaExhausted(
                f"tensor arena budget of {self._max_total_bytes} bytes is exhausted "
                f"(need {payload_bytes} more bytes); retry when in-flight requests finish"
            )
        seg = Segment.create(arena_name(self._prefix, len(self._arenas)), size)
        map_pages(seg)
        _ARENA_HEADER.pack_into(seg.buf, 0, ARENA_MAGIC, 1, size - ARENA_HEADER_BYTES)
        arena = self._arena_type(seg)
        self._arenas.append(arena)
        if self._cache is not None:
            self._cache.add(seg)
        self._total_bytes += size
        off = arena.try_alloc(block_bytes)
        assert off is not None
        if self.on_new_arena is not None:
            self.on_new_arena(arena)
        return seg, off

    @property
    def newest(self) -> ArenaBlocks | None:
        """The arena ``alloc`` tries first (the last made); None before the first."""
        return self._arenas[-1] if self._arenas else None

    def live_blocks(self) -> int:
        """Blocks not yet freed (for tests and stats)."""
        return sum(a.live_blocks() for a in self._arenas)

    def await_readers(self, timeout_s: float, poll_s: float = 0.002) -> int:
        """Wait up to ``timeout_s`` seconds until every block this owner wrote is freed by
        its reader; returns how many are still unfreed then (0 at once when none is).

        A worker stopping after its version retired (``Shutdown.readers_s``) calls this
        before ``close_and_unlink``: the scheduler stops it on its last ``BatchDone``, which
        may come before the frontend has read the last answer, and a frontend that maps the
        arena only then (``SegmentCache.get``) would find it unlinked."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = sum(a.unfreed_blocks() for a in self._arenas)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(poll_s)

    def segments(self) -> Iterator[Segment]:
        """Every arena segment this owner created."""
        return (a.segment for a in self._arenas)

    def close_and_unlink(self) -> None:
        """Unlink and unmap every arena (owner shutdown)."""
        for arena in self._arenas:
            arena.segment.unlink()
            arena.segment.close()
        self._arenas.clear()


def response_blocks(msg: InferResponse) -> tuple[BlockRef, ...]:
    """Every output block of a response, ``block`` first (an ensemble's response also names
    the blocks of the steps that wrote its outputs): its reader frees them all."""
    return msg.extra_blocks if msg.block is None else (msg.block, *msg.extra_blocks)


class SharedBlocks:
    """A requester's counts of the blocks several responses share (``InferResponse.shared_blocks``).

    An ensemble output written upstream of a decoupled step lies in one block that every
    response the step drives names, and the scheduler may still hold it for steps to come.
    A worker's ``AnswerBatch`` puts the outputs of all its responses in one block, handed over
    with the message for as many uses as responses name it.
    So the block has two kinds of holder: the scheduler, until it hands the block over
    (``Handoff``: "free it after ``uses`` releases"), and each response naming it, until the
    requester releases that response (copied out, failed, dropped). Responses arrive in the
    order the scheduler sent them, so every use comes before or with its handoff, but they may
    be released in any order: whichever of the last release and the handoff comes second
    frees the block. One per requesting process (a frontend, a BLS client); not thread-safe.
    """

    def __init__(self) -> None:
        self._released: dict[BlockRef, int] = {}
        """Shared block -> responses naming it released so far."""
        self._uses: dict[BlockRef, int] = {}
        """Handed-over shared block -> responses naming it in all."""

    def arrived(self, msg: InferResponse | RequestFailed | AnswerBatch) -> list[BlockRef]:
        """An answer arrived: take its handoffs. Returns the blocks to free now (every
        response naming them was released already)."""
        free: list[BlockRef] = []
        for handoff in msg.handoffs:
            done = self._released.get(handoff.block, 0)
            if done >= handoff.uses:
                self._released.pop(handoff.block, None)
                free.append(handoff.block)
            else:
                self._uses[handoff.block] = handoff.uses
        return free

    def released(self, msg: InferResponse) -> list[BlockRef]:
        """The requester is done with a response (``arrived`` first): its own blocks, and the
        shared ones this was the last use of, to free now."""
        free = list(response_blocks(msg))
        for block in msg.shared_blocks:
            done = self._released.get(block, 0) + 1
            if done >= self._uses.get(block, done + 1):
                self._released.pop(block, None)
                del self._uses[block]
                free.append(block)
            else:
                self._released[block] = done
        return free

    def pending(self) -> int:
        """Shared blocks not freed yet (tests)."""
        return len(self._released.keys() | self._uses.keys())


def map_pages(segment: Segment) -> None:
    """Map every page of ``segment`` into this process now (one read per page)."""
    view = memoryview(segment.buf)
    try:
        bytes(view[:: mmap.PAGESIZE])
    finally:
        view.release()


def block_ref(segment: Segment, block_offset: int) -> BlockRef:
    """The reference to the block ``ArenaAllocator.alloc`` just returned (owner side): its
    generation is read back from its header."""
    generation = _STATE_GEN.unpack_from(segment.buf, block_offset)[1]
    return BlockRef(segment.name, block_offset, generation)


_stray = 0


def stray_frees() -> int:
    """Frees this process refused so far (``free_block``): a second free of a block, or one
    after its room was reused. Each is a bug of the caller's counts; none should ever be."""
    return _stray


def free_block(segment: Segment, block: BlockRef) -> bool:
    """Mark ``block`` FREE (by its single last user), unless its header no longer holds
    ``LIVE`` and ``block.generation`` (0: the state only): then nothing is written, the
    refusal is counted (``stray_frees``) and logged, once per process. Returns whether the
    block was freed.

    Args:
        segment: the block's arena (a read-only attachment is written through its
            descriptor: ``Segment.store_u32``).
        block: the block's reference; ``block.offset`` is its header's byte offset.
    """
    global _stray
    offset = block.offset
    try:
        state, gen = _STATE_GEN.unpack_from(segment.buf, offset)
    except struct.error:
        state, gen = -1, -1  # NOTE: past the arena's end: no block of it
    if state == LIVE and (gen == block.generation or not block.generation):
        # NOTE: one store, never struct.pack_into, which zero-fills the word and then writes
        # it again byte by byte: the owner may take the room over on the first write (it
        # reads FREE) and put a new LIVE block there, which the second write then marked
        # FREE under its reader (#37: "state 0" beside the new block's generation).
        segment.store_u32(offset, FREE)
        return True
    _stray += 1
    if _stray == 1:
        log.error(
            "refused to free block %s: its header holds state %d, generation %d (a second "
            "free, or one after its room was reused); further refusals are only counted",
            block,
            state,
            gen,
            stack_info=True,  # NOTE: whose count is wrong: the caller that freed it again
        )
    return False


class SegmentGone(TritonMPError):
    """An arena named by a request or an answer no longer exists: the process that owned it
    died before this reader first mapped it (UNAVAILABLE: that request is lost)."""

    code = ErrorCode.UNAVAILABLE


class SegmentCache:
    """Read side: attaches arenas of other processes by name on first use.

    Args:
        writable: attach read-write. By default other processes' arenas are mapped
            read-only (``Segment.attach``): a reader writes only a block's state word, when
            it frees the block (``free_block``, through the descriptor), so a stray store
            into another process's arena faults in the process that made it.
    """

    def __init__(self, writable: bool = False) -> None:
        self._segments: dict[str, Segment] = {}
        self._writable = writable

    def get(self, name: str) -> Segment:
        """The mapped segment ``name`` (attached now if new).

        Raises:
            SegmentGone: it was unlinked before it was first mapped here (its owner died:
                a worker's arenas go with it, a frontend's with it).
        """
        seg = self._segments.get(name)
        if seg is None:
            try:
                seg = Segment.attach(name, writable=self._writable)
            except posix_ipc.ExistentialError:
                raise SegmentGone(
                    f"the tensors of this request are gone: the process that held them "
                    f"stopped ({name})"
                ) from None
            map_pages(seg)
            self._segments[name] = seg
        return seg

    def add(self, segment: Segment) -> None:
        """Register a segment this process already has mapped (its own arenas)."""
        self._segments[segment.name] = segment

    def drop(self, prefix: str) -> None:
        """Unmap every attached segment whose name starts with ``prefix`` (the arenas of
        a worker that stopped for good; nothing may still view them)."""
        for name in [n for n in self._segments if n.startswith(prefix)]:
            self._segments.pop(name).close()

    def close(self) -> None:
        """Unmap everything attached."""
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()
