"""Tensor I/O of a worker: views over request inputs, writing outputs, client regions.

Imported by ``workers.worker``. Inputs are read in place: a numpy view over the frontend's
arena or over a copy-on-write mapping of the client's registered system shared memory (no
copy for fixed-size types; a model's write stays its own, ``ClientRegions``).
Outputs are written once: into the client's registered region where the request asked for
it (``InferRequest.output_regions``, Triton's ``shared_memory_region`` output parameter),
the rest into one block of this worker's arena (``ipc.tensor_pool``), which the frontend
frees after reading.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
from collections.abc import Sequence

import numpy as np
import posix_ipc

from triton_mp.backends.base import response_parameters
from triton_mp.common.datatypes import DataType, element_count
from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.common.numpy_tensors import deserialize_bytes_tensor, tensor_wire_bytes
from triton_mp.ipc import ArenaAllocator, SegmentCache, free_block
from triton_mp.ipc.memory.shm import client_object_refusal
from triton_mp.ipc.protocol.messages import (
    BlockRef,
    InferRequest,
    InferResponse,
    OutputRegion,
    TensorRef,
)
from triton_mp.ipc.tensor_pool import ALIGN, BLOCK_HEADER_BYTES, block_ref
from triton_mp.workers.tensors.private_pages import PrivatePages, map_private, minor_faults

CLEAN_WINDOWS = 4096
"""At most this many input windows' last give-back counts are kept (``ClientRegions``)."""


