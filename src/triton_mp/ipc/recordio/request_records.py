"""REQUEST records (``ipc.recordio.records``, kind 1): a frontend writes one per request, the
scheduler reads its header (``RequestRecord``), the worker the whole of it.

Imported by ``ipc.recordio.records``, which re-exports what the roles use.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BlockRef,
    InferRequest,
    OutputRegion,
    ReplyTo,
    Requester,
    TensorRef,
    TraceContext,
)
from triton_mp.ipc.recordio.record_layout import (
    CODE,
    KIND_REQUEST,
    MARKER,
    MAX_DIMS,
    NO_DIMS,
    OUTPUT_ENTRY,
    REQUEST_HEADER,
    SEQ_END,
    SEQ_START,
    SEQ_STRING,
    TENSOR_ENTRY,
    TRACE_MASK,
    VERSION,
    WIRE,
    Strings,
)


class RequestTail(msgspec.Struct, frozen=True, array_like=True):
    """A request's rare fields (``InferRequest``'s of the same names), msgpack in the tail."""

    parameters_json: str = "{}"
    output_regions: tuple[OutputRegion | None, ...] = ()
    sequence_id: str = ""


try:
    # NOTE: mypy sees the extension only where it is built: either ignore may be unused.
    from triton_mp.ipc import _request_decoder as native_decoder  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # NOTE: not built (setup.py): RequestDecoder decodes in Python
    native_decoder = None  # type: ignore[assignment,unused-ignore]

_tail_encoder = msgspec.msgpack.Encoder()
_tail_decoder = msgspec.msgpack.Decoder(RequestTail)
_NO_TAIL = RequestTail()


def encode_request(req: InferRequest) -> bytes | None:
    """``req`` as a REQUEST record; None when the record cannot say it (more than
    ``MAX_DIMS`` dims, an unknown datatype, a string longer than its u16 length field, an
    ensemble's step): send msgpack then."""
    try:
        return _encode_request(req)
    except struct.error:
        return None  # NOTE: e.g. a request id of 64 KiB or more


def _encode_request(req: InferRequest) -> bytes | None:
    if req.reply_to.kind is Requester.ENSEMBLE:
        return None
    inputs = req.inputs
    fixed = REQUEST_HEADER.size + TENSOR_ENTRY.size * len(inputs) + 8 * len(req.outputs)
    strings = Strings(fixed)
    entries = []
    for t in inputs:
        code = CODE.get(t.datatype)
        if code is None or len(t.shape) > MAX_DIMS:
            return None
        name_off, name_len = strings.add(t.name)
        seg_off, seg_len = strings.add(t.segment)
        shape = t.shape + NO_DIMS[len(t.shape) :]
        entries.append(
            TENSOR_ENTRY.pack(
                t.offset,
                t.nbytes,
                t.region_id,
                name_off,
                name_len,
                code,
                len(t.shape),
                seg_off,
                seg_len,
                0,
                *shape,
            )
        )
    for name in req.outputs:
        entries.append(OUTPUT_ENTRY.pack(*strings.add(name), 0))
    model_off, model_len = strings.add(req.model)
    seg_off, seg_len = strings.add(req.block.segment)
    cid_off, cid_len = strings.add(req.client_id) if req.client_id else (0, 0)
    flags = req.sequence_flags & (SEQ_START | SEQ_END)
    if req.trace is not None:
        flags |= req.trace.level & TRACE_MASK
    seq = req.sequence_id
    seq_text = ""
    if isinstance(seq, str):
        flags |= SEQ_STRING
        seq_text, seq = seq, 0
    tail = b""
    if seq_text or req.output_regions or req.parameters_json != "{}":
        tail = _tail_encoder.encode(RequestTail(req.parameters_json, req.output_regions, seq_text))
    tail_off = strings.pos if tail else 0
    size = strings.pos + len(tail)
    head = REQUEST_HEADER.pack(
        MARKER,
        KIND_REQUEST,
        VERSION,
        size,
        req.request_id,
        req.arrival_ns,
        seq,
        req.version,
        req.block.offset,
        req.reply_to.id,
        req.batch_size,
        req.timeout_us,
        req.priority,
        req.reply_to.kind,
        flags,
        len(inputs),
        len(req.outputs),
        model_len,
        model_off,
        seg_len,
        cid_len,
        seg_off,
        cid_off,
        tail_off,
        len(tail),
        req.block.generation,
        0,
    )
    return b"".join((head, *entries, *strings.parts, tail))


_replies: dict[tuple[int, int], ReplyTo] = {}


def reply_to(kind: int, reply_id: int) -> ReplyTo:
    """The ``ReplyTo`` of a record's ``reply_kind`` and ``reply_id`` (one object each).

    Raises:
        ValueError: ``kind`` is no ``Requester``.
    """
    reply = _replies.get((kind, reply_id))
    if reply is None:
        reply = _replies[(kind, reply_id)] = ReplyTo(Requester(kind), reply_id)
    return reply


TAILS_KEPT = 1024
"""Most distinct tails ``tail_of`` keeps decoded (then it starts over)."""

_tails: dict[bytes, RequestTail] = {}


def tail_of(raw: bytes) -> RequestTail:
    """The ``RequestTail`` of a record's tail bytes, decoded once per distinct tail: the C
    decoder's callback (``configure_tail``). A client's system-shm calls repeat the same
    tail (its output regions) on every request.

    Raises:
        msgspec.DecodeError: the bytes are no ``RequestTail`` (a ``ValueError``).
    """
    tail = _tails.get(raw)
    if tail is None:
        tail = _tail_decoder.decode(raw)
        if len(_tails) >= TAILS_KEPT:
            _tails.clear()
        _tails[raw] = tail
    return tail


if native_decoder is not None:
    native_decoder.configure(InferRequest, TensorRef, BlockRef, reply_to, WIRE)
    # NOTE: an extension built before configure_tail declines every tail, as before.
    _configure_tail = getattr(native_decoder, "configure_tail", None)
    if _configure_tail is not None:
        _configure_tail(tail_of)


class RequestDecoder:
    """Decodes REQUEST records into ``InferRequest`` s: in C when the extension is built
    (``ipc/native/request_decoder.cc``; it declines records with a trace level, and reads a
    tail through ``tail_of``),
    else here. What repeats from one request to the next (the strings, the tail, the
    pointers to them: everything but ids, times, offsets, sizes and shapes) is decoded once
    per form and kept (``FORMS_KEPT`` forms)."""

    FORMS_KEPT = 1024

    def __init__(self, native: bool = True) -> None:
        self._forms: dict[bytes, _Form] = {}
        self._reply: dict[tuple[int, int], ReplyTo] = {}
        self._native = native_decoder.decode if native and native_decoder is not None else None

    def decode(self, buf: Any) -> InferRequest:
        """One REQUEST record (``bytes`` or a ``memoryview`` of a ring record).

        Raises:
            ValueError: not a version-2 REQUEST record.
        """
        if self._native is not None:
            req = self._native(buf)
            if req is not None:
                return req  # type: ignore[no-any-return]
        data = bytes(buf)  # NOTE: one copy; slicing bytes is cheaper than a memoryview's
        h = REQUEST_HEADER.unpack_from(data, 0)
        if h[0] != MARKER or h[1] != KIND_REQUEST or h[2] != VERSION:
            raise ValueError(f"not a version-{VERSION} request record")
        n_inputs = h[15]
        end = REQUEST_HEADER.size + TENSOR_ENTRY.size * n_inputs
        # NOTE: bytes 64-96 hold the header's pointers and flags, 24-40 of a tensor entry
        # its pointers, dtype and rank; after the inputs come the output entries, the
        # strings and the tail (bytes 96-104, the block's generation, differ per request).
        # Equal keys decode to equal forms.
        key = data[64:96] + data[end:]
        for at in range(REQUEST_HEADER.size + 24, end, TENSOR_ENTRY.size):
            key += data[at : at + 16]
        form = self._forms.get(key)
        if form is None:
            form = _Form(data, h)
            if len(self._forms) >= self.FORMS_KEPT:
                self._forms.clear()
            self._forms[key] = form
        inputs = []
        at = REQUEST_HEADER.size
        for name, wire, ndim, seg in form.inputs:
            e = TENSOR_ENTRY.unpack_from(data, at)
            at += TENSOR_ENTRY.size
            inputs.append(TensorRef(name, wire, e[10 : 10 + ndim], seg, e[0], e[1], e[2]))
        reply = self._reply.get((h[13], h[9]))
        if reply is None:
            reply = self._reply[(h[13], h[9])] = ReplyTo(Requester(h[13]), h[9])
        tail = form.tail
        flags = h[14]
        return InferRequest(
            request_id=h[4],
            reply_to=reply,
            model=form.model,
            version=h[7],
            batch_size=h[10],
            inputs=tuple(inputs),
            outputs=form.outputs,
            block=BlockRef(form.block_segment, h[8], h[25]),
            arrival_ns=h[5],
            priority=h[12],
            timeout_us=h[11],
            client_id=form.client_id,
            parameters_json=tail.parameters_json,
            output_regions=tail.output_regions,
            sequence_id=tail.sequence_id if flags & SEQ_STRING else h[6],
            sequence_flags=flags & (SEQ_START | SEQ_END),
            trace=form.trace,
        )


class _Form:
    """What a REQUEST record shares with the other records of its form (``RequestDecoder``):
    its strings, its inputs' names, datatypes, ranks and segments, its tail."""

    __slots__ = ("block_segment", "client_id", "inputs", "model", "outputs", "tail", "trace")

    def __init__(self, data: bytes, h: tuple[Any, ...]) -> None:
        (model_len, model_off, seg_len, cid_len, seg_off, cid_off, tail_off, tail_len) = h[17:25]
        self.model = data[model_off : model_off + model_len].decode()
        self.block_segment = data[seg_off : seg_off + seg_len].decode()
        self.client_id = data[cid_off : cid_off + cid_len].decode()
        inputs = []
        at = REQUEST_HEADER.size
        for _ in range(h[15]):
            e = TENSOR_ENTRY.unpack_from(data, at)
            at += TENSOR_ENTRY.size
            name = data[e[3] : e[3] + e[4]].decode()
            inputs.append((name, WIRE[e[5]], e[6], data[e[7] : e[7] + e[8]].decode()))
        self.inputs = tuple(inputs)
        outputs = []
        for _ in range(h[16]):
            name_off, name_len, _pad = OUTPUT_ENTRY.unpack_from(data, at)
            at += OUTPUT_ENTRY.size
            outputs.append(data[name_off : name_off + name_len].decode())
        self.outputs = tuple(outputs)
        self.tail = (
            _tail_decoder.decode(data[tail_off : tail_off + tail_len]) if tail_len else _NO_TAIL
        )
        level = h[14] & TRACE_MASK
        self.trace = TraceContext(level) if level else None


_requests = RequestDecoder()


class RequestRecord:
    """A REQUEST record as the scheduler holds it: the header fields batching needs,
    unpacked at once; the record's bytes, which go on to the worker verbatim in the batch's
    ``BatchAssign``; everything else decoded on first use (``full``). The attribute names
    are ``InferRequest``'s, so the scheduler reads either alike. Only a record without a
    trace level and without a string sequence id becomes one (``record_decoder``):
    ``sequence_id`` is the uint64 and ``trace`` None. A tail (parameters, client output
    regions) schedules nothing: it stays in ``raw`` (every client system-shm call has one,
    which the scheduler used to decode whole, and re-encode into the ``BatchAssign``)."""

    __slots__ = (
        "raw", "request_id", "reply_to", "model", "version", "batch_size", "arrival_ns",
        "priority", "timeout_us", "sequence_id", "sequence_flags", "_full",
    )  # fmt: skip

    trace = None
    """Never traced (a traced request decodes to an ``InferRequest``)."""

    def __init__(
        self,
        raw: bytes,
        request_id: int,
        reply_to: ReplyTo,
        model: str,
        version: int,
        batch_size: int,
        arrival_ns: int,
        priority: int,
        timeout_us: int,
        sequence_id: int,
        sequence_flags: int,
    ) -> None:
        self.raw = raw
        self.request_id = request_id
        self.reply_to = reply_to
        self.model = model
        self.version = version
        self.batch_size = batch_size
        self.arrival_ns = arrival_ns
        self.priority = priority
        self.timeout_us = timeout_us
        self.sequence_id = sequence_id
        self.sequence_flags = sequence_flags
        self._full: InferRequest | None = None

    def full(self) -> InferRequest:
        """The whole request (decoded once)."""
        if self._full is None:
            self._full = _requests.decode(self.raw)
        return self._full

    @property
    def inputs(self) -> tuple[TensorRef, ...]:
        return self.full().inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.full().outputs

    @property
    def block(self) -> BlockRef:
        return self.full().block

    @property
    def client_id(self) -> str:
        return self.full().client_id

    @property
    def parameters_json(self) -> str:
        return self.full().parameters_json

    @property
    def output_regions(self) -> tuple[OutputRegion | None, ...]:
        return self.full().output_regions

    def __repr__(self) -> str:
        return f"RequestRecord({self.full()!r})"


Request = InferRequest | RequestRecord
"""A request as the scheduler holds it."""


def as_request(req: Request) -> InferRequest:
    """``req`` as an ``InferRequest`` (a record decoded whole)."""
    return req.full() if isinstance(req, RequestRecord) else req


def wire_form(req: Request) -> InferRequest | bytes:
    """How a request travels in a ``BatchAssign``: a record's bytes verbatim, else the
    message."""
    return req.raw if isinstance(req, RequestRecord) else req


def decode_request(data: bytes | InferRequest) -> InferRequest:
    """A ``BatchAssign`` entry as an ``InferRequest`` (a worker's view of its batch)."""
    return data if isinstance(data, InferRequest) else _requests.decode(data)


def decoded_batch(batch: BatchAssign) -> BatchAssign:
    """``batch`` with every request an ``InferRequest`` (a worker's first step)."""
    if not any(type(r) is bytes for r in batch.requests):
        return batch
    return msgspec.structs.replace(batch, requests=tuple(map(decode_request, batch.requests)))


_BATCHING_FIELDS = struct.Struct("<BBH4xQQQq8xIIIIBB4xHI12xII8x")
"""``REQUEST_HEADER`` with only what ``HeaderReader`` reads unpacked (the rest skipped as
padding: 17 objects per request, not 27): marker, kind, version, request_id, arrival_ns,
sequence id, model_version, reply id, batch_size, timeout_us, priority, reply kind, flags,
model name length and offset, tail offset and length."""
assert _BATCHING_FIELDS.size == REQUEST_HEADER.size


if native_decoder is not None:
    native_decoder.configure_header(RequestRecord)


class HeaderReader:
    """Reads a REQUEST record's header into a ``RequestRecord`` (``record_decoder``): in C
    when the extension is built (``read_header`` in ``ipc/native/request_decoder.cc``; it
    declines the rare forms, which are read here), else here.

    Args:
        native: use the C reader when it is built (False: the Python one, for tests).
    """

    def __init__(self, native: bool = True) -> None:
        self._models: dict[bytes, str] = {}
        self._reply: dict[tuple[int, int], ReplyTo] = {}
        self._full = RequestDecoder()
        self._native = native_decoder.read_header if native and native_decoder is not None else None

    def read(self, buf: Any) -> Request:
        if self._native is not None:
            got = self._native(buf)
            if got is not None:
                return got  # type: ignore[no-any-return]
        data = bytes(buf)
        (
            marker, kind, version, request_id, arrival_ns, seq, model_version, reply_id,
            batch_size, timeout_us, priority, reply_kind, flags, model_len, model_off,
            tail_off, tail_len,
        ) = _BATCHING_FIELDS.unpack_from(data, 0)  # fmt: skip
        if (
            flags & (TRACE_MASK | SEQ_STRING)
            or version != VERSION
            or (tail_len and (tail_off > len(data) or tail_len > len(data) - tail_off))
        ):
            # NOTE: the fields that schedule it are not all in the header (a string
            # sequence id, a trace level), or it is malformed: decoded whole at once.
            return self._full.decode(data)
        raw = data[model_off : model_off + model_len]
        model = self._models.get(raw)
        if model is None:
            model = raw.decode()
            if len(self._models) < 4096:
                self._models[raw] = model
        reply = self._reply.get((reply_kind, reply_id))
        if reply is None:
            reply = self._reply[(reply_kind, reply_id)] = ReplyTo(Requester(reply_kind), reply_id)
        return RequestRecord(
            data, request_id, reply, model, model_version, batch_size, arrival_ns, priority,
            timeout_us, seq, flags & (SEQ_START | SEQ_END),
        )  # fmt: skip
