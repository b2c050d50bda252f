"""Requests the frontend validated before, recognised by their wire form: one pass from the
received bytes to the descriptor the scheduler gets.

Imported by ``frontend.inference`` (which holds the ``KnownRequests``); no transport. A
transport that can name a request by everything except its tensor bytes and its id (gRPC
ModelInfer: the message without ``raw_input_contents`` and ``id``, ``grpc.wire``'s ``key``)
passes that key to ``Inference.submit``; a request that passed every check and needs
nothing but its raw bytes is kept as a ``KnownRequest``. The next request with the same key
then skips protobuf, the request objects and validation (``Inference.submit_known``): what
is left per request is what can differ, each raw input's byte size (fixed-size datatypes
only, so the size decides it), the model's table entry being the same object and the
server not draining. Anything else, and any failing check, goes the full way, which
answers with Triton's errors.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from triton_mp.common.datatypes import ELEMENT_BYTES
from triton_mp.frontend.model_table import Model
from triton_mp.frontend.request import InferenceRequest
from triton_mp.frontend.validation.request import ValidRequest
from triton_mp.frontend.validation.signature import SignatureCache
from triton_mp.ipc import ArenaAllocator, BlockRef, TensorRef
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, align


@dataclass(frozen=True, slots=True)
class KnownRequest:
    """What a request with a known key is, checked once.

    Attributes:
        model: the model table's entry it was checked against (identity guards a reload).
        valid: the validated request; its inputs' bytes are those of the first request
            and are never read again (``write_known`` takes each request's own).
        inputs: (name, datatype, full shape, byte size) per input, in request order.
        sizes: each input's byte size, in request order.
        block_bytes: the payload of the input block: each input 64-byte aligned.
    """

    model: Model
    valid: ValidRequest
    inputs: tuple[tuple[str, str, tuple[int, ...], int], ...]
    sizes: tuple[int, ...]
    block_bytes: int

    def matches(self, raw: Sequence[bytes | memoryview]) -> bool:
        """Whether ``raw`` (a request's ``raw_input_contents``) passes the data checks:
        one entry per input at least (surplus ones are ignored, as Triton does) and each
        of the byte size its input's shape and datatype call for."""
        sizes = self.sizes
        n = len(sizes)
        if len(raw) != n:
            if len(raw) < n:
                return False
            raw = raw[:n]
        return tuple(map(len, raw)) == sizes


def known_request(request: InferenceRequest, valid: ValidRequest) -> KnownRequest | None:
    """The ``KnownRequest`` for a request that passed validation, or None when a later
    request with the same key could fail or differ in what its key does not show.

    Only requests whose tensors carry no parameters and no typed contents (the
    ``SignatureCache`` rule), with a raw entry for every input of a fixed-size datatype,
    no forwarded headers and no sequence (a sequence's id changes its key request by
    request: keeping them would only churn the table) qualify.
    """
    if request.headers or valid.sequence_id or valid.sequence_flags:
        return None
    if SignatureCache.key(request, valid.version) is None:
        return None
    if len(request.raw_inputs) < len(valid.inputs):
        return None
    inputs = []
    total = 0
    for i in valid.inputs:
        size = ELEMENT_BYTES.get(i.datatype, 0)
        if i.window is not None or not size:
            return None  # NOTE: BYTES elements are checked per request (their lengths)
        inputs.append((i.name, i.datatype, i.shape, len(i.data)))
        total += align(len(i.data))
    return KnownRequest(valid.model, valid, tuple(inputs), tuple(i[3] for i in inputs), total)


def write_known(
    arena: ArenaAllocator, known: KnownRequest, raw: Sequence[bytes | memoryview]
) -> tuple[BlockRef, tuple[TensorRef, ...]]:
    """``inference.write_inputs`` for a known request: the raw entries (``matches``
    passed) copied into one new block of the arena, each input 64-byte aligned.

    Raises:
        ArenaExhausted (UNAVAILABLE): no room within the arena budget.
    """
    seg, block = arena.alloc(known.block_bytes)
    mv = memoryview(seg.buf)
    name = seg.name
    pos = block + BLOCK_HEADER_BYTES
    refs = []
    for data, (tensor, datatype, shape, n) in zip(raw, known.inputs, strict=False):
        mv[pos : pos + n] = data
        refs.append(TensorRef(tensor, datatype, shape, name, pos, n))
        pos += align(n)
    mv.release()
    return BlockRef(name, block), tuple(refs)


class KnownRequests:
    """Known requests by key, at most ``capacity`` (cleared whole when full: keys come
    from a few client programs, so a full table means one sending ever-new requests)."""

    def __init__(self, capacity: int = 512) -> None:
        self._entries: dict[Hashable, KnownRequest] = {}
        self._capacity = capacity

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
        self._entries[key] = entry

    def drop(self, key: Hashable) -> None:
        """Forget ``key`` (its model was reloaded or changed)."""
        self._entries.pop(key, None)
