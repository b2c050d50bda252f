"""A worker's output blocks held in place by a frontend's reply: who holds each, whether it
may be held at all, and freeing what a dead frontend process held.

Imported by the workers (their output allocator, ``OutputArenas``) and by tests; the
frontend's side is C++ (``frontend/native/held_block.h``, ``output_segments.h``), and this
module is the Python twin of its rule.

A frontend's native gRPC thread sends an output of 64 KiB or more from the worker's arena
without copying it: the reply's slice holds the block until gRPC lets go of it, which takes
as long as the client takes to read the answer. Two words of the block header, after
``tensor_pool``'s ``u32 state, u32 generation, u64 block_bytes``, record that hold:

- ``u32 holder`` at +16: the pid of the frontend process whose reply holds the block; 0:
  none. The owner writes 0 when it allocates the block (``tensor_pool._Arena.try_alloc``),
  before any record names it. The
  holder writes its pid through the arena's descriptor when it arms its hold
  (``SegmentMapping::Hold``; twin: ``hold_block``), only while the header still holds
  ``LIVE`` and the block's generation, and before its own free can happen. When the
  supervisor sees a frontend process die it tells every worker (``DropSegments.holder``),
  and each frees its LIVE blocks that name that pid (``OutputArenas.free_held_by``): the
  dead process will never free them, and nothing else reads them (a block has one reader).
  A new process of the same frontend has another pid, so the blocks it holds stay; blocks
  still waiting in the dead process's rings name no holder, and the new process frees them
  when it reads them (``supervisor.processes.frontend_restart``). A process killed between
  committing an answer and writing its pid (microseconds) still leaks that block until the
  worker restarts.
- ``u32 flags`` at +20: ``COPY``: the owner's arenas were past their fill mark
  (``COPY_MARK`` of ``--arena-budget-bytes``: the blocks not reclaimed yet, freed ones
  behind a held one included) when it wrote the block, so a frontend copies
  its outputs into the reply and frees it at once (``known_answer.cc`` HoldOf), as Triton
  copies every output into its own response buffers. Clients that never read their large
  answers then hold frontend memory, not the worker's arena: they cannot make other clients'
  calls fail "tensor arena budget ... exhausted" (``docs/reliability.md``).
"""

from __future__ import annotations

import mmap
import struct

from triton_mp.ipc.memory.shm import Segment
from triton_mp.ipc.protocol.messages import BlockRef
from triton_mp.ipc.tensor_pool import (
    BLOCK_HEADER_BYTES,
    FREE,
    LIVE,
    ArenaAllocator,
    _Arena,
    block_ref,
)

HOLDER_OFFSET = 16
"""Byte offset of ``u32 holder`` in a block header (``u32 flags`` follows it)."""
COPY = 1
"""``flags`` bit: copy this block's outputs, never hold it in place."""
COPY_MARK = 0.5
"""Share of the budget in use past which new blocks are marked ``COPY``."""
_STATE_GEN = struct.Struct("<II")
_HOLD = struct.Struct("<II")


def hold_block(segment: Segment, block: BlockRef, holder: int) -> bool:
    """Record ``holder`` (a frontend pid) as the holder of ``block``, as the frontend's
    ``SegmentMapping::Hold`` does, unless its header no longer holds ``LIVE`` and
    ``block.generation``. Returns whether it was written."""
    state, gen = _STATE_GEN.unpack_from(segment.buf, block.offset)
    if state != LIVE or gen != block.generation:
        return False
    segment.store_u32(block.offset + HOLDER_OFFSET, holder)
    return True


def hold_of(segment: Segment, offset: int) -> tuple[int, int]:
    """``(holder, flags)`` of the block whose header is at ``offset``."""
    holder, flags = _HOLD.unpack_from(segment.buf, offset + HOLDER_OFFSET)
    return int(holder), int(flags)


class OutputArenas(ArenaAllocator):
    """A worker's output allocator: ``ArenaAllocator`` whose blocks start with no holder,
    marked ``COPY`` past the fill mark, and whose blocks a dead frontend held can be freed.

    Args:
        name_prefix, arena_bytes, max_total_bytes: as ``ArenaAllocator``'s.
        copy_mark: share of ``max_total_bytes`` in use (every arena's ``_Arena.used``, the
            new block included) past which a new block is marked ``COPY``.
    """

    def __init__(
        self,
        name_prefix: str,
        arena_bytes: int,
        max_total_bytes: int,
        copy_mark: float = COPY_MARK,
    ) -> None:
        self._outputs: list[_Arena] = []
        super().__init__(name_prefix, arena_bytes, max_total_bytes, arena_type=self._arena)
        self._mark_bytes = int(max_total_bytes * copy_mark)

    def _arena(self, segment: Segment) -> _Arena:
        arena = _Arena(segment)
        self._outputs.append(arena)
        return arena

    def alloc(self, payload_bytes: int) -> tuple[Segment, int]:
        """``ArenaAllocator.alloc`` (its header's holder and flags 0), flagged ``COPY`` when
        the arenas are past the fill mark (before any record names the block)."""
        seg, off = super().alloc(payload_bytes)
        # NOTE: the arenas' size bounds their use: below the mark (nearly always) no sum
        if self._total_bytes > self._mark_bytes and self.used() > self._mark_bytes:
            seg.store_u32(off + HOLDER_OFFSET + 4, COPY)
        return seg, off

    def alloc_block(self, payload_bytes: int) -> tuple[mmap.mmap, int, BlockRef]:
        """``alloc`` and ``block_ref`` in one, for the answer writer (``_answer_writer``
        calls it as its ``alloc(arena, total)``: ``answer_batch.alloc_block``'s twin, the
        same block, header and reference): ``(the block's segment buffer, the byte offset
        of its payload there, its BlockRef)``.

        NOTE: the hot path (the newest arena has room, as nearly always) in three frames,
        not six: ``alloc``'s first try inlined, the generation read from the arena rather
        than from the header. Anything else goes through ``alloc``.

        Raises:
            ArenaExhausted / TritonMPError: as ``alloc``.
        """
        arenas = self._outputs
        if arenas:
            arena = arenas[-1]
            # NOTE: ArenaAllocator.alloc's block size, inlined (tensor_pool.align).
            off = arena.try_alloc(BLOCK_HEADER_BYTES + ((max(payload_bytes, 1) + 63) & ~63))
            if off is not None:
                seg = arena.segment
                if self._total_bytes > self._mark_bytes and self.used() > self._mark_bytes:
                    seg.store_u32(off + HOLDER_OFFSET + 4, COPY)
                return seg.buf, off + BLOCK_HEADER_BYTES, BlockRef(seg.name, off, arena.generation)
        seg, off = self.alloc(payload_bytes)
        return seg.buf, off + BLOCK_HEADER_BYTES, block_ref(seg, off)

    def used(self) -> int:
        """Bytes of every arena no allocation can take now (tests and stats)."""
        return sum(a.used() for a in self._outputs)

    def free_held_by(self, holder: int) -> int:
        """Free every LIVE block whose header names ``holder`` (a frontend process that
        died: ``DropSegments.holder``); returns how many. Holder 0 frees nothing."""
        if holder == 0:
            return 0
        freed = 0
        for arena in self._outputs:
            buf = arena.segment.buf
            for off, _ in arena.live:
                state, _gen = _STATE_GEN.unpack_from(buf, off)
                if state == LIVE and _HOLD.unpack_from(buf, off + HOLDER_OFFSET)[0] == holder:
                    arena.segment.store_u32(off, FREE)
                    freed += 1
        return freed
