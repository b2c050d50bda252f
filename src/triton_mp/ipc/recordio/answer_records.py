"""ANSWERS records (``ipc.recordio.records``, kind 2): a worker writes one per batch for each
frontend (its requests' answers) and one per response of a decoupled model; the frontend reads it.

Imported by ``ipc.recordio.records``, which re-exports what the roles use.

Workers send msgpack ``AnswerBatch`` / ``InferResponse`` instead (91adbad): both ends are
Python, and there the record costs 4.5-4.7x msgpack's encode + decode of the same answers (2 to
8 responses per batch, ``bench/answer_codec_cost.py``, 2026-12-06). Frontends still read both
forms (``codec.Decoder``); the record is for a native writer or reader.
"""

from __future__ import annotations

import struct
from typing import Any

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BlockRef,
    ErrorInfo,
    Handoff,
    InferResponse,
    TensorRef,
)
from triton_mp.ipc.recordio.record_layout import (
    ANSWERS_HEADER,
    CODE,
    EMPTY,
    ERROR,
    FINAL,
    KIND_ANSWERS,
    MARKER,
    MAX_DIMS,
    NAMES_BLOCK,
    NO_DIMS,
    RESPONSE_ENTRY,
    TENSOR_ENTRY,
    VERSION,
    WIRE,
    Strings,
)


def encode_answer(msg: Any) -> bytes | None:
    """An ``AnswerBatch``, or an ``InferResponse`` owning at most its one block, as an
    ANSWERS record; None for anything it cannot say (trace records, extra or shared blocks
    of ensembles, more than ``MAX_DIMS`` dims, a string too long for its length field):
    send msgpack then."""
    said = _sayable(msg)
    if said is None:
        return None
    responses, block, uses = said
    n_tensors = sum(len(r.outputs) for r in responses)
    strings = Strings(ANSWERS_HEADER.size + RESPONSE_ENTRY.size * len(responses) + 104 * n_tensors)
    block_seg = block.segment if block is not None else ""
    seg_off, seg_len = strings.add(block_seg) if block_seg else (0, 0)
    parts: list[bytes] = []
    tensors: list[bytes] = []
    try:
        for r in responses:
            names = block is not None and (r.block is not None or bool(r.shared_blocks))
            parts.append(_response_entry(r, names, strings))
            for t in r.outputs:
                entry = _tensor_entry(t, block_seg, strings)
                if entry is None:
                    return None
                tensors.append(entry)
        head = ANSWERS_HEADER.pack(
            MARKER, KIND_ANSWERS, VERSION, strings.pos, block.offset if block else 0, uses,
            len(responses), seg_len, seg_off, n_tensors, 0, 0, block.generation if block else 0, 0,
        )  # fmt: skip
    except struct.error:
        return None  # NOTE: a string past its length field, e.g. a 64 KiB error origin
    return b"".join((head, *parts, *tensors, *strings.parts))


def _sayable(msg: Any) -> tuple[tuple[InferResponse, ...], BlockRef | None, int] | None:
    """(responses, the one block, its uses) when an ANSWERS record can say ``msg``."""
    if isinstance(msg, InferResponse):
        if msg.trace is not None or msg.extra_blocks or msg.shared_blocks or msg.handoffs:
            return None
        return (msg,), msg.block, int(msg.block is not None)
    if not isinstance(msg, AnswerBatch) or len(msg.handoffs) > 1:
        return None
    block = msg.handoffs[0].block if msg.handoffs else None
    for r in msg.responses:
        if r.trace is not None or r.extra_blocks or r.block is not None or r.handoffs:
            return None
        if r.shared_blocks and r.shared_blocks != (block,):
            return None
    return msg.responses, block, msg.handoffs[0].uses if msg.handoffs else 0


