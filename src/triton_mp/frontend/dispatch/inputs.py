"""A validated request's inputs in the frontend's arena, and the client regions it names.

Imported by ``frontend.inference``; no transport. ``write_inputs`` is the one host copy of
the request path (a known request's twin: ``dispatch.known_requests.write_known``).
"""

from __future__ import annotations

from triton_mp.frontend.validation.request import ValidRequest
from triton_mp.ipc import ArenaAllocator, BlockRef, TensorRef
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, align, block_ref


def write_inputs(
    arena: ArenaAllocator, req: ValidRequest
) -> tuple[BlockRef, tuple[TensorRef, ...]]:
    """Copy every input of ``req`` into one new block of the frontend's arena.

    Inputs in a client's shared memory are not copied: their ``TensorRef`` names the
    client's object (``region_id`` set). Each tensor starts 64-byte aligned.

    Raises:
        ArenaExhausted (UNAVAILABLE): no room within the arena budget.
    """
    total = sum(align(len(i.data)) for i in req.inputs)
    seg, block = arena.alloc(total)
    mv = memoryview(seg.buf)
    pos = block + BLOCK_HEADER_BYTES
    refs = []
    for i in req.inputs:
        if i.window is not None:
            w = i.window
            refs.append(
                TensorRef(i.name, i.datatype, i.shape, w.key, w.offset, w.byte_size, w.region_id)
            )
            continue
        n = len(i.data)
        mv[pos : pos + n] = i.data
        refs.append(TensorRef(i.name, i.datatype, i.shape, seg.name, pos, n))
        pos += align(n)
    mv.release()
    return block_ref(seg, block), tuple(refs)


def region_ids(valid: ValidRequest) -> tuple[int, ...]:
    """The ``region_id`` of every client shared-memory region the request names (one per
    tensor in a region, inputs then outputs); empty for a request without any."""
    ids = tuple(i.window.region_id for i in valid.inputs if i.window is not None)
    if valid.output_regions:
        ids += tuple(r.region_id for r in valid.output_regions if r is not None)
    return ids