class ClientRegions:
    """The worker's mappings of clients' registered system shared memory.

    Keyed by (key, registration id), so a client that re-creates an object under the same key
    and registers it again gets a fresh mapping. Outputs are mapped shared and writable,
    inputs copy-on-write (``private_pages``): a model may write its input in place, as in
    Triton 2.51, and the client's object stays as the client wrote it; the pages models
    wrote are given back before a window is viewed again (``input_window``). Inside a
    batch, an input whose bytes overlap an input viewed before it (two requests of one batch
    reading one window, as perf_analyzer's do) is a copy (``input_window``), so neither
    sees the other's writes. A decoupled python model, whose threads may write an input
    after ``execute`` returned, gets copies from its backend (``backends.python.backend``).
    At most ``capacity`` objects stay mapped (least recently used go first).
    ``copy_overlaps`` False (a backend that never writes the arrays it is given,
    ``Backend.writes_inputs``: onnxruntime) leaves overlapping inputs of a batch as views of
    the one window: with no write through either, the copy protects nothing (ocr_cls with
    perf_analyzer's images in shared memory made 7 copies of 110,592 bytes per batch of 8
    before the backend's own gather copied all 8 once more).

    NOTE: touching a mapping beyond the end of an object the client has since truncated
    raises SIGBUS, which no Python code can catch. Each batch re-checks the current size of
    every object it uses (``lseek`` to the end of a descriptor kept open, once per object and batch
    between ``batch_begins`` and ``batch_ends``; on every use outside a batch: a decoupled
    model's later responses) and fails the request instead; a truncation racing with a
    running batch can still kill the worker, which the supervisor restarts.
    """

    def __init__(self, capacity: int = 64, copy_overlaps: bool = True) -> None:
        self._maps: collections.OrderedDict[tuple[str, int, bool], tuple[mmap.mmap, int, int]] = (
            collections.OrderedDict()
        )
        """(key, registration id, writable) -> (mapping, descriptor, start address)."""
        self._capacity = capacity
        self._copy_overlaps = copy_overlaps
        self._private = PrivatePages()
        self._viewed: list[tuple[mmap.mmap, int, int]] = []
        """Inside a batch: each input window viewed, ``(mapping, offset, nbytes)`` (a later
        input overlapping one is a copy, ``input_window``)."""
        self._clean_at: dict[tuple[str, int, int, int], int] = {}
        """(key, registration id, offset, nbytes) of an input window -> the process's minor
        fault count when its written pages were last given back (``input_window``). A window
        not listed is looked at on its next view, so the dict is cleared when it grows past
        ``CLEAN_WINDOWS``."""
        self._faults: int | None = None
        """Inside a batch: the minor fault count read at its first input."""
        self._sizes: dict[tuple[str, int, bool], int] | None = None
        """Inside a batch: each object's size in bytes as this batch checked it (keyed as
        ``_maps``); None outside a batch (every use checks)."""

    def batch_begins(self) -> None:
        """A batch starts: an object's size is checked on its first use in the batch only."""
        self._sizes = {}
        self._faults = None

    def batch_ends(self) -> None:
        """The batch's answers are written: later uses check sizes again (the client may
        truncate or replace its object before the next request)."""
        self._sizes = None
        self._faults = None
        self._viewed.clear()

    def window(
        self, key: str, region_id: int, writable: bool, offset: int, nbytes: int, what: str
    ) -> mmap.mmap:
        """The mapped object, after checking ``[offset, offset + nbytes)`` lies inside it now.

        Raises:
            TritonMPError (INVALID_ARG): the client's object is gone, inaccessible, or
                smaller than the window (``what`` names the tensor in the message).
        """
        return self._checked(key, region_id, writable, offset, nbytes, what)[0]

    def _checked(
        self, key: str, region_id: int, writable: bool, offset: int, nbytes: int, what: str
    ) -> tuple[mmap.mmap, int, int]:
        """``window``'s work: the object's entry ``(mapping, descriptor, start address)``."""
        k = (key, region_id, writable)
        entry = self._maps.get(k)
        sizes = self._sizes
        if entry is None:
            entry, size = self._map(key, writable)
            self._maps[k] = entry
            while len(self._maps) > self._capacity:
                _, (old_buf, old_fd, _) = self._maps.popitem(last=False)
                _close(old_buf, old_fd)
            if sizes is not None:
                sizes[k] = size
        else:
            self._maps.move_to_end(k)
            checked = None if sizes is None else sizes.get(k)
            if checked is None:
                # NOTE: the object's size as lseek to its end gives it: the same i_size as
                # fstat's st_size, without building a stat_result (0.6 against 2.2 us under
                # load); nothing else reads this descriptor's offset.
                checked = os.lseek(entry[1], 0, os.SEEK_END)
                if sizes is not None:
                    sizes[k] = checked
            size = checked
        if offset + nbytes > min(size, len(entry[0])):
            raise TritonMPError(
                f"{what}: shared memory object '{key}' is {size} bytes now, smaller than the "
                f"registered window ending at byte {offset + nbytes}",
                ErrorCode.INVALID_ARG,
            )
        return entry

    def input_window(
        self, key: str, region_id: int, offset: int, nbytes: int, what: str
    ) -> tuple[mmap.mmap, bool]:
        """``window`` of an input: the copy-on-write mapping, and whether the input must be
        copied (inside a batch, its bytes overlap an input viewed before in the batch, and
        overlaps are copied: ``copy_overlaps``).

        Raises:
            TritonMPError (INVALID_ARG): as ``window``.
        """
        buf, _, address = self._checked(key, region_id, False, offset, nbytes, what)
        faults = self._faults
        if faults is None:
            faults = minor_faults()
            if self._sizes is not None:
                self._faults = faults
        w = (key, region_id, offset, nbytes)
        clean = self._clean_at
        if clean.get(w) != faults:
            # NOTE: a page written since this window was last given back (in its batch, or
            # later through an array the model kept, or by its thread after execute) made a
            # copy-on-write fault, so the count moved; given back before this view is made.
            self._private.drop_written(buf, address, offset, nbytes)
            if len(clean) >= CLEAN_WINDOWS:
                clean.clear()
            clean[w] = faults
        end = offset + nbytes
        if self._sizes is None or not self._copy_overlaps:
            return buf, False
        for seen, seen_offset, seen_nbytes in self._viewed:
            if seen is buf and seen_offset < end and offset < seen_offset + seen_nbytes:
                return buf, True
        self._viewed.append((buf, offset, nbytes))
        return buf, False

    @staticmethod
    def _map(key: str, writable: bool) -> tuple[tuple[mmap.mmap, int, int], int]:
        """``((mapping, descriptor, start address), object size in bytes)`` of the client's
        object now: shared for an output, copy-on-write for an input (start address 0 for
        an output: nothing asks it)."""
        try:
            obj = posix_ipc.SharedMemory(key, read_only=not writable)
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError, ValueError) as e:
            raise TritonMPError(
                f"Unable to map shared memory object '{key}' of a registered region: {e}",
                ErrorCode.INVALID_ARG,
            ) from None
        fd = obj.fd
        try:
            st = os.fstat(fd)
            # NOTE: re-checked here: the client may have replaced the object under the
            # same key since the frontend checked the registration.
            # NOTE: the supervisor is the parent, and its pid names this server's objects.
            refusal = client_object_refusal(key, st.st_uid, str(os.getppid()))
            if refusal is not None:
                os.close(fd)
                raise TritonMPError(
                    f"Unable to map shared memory object '{key}' of a registered region: {refusal}",
                    ErrorCode.INVALID_ARG,
                )
            size = st.st_size
            if not writable:
                buf, address = map_private(fd, size)
                return (buf, fd, address), size
            return (mmap.mmap(fd, size, prot=mmap.PROT_READ | mmap.PROT_WRITE), fd, 0), size
        except (OSError, ValueError) as e:
            os.close(fd)
            raise TritonMPError(
                f"Unable to map shared memory object '{key}' of a registered region: {e}",
                ErrorCode.INVALID_ARG,
            ) from None

    def close(self) -> None:
        """Unmap everything."""
        for buf, fd, _ in self._maps.values():
            _close(buf, fd)
        self._maps.clear()
        self._viewed.clear()
        self._clean_at.clear()
        self._private.close()


