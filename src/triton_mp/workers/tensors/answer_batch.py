"""One answer per batch and frontend: the responses of several requests in one message, their
outputs in one block.

Imported by ``workers.worker``. A batch's requests from one frontend (``Requester.FRONTEND``)
are answered together: every output that goes to the worker's arena (not to a client's
registered region) is copied into one block, each response names that block in
``InferResponse.shared_blocks`` (and has no ``block`` of its own), and one ``AnswerBatch``
carries the responses with a ``Handoff`` of the block for as many uses as responses name it.
The frontend decodes one record, takes one wake-up, and frees the block after releasing the
last response that names it (``ipc.tensor_pool.SharedBlocks``, as for an ensemble's shared
blocks). A response that fails (a client region too small or gone) is an error in
the same message and names no block.

What is not grouped keeps one message and one block per response (``workers.worker``): a
single request per frontend, decoupled models, ensemble steps and BLS requests (their
requesters, the scheduler and the BLS clients, free blocks per response), and traced
requests (their trace records travel one per response).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from triton_mp.backends.base import response_parameters
from triton_mp.common.errors import ErrorCode, TritonMPError, flatten_exception
from triton_mp.ipc import ArenaAllocator
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BlockRef,
    ErrorInfo,
    Handoff,
    InferRequest,
    InferResponse,
    ReplyTo,
    TensorRef,
)
from triton_mp.ipc.tensor_pool import ALIGN, BLOCK_HEADER_BYTES, block_ref
from triton_mp.workers.tensors.tensor_io import (
    WIRE_OF,
    ClientRegions,
    WireTensor,
    arena_tensors,
    output_parts,
    wire_tensor,
    write_region,
)

try:
    # NOTE: mypy sees the extension only where it is built: either ignore may be unused.
    from triton_mp.workers import _answer_writer as native_writer  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # NOTE: not built (setup.py): the Python loop below writes every answer
    native_writer = None  # type: ignore[assignment,unused-ignore]
else:
    # NOTE: the writer reads these classes' fields at their slots (answer_writer.cc).
    native_writer.configure(InferRequest, ReplyTo)

Member = tuple[InferRequest, dict[str, np.ndarray] | ErrorInfo]
"""One request of the group and its backend result (outputs, or its error)."""


def write_answer_batch(
    arena: ArenaAllocator,
    regions: ClientRegions,
    members: Sequence[Member],
    origin: str,
    encoded: bool = False,
) -> tuple[AnswerBatch | bytes, BlockRef | None, list[int]]:
    """Write the outputs of ``members`` (one frontend's requests of a batch) and build their
    answer.

    Args:
        arena: this worker's output arena (the one block is allocated there).
        regions: the clients' mapped regions (outputs the request asked to go there).
        members: each request with its result, in batch order.
        origin: the ``ErrorInfo.origin`` of errors raised here (``worker <instance>``).
        encoded: the answer may come as its msgpack bytes (the C writer's, where it is
            built and every member goes wholly to the arena).

    Returns:
        ``(answer, block, failed)``: the message (responses in ``members`` order; or its
        msgpack bytes, as ``ipc.recordio.codec.encode`` writes them), the one
        block its responses name (None when no output went to the arena; the caller frees it
        if the message cannot be sent), and the indices of ``members`` whose response is an
        error.

    Raises:
        TritonMPError: the one block cannot be allocated (``ArenaExhausted``, or a batch over
            the budget); nothing is left allocated, and client regions already written are
            written again by a per-request retry.
    """
    if encoded and native_writer is not None:
        done = native_writer.write_plain(
            members if type(members) is list else list(members),
            WIRE_OF,
            response_parameters,
            alloc_block,
            arena,
        )
        if done is not None:
            return done[0], done[1], []
    placed, total, failed = _place_all(regions, members, origin)
    block: BlockRef | None = None
    buf = None
    pos = 0
    if total:
        buf, pos, block = alloc_block(arena, total)
    return _answer(members, placed, block, buf, pos), block, failed


def alloc_block(arena: ArenaAllocator, total: int) -> tuple[Any, int, BlockRef]:
    """The group's one block for ``total`` payload bytes: (its segment's buffer, where the
    payload starts in it, its reference).

    Raises:
        TritonMPError: no room (``ArenaAllocator.alloc``).
    """
    seg, offset = arena.alloc(total)
    return seg.buf, offset + BLOCK_HEADER_BYTES, block_ref(seg, offset)


def _answer(
    members: Sequence[Member], placed: list[Placed], block: BlockRef | None, buf: Any, pos: int
) -> AnswerBatch:
    """The members' ``AnswerBatch``, their arena-bound outputs copied into ``buf`` (the
    block's segment) from ``pos`` on, each at a 64-byte aligned offset."""
    segment = block.segment if block is not None else ""
    shared = (block,) if block is not None else ()
    uses = 0
    responses = []
    for (req, res), entry in zip(members, placed, strict=True):
        if isinstance(entry, ErrorInfo):
            responses.append(
                InferResponse(request_id=req.request_id, version=req.version, error=entry)
            )
            continue
        refs, to_arena = entry
        if refs is None:
            # NOTE: the common case (no client regions): every output goes to the block.
            refs = []
            for name, datatype, shape, data, n in to_arena:
                if n:
                    buf[pos : pos + n] = data
                refs.append(TensorRef(name, datatype, shape, segment, pos, n))
                pos += (n + ALIGN - 1) & ~(ALIGN - 1)  # NOTE: tensor_pool.align, inlined
        else:
            it = iter(to_arena)
            for j, ref in enumerate(refs):
                if ref is None:
                    name, datatype, shape, data, n = next(it)
                    if n:
                        buf[pos : pos + n] = data
                    refs[j] = TensorRef(name, datatype, shape, segment, pos, n)
                    pos += (n + ALIGN - 1) & ~(ALIGN - 1)
        names_block = bool(to_arena)
        uses += names_block
        assert isinstance(res, dict)
        responses.append(
            InferResponse(
                request_id=req.request_id,
                version=req.version,
                outputs=tuple(refs),  # type: ignore[arg-type]
                # NOTE: a plain dict carries no parameters (response_parameters' test, the
                # common case without the call).
                parameters_json="" if type(res) is dict else response_parameters(res),
                shared_blocks=shared if names_block else (),
            )
        )
    handoffs = (Handoff(block, uses),) if block is not None else ()
    return AnswerBatch(responses=tuple(responses), handoffs=handoffs)


