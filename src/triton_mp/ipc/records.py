"""Fixed-layout binary records on the rings: the request (frontend -> scheduler) and the
answers (worker -> frontend), version 1.

Imported by ``ipc.channel`` (an inbox decodes them beside msgpack messages), the frontend (it
writes requests, reads answers), the scheduler (reads requests) and the workers (write
answers). C twin: ``ipc/records.h`` (packed structs, the same offsets); the native gRPC data
path writes requests and reads answers with it. Change both together and bump ``VERSION``.

Rule 0: a ring record whose first byte is ``MARKER`` (0xC1, a byte msgpack never produces) is
one of these; byte 1 is its kind, bytes 2-3 its version, bytes 4-7 its size. Anything else on
a ring is a msgpack message (``ipc.messages``). All integers little-endian; every offset is
from the record's first byte; strings are UTF-8 named by ``(offset, length)`` into a string
area after the fixed entries; datatypes are ``TRITONSERVER_DataType`` numbers
(``common.datatypes.DataType``), error codes ``TRITONSERVER_Error_Code`` (``ErrorCode``).

REQUEST (kind 1), written by a frontend (Python here, or native), read by the scheduler::

    header (96)           REQUEST_HEADER, fields in the order of its format:
      0 u8 marker, 1 u8 kind, 2 u16 version, 4 u32 size, 8 u64 request_id,
      16 u64 arrival_ns (CLOCK_MONOTONIC), 24 u64 sequence_id (uint64 correlation id),
      32 i64 model_version, 40 u64 block_offset (the input block), 48 u32 reply_id,
      52 u32 batch_size, 56 u32 timeout_us, 60 u32 priority, 64 u8 reply_kind (Requester),
      65 u8 flags (SEQ_START 1, SEQ_END 2, trace level 0x0C, SEQ_STRING 0x10),
      66 u16 n_inputs, 68 u16 n_outputs, 70 u16 model_len, 72 u32 model_off,
      76 u16 block_seg_len, 78 u16 client_id_len, 80 u32 block_seg_off,
      84 u32 client_id_off, 88 u32 tail_off, 92 u32 tail_len
    n_inputs  x TENSOR_ENTRY (104):
      0 u64 offset, 8 u64 nbytes, 16 u64 region_id, 24 u32 name_off, 28 u16 name_len,
      30 u8 dtype, 31 u8 ndim (<= MAX_DIMS), 32 u32 segment_off, 36 u16 segment_len,
      38 u16 pad, 40 i64[8] shape
    n_outputs x OUTPUT_ENTRY (8): 0 u32 name_off, 4 u16 name_len, 6 u16 pad
    strings, then the tail: msgpack ``RequestTail`` (rare fields; Python only)

ANSWERS (kind 2), written by a worker, read by one frontend: the answers to that frontend's
requests of one batch (or one response of a decoupled model)::

    header (48)           ANSWERS_HEADER: 0 u8 marker, 1 u8 kind, 2 u16 version, 4 u32 size,
      8 u64 block_offset, 16 u32 block_uses, 20 u16 n_responses, 22 u16 block_seg_len
      (0: no block), 24 u32 block_seg_off, 28 u32 n_tensors, 32 u32 tail_off (0 in v1),
      36 u32 tail_len, 40 u64 pad
    n_responses x RESPONSE_ENTRY (48): 0 u64 request_id, 8 i64 model_version,
      16 u16 n_outputs, 18 u8 flags (FINAL 1, ERROR 2, NAMES_BLOCK 4, EMPTY 8),
      19 u8 error_code, 20 u16 origin_len, 22 u16 pad, 24 u32 error_off, 28 u32 error_len,
      32 u32 params_off, 36 u32 params_len (response parameters JSON), 40 u32 origin_off,
      44 u32 pad
    n_tensors x TENSOR_ENTRY: the outputs, response by response (segment length 0: the
      record's block segment)
    strings

An answer that names its block once (one response) decodes as an ``InferResponse`` owning
the block; one with more responses as an ``AnswerBatch`` handing the block over for
``block_uses`` uses (``ipc.tensor_pool.SharedBlocks``). What the records cannot say (more
dims than ``MAX_DIMS``, trace records, extra or shared blocks of ensembles) goes as msgpack:
``encode_request`` / ``encode_answer`` return None and the caller sends ``codec.encode``'s.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgspec

from triton_mp.common.datatypes import DataType
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.messages import (
    AnswerBatch,
    BlockRef,
    ErrorInfo,
    Handoff,
    InferRequest,
    InferResponse,
    OutputRegion,
    ReplyTo,
    Requester,
    TensorRef,
    TraceContext,
)

MARKER = 0xC1
VERSION = 1
KIND_REQUEST = 1
KIND_ANSWERS = 2
KIND_DISPATCH = 3
MAX_DIMS = 8

SEQ_START = 0x1
SEQ_END = 0x2
TRACE_MASK = 0x0C
"""``TRITONSERVER_InferenceTraceLevel`` bits of a sampled request (TIMESTAMPS 4, TENSORS 8)."""
SEQ_STRING = 0x10

FINAL = 0x1
ERROR = 0x2
NAMES_BLOCK = 0x4
EMPTY = 0x8

REQUEST_HEADER = struct.Struct("<BBHIQQQqQIIIIBBHHHIHHIIII")
TENSOR_ENTRY = struct.Struct("<QQQIHBBIHH8q")
OUTPUT_ENTRY = struct.Struct("<IHH")
ANSWERS_HEADER = struct.Struct("<BBHIQIHHIIIIQ")
RESPONSE_ENTRY = struct.Struct("<QqHBBHHIIIIII")
assert REQUEST_HEADER.size == 96
assert TENSOR_ENTRY.size == 104
assert OUTPUT_ENTRY.size == 8
assert ANSWERS_HEADER.size == 48
assert RESPONSE_ENTRY.size == 48

_NO_DIMS = (0,) * MAX_DIMS
_WIRE = [DataType(i).wire for i in range(len(DataType))]
"""dtype code -> protocol string (``FP32``, ``BYTES``)."""
_CODE = {w: i for i, w in enumerate(_WIRE) if i}


class RequestTail(msgspec.Struct, frozen=True, array_like=True):
    """A request's rare fields (``InferRequest``'s of the same names), msgpack in the tail."""

    parameters_json: str = "{}"
    output_regions: tuple[OutputRegion | None, ...] = ()
    sequence_id: str = ""


_tail_encoder = msgspec.msgpack.Encoder()
_tail_decoder = msgspec.msgpack.Decoder(RequestTail)
_NO_TAIL = RequestTail()


class _Strings:
    """The string area being built: ``add`` returns a string's (offset, length)."""

    __slots__ = ("base", "parts", "pos")

    def __init__(self, base: int) -> None:
        self.base = base
        self.parts: list[bytes] = []
        self.pos = base

    def add(self, text: str) -> tuple[int, int]:
        data = text.encode()
        at = self.pos
        self.parts.append(data)
        self.pos += len(data)
        return at, len(data)


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
    strings = _Strings(fixed)
    entries = []
    for t in inputs:
        code = _CODE.get(t.datatype)
        if code is None or len(t.shape) > MAX_DIMS:
            return None
        name_off, name_len = strings.add(t.name)
        seg_off, seg_len = strings.add(t.segment)
        shape = t.shape + _NO_DIMS[len(t.shape) :]
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
    )
    return b"".join((head, *entries, *strings.parts, tail))


