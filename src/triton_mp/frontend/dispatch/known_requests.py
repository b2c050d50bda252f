"""Requests the frontend validated before, recognised by their wire form: one pass from the
received bytes to the descriptor the scheduler gets.

Imported by ``frontend.inference`` (which holds the ``KnownRequests``); no transport. A
transport that can name a request by everything except its tensor bytes and its id (gRPC
ModelInfer: the message without ``raw_input_contents`` and ``id``, ``grpc.wire``'s ``key``)
passes that key to ``Inference.submit``; a request that passed every check and needs
nothing but its raw bytes and its windows in clients' shared memory is kept as a
``KnownRequest``. The next request with the same key then skips protobuf, the request
objects and validation (``Inference.submit_known``): what is left per request is what can
differ, each raw input's byte size (fixed-size datatypes only, so the size decides it),
the model's table entry being the same object, the registered regions unchanged
(``SystemShmRegistry.generation``) and the server not draining. Anything else, and any
failing check, goes the full way, which answers with Triton's errors.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from triton_mp.common.datatypes import ELEMENT_BYTES
from triton_mp.frontend.dispatch.known_records import Form, Template
from triton_mp.frontend.model_table import Model
from triton_mp.frontend.request import InferenceRequest
from triton_mp.frontend.validation.request import ValidRequest
from triton_mp.ipc import ArenaAllocator, BlockRef, TensorRef
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, align, block_ref

_SHM_PARAMETERS = frozenset(
    ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
)
"""The only tensor parameters a known request may carry: its window in a client's region."""

RawInput = tuple[str, str, tuple[int, ...], int]
"""An input sent in ``raw_input_contents``: name, datatype, full shape, byte size."""


class Received(Protocol):
    """A request message left in the transport's receive buffers (``_native.Received``,
    ``frontend/native/received.h``)."""

    def tobytes(self) -> bytes:
        """The whole message, copied."""
        ...

    def copy_into(self, dst: memoryview, places: Sequence[tuple[int, int, int]]) -> None:
        """For each (at, offset, length): the message's bytes ``[offset, offset + length)``
        copied to ``dst[at : at + length]``; ValueError, nothing copied, when one lies
        outside either."""
        ...


class InBuffers:
    """A request's ``raw_input_contents`` still in its message's receive buffers:
    ``write_known`` copies them from there straight into the input block (one copy, where
    bytes of the message and then the block were two).

    Args:
        message: the message as received.
        spans: each entry's (offset, length) in the message, in order.
    """

    __slots__ = ("message", "spans")

    def __init__(self, message: Received, spans: Sequence[tuple[int, int]]) -> None:
        self.message = message
        self.spans = spans

    def __len__(self) -> int:
        return len(self.spans)


Raw = Sequence[bytes | memoryview] | InBuffers
"""A request's ``raw_input_contents``: each entry's bytes, or where they lie received."""


@dataclass(frozen=True, slots=True)
class KnownRequest:
    """What a request with a known key is, checked once.

    Attributes:
        model: the model table's entry it was checked against (identity guards a reload).
        valid: the validated request; its inputs' bytes are those of the first request
            and are never read again (``write_known`` takes each request's own).
        inputs: per input in request order, a ``RawInput``, or the ``TensorRef`` of an
            input in a client's shared memory (the same for every request: its window).
        sizes: the byte size of each raw input, in order.
        block_bytes: the payload of the input block: each raw input 64-byte aligned.
        held: the ``region_id`` of every client region the request names (one per tensor
            in a region, inputs then outputs: ``dispatch.inputs.region_ids``).
        generation: the shared-memory registry's ``generation`` it was checked at: a
            registration or unregistration since makes it unknown again when it names a
            region (``held``).
        templates: its REQUEST records (with their quiet-word bits) by form
            (``frontend.dispatch.known_records``),
            filled as requests are sent.
    """

    model: Model
    valid: ValidRequest
    inputs: tuple[RawInput | TensorRef, ...]
    sizes: tuple[int, ...]
    block_bytes: int
    held: tuple[int, ...] = ()
    generation: int = 0
    templates: dict[Form, Template] = field(default_factory=dict, compare=False, repr=False)

    def matches(self, raw: Raw) -> bool:
        """Whether ``raw`` (a request's ``raw_input_contents``) passes the data checks:
        one entry per raw input at least (surplus ones are ignored, as Triton does) and
        each of the byte size its input's shape and datatype call for."""
        sizes = self.sizes
        n = len(sizes)
        if isinstance(raw, InBuffers):
            got = tuple(length for _, length in raw.spans)
        else:
            got = tuple(map(len, raw))
        if len(got) != n:
            if len(got) < n:
                return False
            got = got[:n]
        return got == sizes


