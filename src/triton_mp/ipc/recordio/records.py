"""Fixed-layout binary records on the rings: the request (frontend -> scheduler) and the
answers (worker -> frontend), version 2.

Imported by ``ipc.channel`` (an inbox decodes them beside msgpack messages), the frontend (it
writes requests, reads answers), the scheduler (reads requests) and the workers (write
answers). C twin: ``ipc/records.h`` (packed structs, the same offsets); the native gRPC data
path writes requests and reads answers with it. Change both together and bump ``VERSION``.
Version 2 (2026-12-05) added the block's generation (``BlockRef.generation``, the arena
block header's second field: ``ipc.tensor_pool``) to both headers: the request header grew
from 96 to 104 bytes, the answers header took it from its padding.

Rule 0: a ring record whose first byte is ``MARKER`` (0xC1, a byte msgpack never produces) is
one of these; byte 1 is its kind, bytes 2-3 its version, bytes 4-7 its size. Anything else on
a ring is a msgpack message (``ipc.protocol.messages``). All integers little-endian; every offset is
from the record's first byte; strings are UTF-8 named by ``(offset, length)`` into a string
area after the fixed entries; datatypes are ``TRITONSERVER_DataType`` numbers
(``common.datatypes.DataType``), error codes ``TRITONSERVER_Error_Code`` (``ErrorCode``).

REQUEST (kind 1), written by a frontend (Python here, or native), read by the scheduler::

    header (104)          REQUEST_HEADER, fields in the order of its format:
      0 u8 marker, 1 u8 kind, 2 u16 version, 4 u32 size, 8 u64 request_id,
      16 u64 arrival_ns (CLOCK_MONOTONIC), 24 u64 sequence_id (uint64 correlation id),
      32 i64 model_version, 40 u64 block_offset (the input block), 48 u32 reply_id,
      52 u32 batch_size, 56 u32 timeout_us, 60 u32 priority, 64 u8 reply_kind (Requester),
      65 u8 flags (SEQ_START 1, SEQ_END 2, trace level 0x0C, SEQ_STRING 0x10),
      66 u16 n_inputs, 68 u16 n_outputs, 70 u16 model_len, 72 u32 model_off,
      76 u16 block_seg_len, 78 u16 client_id_len, 80 u32 block_seg_off,
      84 u32 client_id_off, 88 u32 tail_off, 92 u32 tail_len,
      96 u32 block_generation (the input block's ``BlockRef.generation``), 100 u32 pad
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
      (0: no block), 24 u32 block_seg_off, 28 u32 n_tensors, 32 u32 tail_off (0 so far),
      36 u32 tail_len, 40 u32 block_generation (``BlockRef.generation``), 44 u32 pad
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

The scheduler reads a REQUEST record's header only (``RequestRecord``: what batching needs)
and hands the record on verbatim: a batch's ``BatchAssign`` carries each such request as the
record's bytes, which the worker decodes (``decoded_batch``). The layout's constants and
struct formats are in ``ipc.recordio.record_layout``; the writers and readers in
``ipc.recordio.request_records`` and ``ipc.recordio.answer_records``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgspec

from triton_mp.ipc.recordio.answer_records import decode_answer, encode_answer
from triton_mp.ipc.recordio.record_layout import KIND_ANSWERS, KIND_REQUEST, MARKER
from triton_mp.ipc.recordio.request_records import (
    HeaderReader,
    Request,
    RequestDecoder,
    RequestRecord,
    RequestTail,
    as_request,
    decode_request,
    decoded_batch,
    encode_request,
    wire_form,
)

__all__ = [
    "Request",
    "RequestDecoder",
    "RequestRecord",
    "RequestTail",
    "as_request",
    "decode_answer",
    "decode_request",
    "decoded_batch",
    "encode_answer",
    "encode_request",
    "record_decoder",
    "wire_form",
]


def record_decoder(decode_msgpack: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A ring record decoder that takes both forms: a binary record (``MARKER`` first) by
    its kind, anything else by ``decode_msgpack`` (a ``codec.Decoder``'s ``decode_buffer``).
    A REQUEST record becomes a ``RequestRecord`` (or, with rare fields, an ``InferRequest``).
    A malformed binary record raises ``msgspec.DecodeError``, as malformed msgpack does."""
    requests = HeaderReader().read

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