def _close(buf: mmap.mmap, fd: int) -> None:
    # NOTE: numpy views may still export the mapping; the OS unmaps it at exit then.
    with contextlib.suppress(BufferError):
        buf.close()
    os.close(fd)


def view_tensor(
    cache: SegmentCache, ref: TensorRef, regions: ClientRegions | None = None
) -> np.ndarray:
    """A numpy array over a tensor in shared memory (no copy for fixed-size types).

    Args:
        cache: attached arenas (``ref.segment`` when ``ref.region_id`` is 0).
        ref: the tensor; its shape and protocol datatype give the array's.
        regions: the client regions mapped (for ``ref.region_id`` > 0).

    Returns:
        A view for fixed-size types (valid while the block is; a copy where a client
        region's window overlaps an input viewed before in the batch,
        ``ClientRegions.input_window``); a new object array of ``bytes`` for BYTES.

    Raises:
        TritonMPError: a client region is gone, or smaller than the tensor (INVALID_ARG); a
            datatype with no numpy type (UNSUPPORTED). BF16 is viewed as ``BF16_DTYPE``.
    """
    fixed = FIXED_DTYPES.get(ref.datatype)
    if fixed is not None and not ref.region_id:
        # NOTE: the hot path (a fixed-size tensor in an arena): no lookups beyond the two.
        # NOTE: np.ndarray over the buffer is one call (frombuffer then reshape is two, and
        # the element count a third); it refuses a window past the buffer's end as well.
        return np.ndarray(ref.shape, fixed, cache.get(ref.segment).buf, ref.offset)
    buf: mmap.mmap
    shared = False
    if ref.region_id:
        if regions is None:
            raise TritonMPError(f"input '{ref.name}' is in a client region, which none maps here")
        buf, shared = regions.input_window(
            ref.segment, ref.region_id, ref.offset, ref.nbytes, f"input '{ref.name}'"
        )
        if fixed is not None:
            # NOTE: a fixed-size tensor in a client's region: one call, as for an arena.
            arr = np.ndarray(ref.shape, fixed, buf, ref.offset)
            return arr.copy() if shared else arr
    else:
        buf = cache.get(ref.segment).buf
    datatype = DataType.from_wire(ref.datatype)
    if datatype is DataType.STRING:
        return deserialize_bytes_tensor(
            memoryview(buf)[ref.offset : ref.offset + ref.nbytes], ref.shape
        )
    dtype = datatype.storage
    if dtype is None:
        raise TritonMPError(
            f"tensor '{ref.name}' of data type {ref.datatype} has no numpy type",
            ErrorCode.UNSUPPORTED,
        )
    count = element_count(ref.shape)
    arr = np.frombuffer(buf, dtype=dtype, count=count, offset=ref.offset).reshape(ref.shape)
    return arr.copy() if shared else arr


def request_inputs(
    cache: SegmentCache, req: InferRequest, regions: ClientRegions
) -> dict[str, np.ndarray]:
    """Every input of ``req`` by name, as ``view_tensor`` views it; an input whose bytes a
    client region output of the same request overlaps is a copy (``overlapping_inputs``).

    Raises:
        TritonMPError: as ``view_tensor``.
    """
    inputs = {}
    get = cache.get
    for ref in req.inputs:
        fixed = FIXED_DTYPES.get(ref.datatype)
        if fixed is not None and not ref.region_id:
            # NOTE: view_tensor's hot path, inlined (one call per input saved).
            inputs[ref.name] = np.ndarray(ref.shape, fixed, get(ref.segment).buf, ref.offset)
        else:
            inputs[ref.name] = view_tensor(cache, ref, regions)
    if req.output_regions:
        for name in overlapping_inputs(req):
            inputs[name] = inputs[name].copy()  # NOTE: see overlapping_inputs
    return inputs