class RequestDecoder:
    """Decodes REQUEST records into ``InferRequest`` s, interning the strings that repeat
    (model, segment and tensor names) and the reply addresses."""

    def __init__(self) -> None:
        self._text: dict[bytes, str] = {}
        self._reply: dict[tuple[int, int], ReplyTo] = {}

    def _new_text(self, raw: bytes) -> str:
        s = raw.decode()
        if len(self._text) < 65536:
            self._text[raw] = s
        return s

    def decode(self, buf: Any) -> InferRequest:
        """One REQUEST record (``bytes`` or a ``memoryview`` of a ring record).

        Raises:
            ValueError: not a version-1 REQUEST record.
        """
        data = bytes(buf)  # NOTE: one copy; slicing bytes is cheaper than a memoryview's
        (
            marker,
            kind,
            version,
            _size,
            request_id,
            arrival_ns,
            seq,
            model_version,
            block_offset,
            reply_id,
            batch_size,
            timeout_us,
            priority,
            reply_kind,
            flags,
            n_inputs,
            n_outputs,
            model_len,
            model_off,
            seg_len,
            cid_len,
            seg_off,
            cid_off,
            tail_off,
            tail_len,
        ) = REQUEST_HEADER.unpack_from(data, 0)
        if marker != MARKER or kind != KIND_REQUEST or version != VERSION:
            raise ValueError(f"not a version-{VERSION} request record")
        get = self._text.get
        new = self._new_text
        inputs = []
        at = 96
        unpack = TENSOR_ENTRY.unpack_from
        for _ in range(n_inputs):
            e = unpack(data, at)
            at += 104
            raw = data[e[3] : e[3] + e[4]]
            name = get(raw) or new(raw)
            raw = data[e[7] : e[7] + e[8]]
            inputs.append(
                TensorRef(
                    name, _WIRE[e[5]], e[10 : 10 + e[6]], get(raw) or new(raw), e[0], e[1], e[2]
                )
            )
        outputs = []
        for _ in range(n_outputs):
            name_off, name_len, _pad = OUTPUT_ENTRY.unpack_from(data, at)
            at += 8
            raw = data[name_off : name_off + name_len]
            outputs.append(get(raw) or new(raw))
        tail = _tail_decoder.decode(data[tail_off : tail_off + tail_len]) if tail_len else _NO_TAIL
        reply = self._reply.get((reply_kind, reply_id))
        if reply is None:
            reply = self._reply[(reply_kind, reply_id)] = ReplyTo(Requester(reply_kind), reply_id)
        level = flags & TRACE_MASK
        raw = data[model_off : model_off + model_len]
        model = get(raw) or new(raw)
        raw = data[seg_off : seg_off + seg_len]
        return InferRequest(
            request_id=request_id,
            reply_to=reply,
            model=model,
            version=model_version,
            batch_size=batch_size,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            block=BlockRef(get(raw) or new(raw), block_offset),
            arrival_ns=arrival_ns,
            priority=priority,
            timeout_us=timeout_us,
            client_id=data[cid_off : cid_off + cid_len].decode() if cid_len else "",
            parameters_json=tail.parameters_json,
            output_regions=tail.output_regions,
            sequence_id=tail.sequence_id if flags & SEQ_STRING else seq,
            sequence_flags=flags & (SEQ_START | SEQ_END),
            trace=TraceContext(level) if level else None,
        )


