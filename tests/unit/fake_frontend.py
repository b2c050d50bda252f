"""In-memory stand-ins for what a frontend's submit path touches: arenas, the ring to the
scheduler, a worker's output arena. No shared memory, no process.

Imported by tests only. Blocks keep the real layout's ``u32 state`` header (LIVE / FREE at
the block's offset), so ``free_block`` works on them unchanged and a test can tell which
blocks are still held.
"""

from __future__ import annotations

import struct

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.model_table import ModelTable
from triton_mp.ipc import BlockRef, Decoder, TensorRef
from triton_mp.ipc.protocol.messages import (
    CancelRequest,
    ErrorInfo,
    InferRequest,
    InferResponse,
    RequestFailed,
    ToScheduler,
)
from triton_mp.ipc.protocol.specs import ModelEntry
from triton_mp.ipc.recordio.records import RequestRecord, as_request
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, FREE, LIVE, align

_STATE = struct.Struct("<I")


class FakeSegment:
    """A named byte buffer standing in for a mapped segment."""

    def __init__(self, name: str, size_bytes: int = 1 << 20) -> None:
        self.name = name
        self.size_bytes = size_bytes
        self.buf = bytearray(size_bytes)

    def store_u32(self, offset: int, value: int) -> None:
        """``Segment.store_u32``: one native u32 store at byte ``offset``."""
        with memoryview(self.buf) as view:
            view[offset : offset + 4].cast("I")[0] = value


class FakeArena:
    """A bump allocator over one ``FakeSegment`` (the frontend's input arena)."""

    def __init__(self, segment: FakeSegment) -> None:
        self.segment = segment
        self.blocks: list[int] = []
        self._next = 64

    def alloc(self, payload_bytes: int) -> tuple[FakeSegment, int]:
        """A LIVE block with room for ``payload_bytes`` (payload at +64)."""
        offset = self._next
        self._next += BLOCK_HEADER_BYTES + align(max(payload_bytes, 1))
        assert self._next <= self.segment.size_bytes, "fake arena full"
        _STATE.pack_into(self.segment.buf, offset, LIVE)
        self.blocks.append(offset)
        return self.segment, offset

    def live_blocks(self) -> int:
        """Blocks not freed yet."""
        return sum(1 for off in self.blocks if is_live(self.segment, off))


class FakeCache:
    """``SegmentCache`` over fake segments (every segment is added up front)."""

    def __init__(self, *segments: FakeSegment) -> None:
        self._segments = {s.name: s for s in segments}

    def get(self, name: str) -> FakeSegment:
        return self._segments[name]

    def add(self, segment: FakeSegment) -> None:
        self._segments[segment.name] = segment


def is_live(segment: FakeSegment, offset: int) -> bool:
    """Whether the block at ``offset`` is still LIVE."""
    return bool(_STATE.unpack_from(segment.buf, offset)[0] != FREE)


class FakeScheduler:
    """The ring to the scheduler: decodes what the frontend sends and keeps it.

    Attributes:
        sent: every message, in order.
        refuse: when set, ``send`` raises it instead (a full ring, an oversized record).
    """

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.refuse: BaseException | None = None
        self._decoder: Decoder[object] = Decoder(ToScheduler)

    def send(self, data: bytes) -> None:
        if self.refuse is not None:
            raise self.refuse
        msg = self._decoder.decode(data)
        # NOTE: a REQUEST record decodes to a RequestRecord; tests compare whole requests.
        self.sent.append(as_request(msg) if isinstance(msg, RequestRecord) else msg)

    def requests(self) -> list[InferRequest]:
        """The ``InferRequest`` descriptors sent."""
        return [m for m in self.sent if isinstance(m, InferRequest)]

    def cancels(self) -> list[CancelRequest]:
        """The ``CancelRequest`` messages sent."""
        return [m for m in self.sent if isinstance(m, CancelRequest)]


class FakeWorker:
    """Writes answers into its own output arena, as a worker does."""

    def __init__(self, segment: FakeSegment) -> None:
        self.arena = FakeArena(segment)

    def answer(
        self, req: InferRequest, outputs: dict[str, bytes], *, final: bool = True
    ) -> InferResponse:
        """A response carrying ``outputs`` (FP32, 1-D) in one new LIVE block."""
        seg, block = self.arena.alloc(sum(align(len(d)) for d in outputs.values()))
        pos = block + BLOCK_HEADER_BYTES
        refs = []
        for name, data in outputs.items():
            seg.buf[pos : pos + len(data)] = data
            refs.append(TensorRef(name, "FP32", (len(data) // 4,), seg.name, pos, len(data)))
            pos += align(len(data))
        return InferResponse(
            request_id=req.request_id,
            version=req.version,
            outputs=tuple(refs),
            block=BlockRef(seg.name, block),
            final=final,
        )

    @staticmethod
    def empty_final(req: InferRequest) -> InferResponse:
        """A decoupled request's flags-only final response."""
        return InferResponse(request_id=req.request_id, version=req.version, empty=True)

    @staticmethod
    def failed(req: InferRequest, message: str = "boom") -> RequestFailed:
        """The request failed (INTERNAL ``message``)."""
        return RequestFailed(
            request_id=req.request_id, error=ErrorInfo(ErrorCode.INTERNAL, message)
        )


def model_entry(
    name: str,
    *,
    max_batch_size: int = 0,
    decoupled: bool = False,
    preserve_ordering: bool = False,
    versions: tuple[int, ...] = (1,),
    inputs: tuple[tuple[str, int, tuple[int, ...]], ...] = (("IN", mc.TYPE_FP32, (-1,)),),
    outputs: tuple[str, ...] = ("OUT",),
) -> ModelEntry:
    """A model table entry for a model with these FP32 outputs (dims [-1])."""
    cfg = mc.ModelConfig(name=name, max_batch_size=max_batch_size)
    for n, dt, dims in inputs:
        cfg.input.add(name=n, data_type=dt, dims=list(dims))
    for n in outputs:
        cfg.output.add(name=n, data_type=mc.TYPE_FP32, dims=[-1])
    cfg.model_transaction_policy.decoupled = decoupled
    if preserve_ordering:
        cfg.dynamic_batching.preserve_ordering = True
    return ModelEntry(name=name, config=cfg.SerializeToString(), ready_versions=versions)


def table(*entries: ModelEntry) -> ModelTable:
    """A model table of these entries."""
    return ModelTable(entries)


def ring_full() -> TritonMPError:
    """What a sender raises when the ring stays full."""
    return TritonMPError("the scheduler's ring is full", ErrorCode.UNAVAILABLE)