def overlapping_inputs(req: InferRequest) -> list[str]:
    """The inputs of ``req`` whose bytes in a client's region overlap the window one of its
    outputs is written to (same object, intersecting byte ranges).

    Such an input is handed to the backend as a copy: a model that returns its input (or a
    view of it) would otherwise have its output copied over its own source through two
    mappings of the same pages, which no memcpy/memmove can see, and smear it. Triton copies
    every input out of the client's memory before the model runs, so the overlap is
    harmless there too.
    """
    out = []
    for ref in req.inputs:
        if not ref.region_id:
            continue
        end = ref.offset + ref.nbytes
        for region in req.output_regions:
            if (
                region is not None
                and region.key == ref.segment
                and region.offset < end
                and ref.offset < region.offset + region.byte_size
            ):
                out.append(ref.name)
                break
    return out


FIXED_DTYPES: dict[str, np.dtype] = {
    t.wire: t.storage for t in DataType if t.storage is not None and t is not DataType.STRING
}
"""Protocol datatype -> numpy dtype of the fixed-size types ``view_tensor`` views in place."""

WireTensor = tuple[str, str, tuple[int, ...], "np.ndarray | memoryview", int]
"""``(name, protocol datatype, shape, data, nbytes)`` of one tensor about to be written:
``data`` is the array itself when it is C-contiguous and of a fixed-size type (copied into
shared memory by its buffer, in native order), its wire bytes otherwise (a BYTES tensor's
length-prefixed form, a contiguous copy)."""

WIRE_OF: dict[np.dtype, str] = {
    t.storage: t.wire for t in DataType if t.storage is not None and t is not DataType.STRING
}
"""Native-order numpy dtype -> protocol datatype of the types written straight from the array."""


def wire_tensor(name: str, arr: np.ndarray) -> WireTensor:
    """An array as written to shared memory (``common.numpy_tensors.tensor_wire_bytes``).

    Raises:
        ValueError: a dtype with no Triton datatype.
    """
    # NOTE: numpy shapes are tuples of Python ints already.
    datatype = WIRE_OF.get(arr.dtype)
    if datatype is not None and arr.flags.c_contiguous:
        # NOTE: the hot path: copying from the array's own buffer is ~1 us cheaper per
        # tensor than through a uint8 memoryview of it.
        return name, datatype, arr.shape, arr, arr.nbytes
    datatype, data = tensor_wire_bytes(arr)
    return name, datatype, arr.shape, data, len(data)


def write_block(
    arena: ArenaAllocator, tensors: Sequence[WireTensor]
) -> tuple[BlockRef, tuple[TensorRef, ...]]:
    """Copy tensors into one new block of ``arena``, each at an aligned offset, in order.

    Returns:
        The block (freed by its reader with ``ipc.free_block``) and a ``TensorRef`` per
        tensor (offsets in bytes from the segment's start).

    Raises:
        ArenaExhausted: no arena has room and the budget forbids a new one.
    """
    total = 0
    for t in tensors:
        total += (t[4] + ALIGN - 1) & ~(ALIGN - 1)
    seg, block = arena.alloc(total)
    buf = seg.buf
    segment = seg.name
    pos = block + BLOCK_HEADER_BYTES
    refs = []
    for name, datatype, shape, data, n in tensors:
        if n:
            buf[pos : pos + n] = data  # type: ignore[assignment]  # NOTE: ndarray is a Buffer in numpy's stubs only from Python 3.12
        refs.append(TensorRef(name, datatype, shape, segment, pos, n))
        pos += (n + ALIGN - 1) & ~(ALIGN - 1)  # NOTE: tensor_pool.align, inlined
    return block_ref(seg, block), tuple(refs)


def free_own_block(arena: ArenaAllocator, block: BlockRef) -> None:
    """Free a block of this process's own ``arena`` that no reader will free (its message
    was never sent, or its reader answered): ``write_block``'s inverse."""
    seg = next(s for s in arena.segments() if s.name == block.segment)
    free_block(seg, block)