def encode_answer(msg: Any) -> bytes | None:
    """An ``AnswerBatch``, or an ``InferResponse`` owning at most its one block, as an
    ANSWERS record; None for anything it cannot say (trace records, extra or shared blocks
    of ensembles, more than ``MAX_DIMS`` dims, a string too long for its length field):
    send msgpack then."""
    try:
        return _encode_answer(msg)
    except struct.error:
        return None


def _encode_answer(msg: Any) -> bytes | None:
    if isinstance(msg, InferResponse):
        if msg.trace is not None or msg.extra_blocks or msg.shared_blocks or msg.handoffs:
            return None
        block = msg.block
        uses = 1 if block is not None else 0
        responses: tuple[InferResponse, ...] = (msg,)
    elif isinstance(msg, AnswerBatch):
        if len(msg.handoffs) > 1:
            return None
        block = msg.handoffs[0].block if msg.handoffs else None
        uses = msg.handoffs[0].uses if msg.handoffs else 0
        responses = msg.responses
        for r in responses:
            if r.trace is not None or r.extra_blocks or r.block is not None or r.handoffs:
                return None
            if r.shared_blocks and r.shared_blocks != (block,):
                return None
    else:
        return None
    n_tensors = sum(len(r.outputs) for r in responses)
    fixed = ANSWERS_HEADER.size + RESPONSE_ENTRY.size * len(responses) + 104 * n_tensors
    strings = _Strings(fixed)
    block_seg = block.segment if block is not None else ""
    seg_off, seg_len = strings.add(block_seg) if block_seg else (0, 0)
    resp_parts = []
    tensor_parts = []
    for r in responses:
        flags = FINAL if r.final else 0
        if r.empty:
            flags |= EMPTY
        if block is not None and (r.block is not None or r.shared_blocks):
            flags |= NAMES_BLOCK
        err_code = err_off = err_len = org_off = org_len = 0
        if r.error is not None:
            flags |= ERROR
            err_code = int(r.error.code)
            err_off, err_len = strings.add(r.error.message)
            if r.error.origin:
                org_off, org_len = strings.add(r.error.origin)
        par_off, par_len = strings.add(r.parameters_json) if r.parameters_json else (0, 0)
        for t in r.outputs:
            code = _CODE.get(t.datatype)
            if code is None or len(t.shape) > MAX_DIMS:
                return None
            name_off, name_len = strings.add(t.name)
            if t.segment == block_seg and not t.region_id:
                t_off = t_len = 0
            else:
                t_off, t_len = strings.add(t.segment)
            tensor_parts.append(
                TENSOR_ENTRY.pack(
                    t.offset,
                    t.nbytes,
                    t.region_id,
                    name_off,
                    name_len,
                    code,
                    len(t.shape),
                    t_off,
                    t_len,
                    0,
                    *(t.shape + _NO_DIMS[len(t.shape) :]),
                )
            )
        resp_parts.append(
            RESPONSE_ENTRY.pack(
                r.request_id,
                r.version,
                len(r.outputs),
                flags,
                err_code,
                org_len,
                0,
                err_off,
                err_len,
                par_off,
                par_len,
                org_off,
                0,
            )
        )
    head = ANSWERS_HEADER.pack(
        MARKER,
        KIND_ANSWERS,
        VERSION,
        strings.pos,
        block.offset if block is not None else 0,
        uses,
        len(responses),
        seg_len,
        seg_off,
        n_tensors,
        0,
        0,
        0,
    )
    return b"".join((head, *resp_parts, *tensor_parts, *strings.parts))


