"""The response cache's step in the submit path: key, lookup, hit answer, insertion.

Imported by the frontend only (``frontend.inference`` calls it; ``frontend.main`` builds
it). A model's requests are cached when the server has a cache (``--cache-config``) and
the model's config says ``response_cache { enable: true }`` (Triton's rule: both, or
nothing). The store is either the local cache every frontend shares
(``ipc.memory.response_cache``) or a Redis server (``frontend.cache.redis_store``); both map a
16-byte key to an entry's bytes.

The key (``request_key``) hashes what Triton's ``TritonCache::Hash`` hashes: the model's
name, its concrete version, and every input, ordered by name, by its name and bytes. It
also hashes each input's datatype and shape, so two requests whose bytes agree but whose
shapes differ never share an entry (Triton's key would mix them up). BLAKE2b with a 16-byte
digest replaces Triton's 64-bit ``boost::hash_combine``.

An entry (``encode_entry``) is one blob: a little-endian u32 header length, the msgpack
header (each output's name, datatype, shape, offset and size), then the outputs' bytes; a
hit's outputs are served straight out of that blob.

Only complete successful responses are stored. Requests whose inputs or outputs are in a
client's shared memory bypass the cache (no lookup, no statistics): their bytes are not
the frontend's to read or write here.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

import msgspec

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.frontend.validation.inputs import ValidInput
from triton_mp.frontend.validation.request import ValidRequest
from triton_mp.ipc import SegmentCache, TensorRef, encode
from triton_mp.ipc.protocol.messages import CacheOutcome, InferResponse

_Answer = TypeVar("_Answer")
"""What a request's sink takes (``dispatch.pending.Answer``: a response or a failure)."""

log = logging.getLogger(__name__)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<q")


class EntryTensor(msgspec.Struct, frozen=True, array_like=True):
    """One output in an entry's header: where its bytes are, after the header."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


_HEADER_DECODER = msgspec.msgpack.Decoder(tuple[EntryTensor, ...])
_HEADER_ENCODER = msgspec.msgpack.Encoder()


class Store(Protocol):
    """Where entries live: ``ipc.memory.response_cache.SharedResponseCache`` or
    ``frontend.cache.redis_store.RedisStore``."""

    def lookup(self, key: bytes) -> bytes | None:
        """The entry under ``key``, or None (also when the store cannot be reached)."""
        ...

    def insert(self, key: bytes, data: bytes) -> bool:
        """Store an entry; False when it was not stored."""
        ...


def request_key(model: str, version: int, inputs: Iterable[ValidInput]) -> bytes:
    """The 16-byte cache key of a request (see the module docstring)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(model.encode())
    h.update(_U64.pack(version))
    for i in sorted(inputs, key=lambda t: t.name):
        name = i.name.encode()
        h.update(_U32.pack(len(name)) + name + i.datatype.encode() + b"\0")
        h.update(_U32.pack(len(i.shape)) + b"".join(_U64.pack(d) for d in i.shape))
        h.update(_U64.pack(len(i.data)))
        h.update(i.data)
    return h.digest()


def encode_entry(tensors: Iterable[tuple[TensorRef, bytes | memoryview]]) -> bytes:
    """One entry's blob from each output's ref and bytes."""
    header, chunks, pos = [], [], 0
    for ref, data in tensors:
        header.append(EntryTensor(ref.name, ref.datatype, ref.shape, pos, len(data)))
        chunks.append(data)
        pos += len(data)
    head = _HEADER_ENCODER.encode(tuple(header))
    return b"".join((_U32.pack(len(head)), head, *chunks))


def decode_entry(blob: bytes) -> tuple[TensorRef, ...]:
    """An entry's outputs as refs into ``blob`` itself (segment ``""``).

    Raises:
        msgspec.DecodeError: not an entry.
    """
    (n,) = _U32.unpack_from(blob)
    base = _U32.size + n
    header = _HEADER_DECODER.decode(blob[_U32.size : base])
    return tuple(
        TensorRef(t.name, t.datatype, t.shape, "", base + t.offset, t.nbytes) for t in header
    )


class BlobSegments:
    """Stands for the arenas of an ``InferResult`` whose outputs are in one cache entry:
    every segment name maps to the entry's bytes."""

    __slots__ = ("buf",)

    def __init__(self, blob: bytes) -> None:
        self.buf = blob

    def get(self, _name: str) -> BlobSegments:
        """The entry itself (it has the ``buf`` a segment has)."""
        return self