def write_outputs(
    arena: ArenaAllocator,
    regions: ClientRegions,
    req: InferRequest,
    outputs: dict[str, np.ndarray],
    final: bool = True,
) -> InferResponse:
    """Write one request's outputs: into the client's registered shared memory where the
    request asked for it, the rest into one block of this worker's arena (one copy each).

    Returns:
        The response, its ``outputs`` in ``req.outputs`` order (those the model produced).

    Raises:
        TritonMPError: a client region too small for its output
            (nothing is left allocated in the arena then).
    """
    if not req.output_regions:
        # NOTE: the hot path (every output to the arena): output_parts without the regions.
        tensors = arena_tensors(req, outputs)
        block, refs = write_block(arena, tensors) if tensors else (None, ())
        return InferResponse(
            request_id=req.request_id,
            version=req.version,
            outputs=refs,
            block=block,
            final=final,
            # NOTE: a plain dict carries no parameters (response_parameters' test, inlined).
            parameters_json="" if type(outputs) is dict else response_parameters(outputs),
        )
    # NOTE: client regions first: a region that fails its check leaves no arena block taken.
    placed: list[TensorRef | None] = []
    to_arena: list[WireTensor] = []
    for tensor, region in output_parts(req, outputs):
        if region is None:
            placed.append(None)
            to_arena.append(tensor)
        else:
            placed.append(write_region(regions, tensor, region))
    block_ref = None
    if to_arena:
        block_ref, refs = write_block(arena, to_arena)
        it = iter(refs)
        placed = [ref if ref is not None else next(it) for ref in placed]
    return InferResponse(
        request_id=req.request_id,
        version=req.version,
        outputs=tuple(placed),  # type: ignore[arg-type]  # NOTE: every None replaced above
        block=block_ref,
        final=final,
        parameters_json="" if type(outputs) is dict else response_parameters(outputs),
    )


def arena_tensors(req: InferRequest, outputs: dict[str, np.ndarray]) -> list[WireTensor]:
    """Each requested output the backend produced, as written, for a request that names no
    client region (all go to the arena): ``output_parts`` without the region checks (in the
    backend's order; an output the model did not produce is left out, as there)."""
    wanted = req.outputs
    wire_of = WIRE_OF
    out: list[WireTensor] = []
    for name, arr in outputs.items():
        if name in wanted:
            # NOTE: wire_tensor's hot path inlined (one call per output saved).
            datatype = wire_of.get(arr.dtype)
            if datatype is not None and arr.flags.c_contiguous:
                out.append((name, datatype, arr.shape, arr, arr.nbytes))
            else:
                out.append(wire_tensor(name, arr))
    return out


def output_parts(
    req: InferRequest, outputs: dict[str, np.ndarray]
) -> list[tuple[WireTensor, OutputRegion | None]]:
    """Each requested output the backend produced, as written, with the client region it goes
    to (None: arena), in the order the backend produced them (``outputs``' order): Triton's
    core answers outputs in the order the backend adds them, so a python model's response
    lists its ``output_tensors`` in the model's order, whatever order the request named them
    in (2.51, side by side in tests/e2e/test_python_answers.py; the onnxruntime and pytorch
    backends here produce them in request order). An output the model did not produce is
    left out of the response, as Triton answers a python model that omits one (the response
    has the others; nothing fails). In an ensemble it is Triton's placeholder
    (``scheduler.policies.ensemble``): the step that takes it is checked without it
    (``scheduler.rules.step_inputs``), and an ensemble output left out is left out of the
    ensemble's answer.

    Raises:
        TritonMPError: an output larger than its region (INTERNAL, the allocator's code).
    """
    parts = []
    names, regions = req.outputs, req.output_regions
    if regions and len(regions) != len(names):
        raise ValueError(f"{len(regions)} output regions for {len(names)} outputs")
    for name, arr in outputs.items():
        if name not in names:
            continue
        # NOTE: the name's region by its index (no name -> region dict per request).
        region = regions[names.index(name)] if regions else None
        tensor = wire_tensor(name, arr)
        size = tensor[4]
        if region is not None and size > region.byte_size:
            raise TritonMPError(
                f"shared memory size specified with the request for output '{name}' "
                f"({region.byte_size} bytes) should be at least {size} bytes to hold "
                "the results",
                ErrorCode.INTERNAL,  # NOTE: the allocator's code in Triton (500 over HTTP)
            )
        parts.append((tensor, region))
    return parts


def write_region(regions: ClientRegions, tensor: WireTensor, region: OutputRegion) -> TensorRef:
    """Copy one output into the client's registered region (Triton's output
    ``shared_memory_region`` / ``shared_memory_offset``).

    Raises:
        TritonMPError (INVALID_ARG): the region's object is gone or now too small.
    """
    name, datatype, shape, data, n = tensor
    dest = regions.window(
        region.key,
        region.region_id,
        True,
        region.offset,
        n,
        f"output '{name}' (region '{region.region_name}')",
    )
    if n:
        dest[region.offset : region.offset + n] = data  # type: ignore[assignment]  # NOTE: as above (Python 3.12 stubs)
    return TensorRef(name, datatype, shape, region.key, region.offset, n, region.region_id)