def decode_answer(buf: Any) -> InferResponse | AnswerBatch:
    """One ANSWERS record: an ``InferResponse`` (owning the block, if any) when it holds
    one response, else an ``AnswerBatch``.

    Raises:
        ValueError: not a version-1 ANSWERS record.
    """
    (
        marker,
        kind,
        version,
        _size,
        block_offset,
        uses,
        n_resp,
        seg_len,
        seg_off,
        _n_tensors,
        _tail_off,
        _tail_len,
        _pad,
    ) = ANSWERS_HEADER.unpack_from(buf, 0)
    if marker != MARKER or kind != KIND_ANSWERS or version != VERSION:
        raise ValueError(f"not a version-{VERSION} answers record")
    block_seg = bytes(buf[seg_off : seg_off + seg_len]).decode() if seg_len else ""
    block = BlockRef(block_seg, block_offset) if seg_len else None
    own = n_resp == 1 and uses <= 1
    shared = (block,) if block is not None and not own else ()
    at_t = ANSWERS_HEADER.size + RESPONSE_ENTRY.size * n_resp
    responses = []
    unpack = TENSOR_ENTRY.unpack_from
    for i in range(n_resp):
        (
            request_id,
            model_version,
            n_out,
            flags,
            err_code,
            org_len,
            _p,
            err_off,
            err_len,
            par_off,
            par_len,
            org_off,
            _p2,
        ) = RESPONSE_ENTRY.unpack_from(buf, ANSWERS_HEADER.size + 48 * i)
        outputs = []
        for _ in range(n_out):
            e = unpack(buf, at_t)
            at_t += 104
            seg = bytes(buf[e[7] : e[7] + e[8]]).decode() if e[8] else block_seg
            outputs.append(
                TensorRef(
                    bytes(buf[e[3] : e[3] + e[4]]).decode(),
                    _WIRE[e[5]],
                    e[10 : 10 + e[6]],
                    seg,
                    e[0],
                    e[1],
                    e[2],
                )
            )
        error = None
        if flags & ERROR:
            error = ErrorInfo(
                ErrorCode(err_code),
                bytes(buf[err_off : err_off + err_len]).decode(),
                bytes(buf[org_off : org_off + org_len]).decode() if org_len else "",
            )
        names = bool(flags & NAMES_BLOCK)
        responses.append(
            InferResponse(
                request_id=request_id,
                version=model_version,
                outputs=tuple(outputs),
                block=block if own and names else None,
                error=error,
                final=bool(flags & FINAL),
                empty=bool(flags & EMPTY),
                parameters_json=bytes(buf[par_off : par_off + par_len]).decode() if par_len else "",
                shared_blocks=shared if names else (),
            )
        )
    if own:
        return responses[0]
    handoffs = (Handoff(block, uses),) if block is not None else ()
    return AnswerBatch(responses=tuple(responses), handoffs=handoffs)


def record_decoder(decode_msgpack: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A ring record decoder that takes both forms: a binary record (``MARKER`` first) by
    its kind, anything else by ``decode_msgpack`` (a ``codec.Decoder``'s ``decode_buffer``).
    A malformed binary record raises ``msgspec.DecodeError``, as malformed msgpack does."""
    requests = RequestDecoder().decode

    def decode(buf: Any) -> Any:
        if not buf or buf[0] != MARKER:
            return decode_msgpack(buf)
        try:
            kind = buf[1]
            if kind == KIND_REQUEST:
                return requests(buf)
            if kind == KIND_ANSWERS:
                return decode_answer(buf)
            raise ValueError(f"unknown record kind {kind}")
        except (ValueError, IndexError, struct.error, msgspec.MsgspecError) as e:
            raise msgspec.DecodeError(f"malformed binary record: {e}") from e

    return decode