def _plain(params: Mapping[str, object], in_shm: bool) -> bool:
    """A tensor's parameters are none, or exactly its shared-memory window's."""
    return not params or (in_shm and params.keys() <= _SHM_PARAMETERS)


def known_request(
    request: InferenceRequest, valid: ValidRequest, held: tuple[int, ...] = (), generation: int = 0
) -> KnownRequest | None:
    """The ``KnownRequest`` for a request that passed validation, or None when a later
    request with the same key could fail or differ in what its key does not show.

    Args:
        held: the client regions the request holds (``dispatch.inputs.region_ids``).
        generation: the shared-memory registry's ``generation`` now.

    Only requests whose tensors carry no typed contents and no parameters but their
    shared-memory window, whose raw inputs (each with its entry) are of a fixed-size
    datatype, with no forwarded headers and no sequence (a sequence's id changes its key
    request by request: keeping them would only churn the table) qualify.
    """
    if request.headers or valid.sequence_id or valid.sequence_flags:
        return None
    for o in request.outputs:
        # NOTE: it passed, so an output with shared-memory parameters is in a region.
        if not _plain(o.parameters, True):
            return None
    inputs: list[RawInput | TensorRef] = []
    total = 0
    for t, i in zip(request.inputs, valid.inputs, strict=True):
        w = i.window
        if t.contents or not _plain(t.parameters, w is not None):
            return None
        if not all(type(d) is int for d in t.shape):
            return None
        if w is not None:
            inputs.append(
                TensorRef(i.name, i.datatype, i.shape, w.key, w.offset, w.byte_size, w.region_id)
            )
            continue
        if not ELEMENT_BYTES.get(i.datatype, 0):
            return None  # NOTE: BYTES elements are checked per request (their lengths)
        inputs.append((i.name, i.datatype, i.shape, len(i.data)))
        total += align(len(i.data))
    sizes = tuple(spec[3] for spec in inputs if type(spec) is tuple)
    if len(request.raw_inputs) < len(sizes):
        return None
    return KnownRequest(valid.model, valid, tuple(inputs), sizes, total, held, generation)


def write_known(
    arena: ArenaAllocator, known: KnownRequest, raw: Raw
) -> tuple[BlockRef, tuple[TensorRef, ...]]:
    """``dispatch.inputs.write_inputs`` for a known request: the raw entries (``matches``
    passed) copied into one new block of the arena, each input 64-byte aligned (from the
    receive buffers, for ``InBuffers``); an input in a client's region is named, not
    copied.

    Raises:
        ArenaExhausted (UNAVAILABLE): no room within the arena budget.
    """
    seg, block = arena.alloc(known.block_bytes)
    mv = memoryview(seg.buf)
    name = seg.name
    pos = block + BLOCK_HEADER_BYTES
    refs = []
    received: InBuffers | None = None
    spans: Iterator[tuple[int, int]] = iter(())
    entries: Iterator[bytes | memoryview] = iter(())
    if isinstance(raw, InBuffers):
        received, spans = raw, iter(raw.spans)
    else:
        entries = iter(raw)
    places = []
    for spec in known.inputs:
        if isinstance(spec, TensorRef):  # NOTE: a window in a client's region
            refs.append(spec)
            continue
        tensor, datatype, shape, n = spec
        if received is not None:
            places.append((pos, next(spans)[0], n))
        else:
            mv[pos : pos + n] = next(entries)
        refs.append(TensorRef(tensor, datatype, shape, name, pos, n))
        pos += align(n)
    if received is not None:
        received.message.copy_into(mv, places)
    mv.release()
    return block_ref(seg, block), tuple(refs)


class KnownRequests:
    """Known requests by key, at most ``capacity`` (cleared whole when full: keys come
    from a few client programs, so a full table means one sending ever-new requests)."""

    def __init__(self, capacity: int = 512) -> None:
        self._entries: dict[Hashable, KnownRequest] = {}
        self._capacity = capacity
        self.on_forget: Callable[[], None] | None = None
        """Called when a key is dropped or the table cleared (``KnownLane.on_forget``)."""

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> KnownRequest | None:
        """The entry for ``key``, or None."""
        return self._entries.get(key)

    def put(self, key: Hashable, entry: KnownRequest) -> None:
        """Remember a request that passed every check."""
        if len(self._entries) >= self._capacity:
            self._entries.clear()
            if self.on_forget is not None:
                self.on_forget()
        self._entries[key] = entry

    def drop(self, key: Hashable) -> None:
        """Forget ``key`` (its model was reloaded or changed)."""
        self._entries.pop(key, None)
        if self.on_forget is not None:
            self.on_forget()