def _response_entry(r: InferResponse, names_block: bool, strings: Strings) -> bytes:
    """One RESPONSE_ENTRY (its strings added to ``strings``)."""
    flags = (FINAL if r.final else 0) | (EMPTY if r.empty else 0)
    if names_block:
        flags |= NAMES_BLOCK
    code = err_off = err_len = org_off = org_len = 0
    if r.error is not None:
        flags |= ERROR
        code = int(r.error.code)
        err_off, err_len = strings.add(r.error.message)
        if r.error.origin:
            org_off, org_len = strings.add(r.error.origin)
    par_off, par_len = strings.add(r.parameters_json) if r.parameters_json else (0, 0)
    return RESPONSE_ENTRY.pack(
        r.request_id, r.version, len(r.outputs), flags, code, org_len, 0, err_off, err_len,
        par_off, par_len, org_off, 0,
    )  # fmt: skip


def _tensor_entry(t: TensorRef, block_seg: str, strings: Strings) -> bytes | None:
    """One output's TENSOR_ENTRY (segment empty: the block's); None when it cannot be said."""
    code = CODE.get(t.datatype)
    if code is None or len(t.shape) > MAX_DIMS:
        return None
    name_off, name_len = strings.add(t.name)
    if t.segment == block_seg and not t.region_id:
        seg_off = seg_len = 0
    else:
        seg_off, seg_len = strings.add(t.segment)
    return TENSOR_ENTRY.pack(
        t.offset, t.nbytes, t.region_id, name_off, name_len, code, len(t.shape), seg_off,
        seg_len, 0, *(t.shape + NO_DIMS[len(t.shape) :]),
    )  # fmt: skip


def decode_answer(buf: Any) -> InferResponse | AnswerBatch:
    """One ANSWERS record: an ``InferResponse`` (owning the block, if any) when it holds
    one response, else an ``AnswerBatch``.

    Raises:
        ValueError: not a version-2 ANSWERS record.
    """
    data = bytes(buf)
    head = ANSWERS_HEADER.unpack_from(data, 0)
    marker, kind, version, _size, block_offset, uses, n_resp, seg_len, seg_off = head[:9]
    if marker != MARKER or kind != KIND_ANSWERS or version != VERSION:
        raise ValueError(f"not a version-{VERSION} answers record")
    block_seg = data[seg_off : seg_off + seg_len].decode()
    block = BlockRef(block_seg, block_offset, head[12]) if seg_len else None
    own = n_resp == 1 and uses <= 1
    shared = (block,) if block is not None and not own else ()
    at = ANSWERS_HEADER.size + RESPONSE_ENTRY.size * n_resp
    responses = []
    for i in range(n_resp):
        e = RESPONSE_ENTRY.unpack_from(data, ANSWERS_HEADER.size + RESPONSE_ENTRY.size * i)
        outputs = []
        for _ in range(e[2]):
            outputs.append(_output(data, at, block_seg))
            at += TENSOR_ENTRY.size
        flags = e[3]
        names = flags & NAMES_BLOCK
        responses.append(
            InferResponse(
                request_id=e[0],
                version=e[1],
                outputs=tuple(outputs),
                block=block if own and names else None,
                error=_error(data, e) if flags & ERROR else None,
                final=bool(flags & FINAL),
                empty=bool(flags & EMPTY),
                parameters_json=data[e[9] : e[9] + e[10]].decode(),
                shared_blocks=shared if names else (),
            )
        )
    if own:
        return responses[0]
    handoffs = (Handoff(block, uses),) if block is not None else ()
    return AnswerBatch(responses=tuple(responses), handoffs=handoffs)


def _output(data: bytes, at: int, block_seg: str) -> TensorRef:
    """The TENSOR_ENTRY at ``at`` as a ``TensorRef``."""
    e = TENSOR_ENTRY.unpack_from(data, at)
    seg = data[e[7] : e[7] + e[8]].decode() if e[8] else block_seg
    name = data[e[3] : e[3] + e[4]].decode()
    return TensorRef(name, WIRE[e[5]], e[10 : 10 + e[6]], seg, e[0], e[1], e[2])


def _error(data: bytes, e: tuple[Any, ...]) -> ErrorInfo:
    """A RESPONSE_ENTRY's error (``e``: the entry's unpacked fields)."""
    origin = data[e[11] : e[11] + e[5]].decode()
    return ErrorInfo(ErrorCode(e[4]), data[e[7] : e[7] + e[8]].decode(), origin)