Placed = tuple[list[TensorRef | None] | None, list[WireTensor]] | ErrorInfo
"""A member's refs with its arena-bound tensors still to write (refs None there; the whole
list None when every output goes to the arena), or its error."""


def _place_all(
    regions: ClientRegions, members: Sequence[Member], origin: str
) -> tuple[list[Placed], int, list[int]]:
    """Every member placed (``_place``), the arena bytes they need in all (64-byte aligned
    each), and the indices of the members that failed."""
    failed: list[int] = []
    placed: list[Placed] = []
    total = 0
    wire_of = WIRE_OF
    for i, (req, res) in enumerate(members):
        if isinstance(res, dict) and not req.output_regions:
            # NOTE: the hot path (every output to the arena): _place, arena_tensors and
            # wire_tensor inlined, the arena bytes summed in the same loop.
            wanted = req.outputs
            to_arena: list[WireTensor] = []
            try:
                for name, arr in res.items():
                    if name not in wanted:
                        continue
                    datatype = wire_of.get(arr.dtype)
                    if datatype is not None and arr.flags.c_contiguous:
                        n = arr.nbytes
                        to_arena.append((name, datatype, arr.shape, arr, n))
                    else:
                        t = wire_tensor(name, arr)
                        n = t[4]
                        to_arena.append(t)
                    total += (n + ALIGN - 1) & ~(ALIGN - 1)
            except Exception as exc:  # noqa: BLE001 - as below: fails this request only
                # NOTE: what the loop added for this request is taken back.
                for t in to_arena:
                    total -= (t[4] + ALIGN - 1) & ~(ALIGN - 1)
                res = _error_of(exc, origin)
            else:
                placed.append((None, to_arena))
                continue
        elif isinstance(res, dict):
            try:
                refs, to_arena = _place(regions, req, res)
            except Exception as exc:  # noqa: BLE001 - one request's fault fails that request
                res = _error_of(exc, origin)
            else:
                for t in to_arena:
                    total += (t[4] + ALIGN - 1) & ~(ALIGN - 1)
                placed.append((refs, to_arena))
                continue
        failed.append(i)
        placed.append(res)
    return placed, total, failed


def _error_of(exc: Exception, origin: str) -> ErrorInfo:
    """A request's failure to be placed as its error: a ``TritonMPError``'s code and words,
    INTERNAL with the flattened exception for anything else."""
    if isinstance(exc, TritonMPError):
        return ErrorInfo(exc.code, exc.message, origin)
    return ErrorInfo(ErrorCode.INTERNAL, flatten_exception(exc), origin)


def _place(
    regions: ClientRegions, req: InferRequest, outputs: dict[str, np.ndarray]
) -> tuple[list[TensorRef | None] | None, list[WireTensor]]:
    """Write a request's outputs that go to client regions now; the others are returned
    for the arena (their refs None until then; no refs list at all when the request names
    no region), in ``req.outputs`` order.

    Raises:
        TritonMPError: a region too small or gone (nothing of this
            request goes to the arena then).
    """
    if not req.output_regions:
        return None, arena_tensors(req, outputs)  # NOTE: _place_all inlines this case
    parts = output_parts(req, outputs)
    refs: list[TensorRef | None] = []
    to_arena: list[WireTensor] = []
    for tensor, region in parts:
        if region is None:
            refs.append(None)
            to_arena.append(tensor)
        else:
            refs.append(write_region(regions, tensor, region))
    return refs, to_arena