class Hit(msgspec.Struct, frozen=True):
    """A cache hit: the answer to hand out, and the blob its outputs are in."""

    response: InferResponse
    segments: BlobSegments


def cache_enabled(config: mc.ModelConfig) -> bool:
    """The model's ``response_cache.enable``."""
    return bool(config.response_cache.enable)


def cacheable(valid: ValidRequest) -> bool:
    """Whether this request may use the cache: every input in the request itself, every
    output returned in the response (no client shared memory)."""
    return not valid.output_regions and all(i.window is None for i in valid.inputs)


class ResponseCacheStep:
    """The cache as the submit path uses it (one per frontend).

    Args:
        store: the local or Redis store.
        send_scheduler: pushes encoded bytes to the scheduler (the ``CacheOutcome``s).
        segments: the attached arenas, to read a miss's outputs for insertion.
        clock_ns: the monotonic clock.
    """

    def __init__(
        self,
        store: Store,
        send_scheduler: Callable[[bytes], None],
        segments: SegmentCache,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._store = store
        self._send = send_scheduler
        self._segments = segments
        self._clock_ns = clock_ns

    def lookup(self, valid: ValidRequest, arrival_ns: int) -> tuple[bytes, int, Hit | None]:
        """Look ``valid`` up: (its key, the lookup's duration in ns, the hit or None).

        A hit whose entry lacks an output the request asks for (the entry was stored for a
        request that asked for fewer) is a miss. A hit's ``CacheOutcome`` is sent here.
        """
        model = valid.model.name
        key = request_key(model, valid.version, valid.inputs)
        t0 = self._clock_ns()
        blob = self._store.lookup(key)
        hit = self._hit(valid, blob) if blob is not None else None
        t1 = self._clock_ns()
        if hit is not None:
            self._outcome(
                CacheOutcome(
                    model=model,
                    version=valid.version,
                    hit=True,
                    cache_ns=t1 - t0,
                    request_ns=t1 - arrival_ns,
                    queue_ns=t0 - arrival_ns,
                )
            )
        return key, t1 - t0, hit

    @staticmethod
    def _hit(valid: ValidRequest, blob: bytes) -> Hit | None:
        try:
            refs = {r.name: r for r in decode_entry(blob)}
        except (msgspec.DecodeError, struct.error):
            log.warning("response cache: an entry of model '%s' is corrupt", valid.model.name)
            return None
        names = valid.outputs or tuple(refs)
        if any(n not in refs for n in names):
            return None
        response = InferResponse(
            request_id=0, version=valid.version, outputs=tuple(refs[n] for n in names)
        )
        return Hit(response, BlobSegments(blob))

    def inserting_sink(
        self,
        sink: Callable[[_Answer], None],
        valid: ValidRequest,
        key: bytes,
        lookup_ns: int,
    ) -> Callable[[_Answer], None]:
        """``sink`` that first stores a successful final response under ``key`` (before
        the transport frees its block) and reports the miss."""

        def deliver(answer: _Answer) -> None:
            if (
                isinstance(answer, InferResponse)
                and answer.error is None
                and answer.final
                and not answer.empty
            ):
                self._insert(valid, key, lookup_ns, answer)
            sink(answer)

        return deliver

    def _insert(self, valid: ValidRequest, key: bytes, lookup_ns: int, r: InferResponse) -> None:
        t0 = self._clock_ns()
        if any(ref.region_id for ref in r.outputs):
            return
        tensors = [
            # NOTE: an empty output may name no block (segment "": answer_batch)
            (ref, self._segments.get(ref.segment).buf[ref.offset : ref.offset + ref.nbytes])
            if ref.nbytes
            else (ref, b"")
            for ref in r.outputs
        ]
        self._store.insert(key, encode_entry(tensors))
        cache_ns = lookup_ns + self._clock_ns() - t0
        self._outcome(
            CacheOutcome(
                model=valid.model.name, version=valid.version, hit=False, cache_ns=cache_ns
            )
        )

    def _outcome(self, outcome: CacheOutcome) -> None:
        try:
            self._send(encode(outcome))
        except Exception:  # noqa: BLE001 - statistics must never fail a request
            log.debug("response cache: statistics not sent", exc_info=True)
