"""The REQUEST records (``ipc.recordio.request_records``) of known requests, patched, not encoded.

Imported by ``frontend.inference``. Two requests with the same known key
(``frontend.dispatch.known_requests``), the same input arena segment and the same client id
have REQUEST records that differ only in the request id, the arrival time, the input
block's offset and generation, and each tensor entry's offset. So the record of the first
one, encoded by ``ipc.recordio.request_records.encode_request`` (the format's one encoder), is kept
as the form's template, and each later one is that template with those fields written in.
Encoding a record took ~10 µs per request in the frontend at add_sub_py c=16 (12.9 % of its
event-loop thread); patching one takes ~1.5 µs. ``tests/unit/test_known_records.py`` checks
patched records byte for byte against the encoder's.

A template is kept with its quiet-word bit (``ipc.recordio.quiet_requests.request_bit``):
the bit reads the model name and queue timeout, which patching never writes, so every
record patched from the template has it, and ``HeldWakes.send`` takes it instead of
parsing the record and hashing the name again (~1.4 µs per request at add_sub_py c=16).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from triton_mp.ipc import BlockRef, TensorRef
from triton_mp.ipc.recordio.quiet_requests import request_bit
from triton_mp.ipc.recordio.record_layout import REQUEST_HEADER, TENSOR_ENTRY


def _header_offset(field: int) -> int:
    """Byte offset of ``REQUEST_HEADER``'s field number ``field`` (0-based)."""
    return struct.calcsize(REQUEST_HEADER.format[: field + 1])


_IDS = struct.Struct("<QQ")
"""request_id, arrival_ns: the header's fields 4 and 5 (``records.h`` RequestHeader)."""
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_IDS_AT = _header_offset(4)
_BLOCK_OFFSET_AT = _header_offset(8)
_GENERATION_AT = _header_offset(25)
assert (_IDS_AT, _header_offset(5), _BLOCK_OFFSET_AT, _GENERATION_AT) == (8, 16, 40, 96)
assert TENSOR_ENTRY.format.startswith("<Q")  # NOTE: the entry's offset comes first

Form = tuple[str, str]
"""What a known request's record depends on beyond its key: the input block's segment
name and the client's request id."""

Template = tuple[bytes, int]
"""A form's REQUEST record and its quiet-word bit (``request_bit`` of the record)."""

FORMS_KEPT = 64
"""Templates kept per known request (cleared whole when full: a client that sends a new id
with every request gets no template, and pays the encoder as before)."""


def patch_in_python(
    template: bytes, request_id: int, arrival_ns: int, block: BlockRef, refs: Sequence[TensorRef]
) -> bytes:
    """``template`` (a REQUEST record of the same form) as the record of this request.

    Args:
        request_id: the frontend's id of the request; ``arrival_ns``: its arrival.
        block: its input block (same segment as the template's).
        refs: its inputs, in the template's order (offsets are written for each).
    """
    record = bytearray(template)
    _IDS.pack_into(record, _IDS_AT, request_id, arrival_ns)
    _U64.pack_into(record, _BLOCK_OFFSET_AT, block.offset)
    _U32.pack_into(record, _GENERATION_AT, block.generation)
    at = REQUEST_HEADER.size
    step = TENSOR_ENTRY.size
    for ref in refs:
        _U64.pack_into(record, at, ref.offset)
        at += step
    return bytes(record)


Patch = Callable[[bytes, int, int, BlockRef, Sequence[TensorRef]], bytes]

patched: Patch = patch_in_python
"""How this process patches records: ``patch_in_python``, or its C++ twin where the native
extension is built (``use_patch``; callers read it as ``known_records.patched``)."""


def use_patch(patch: Patch) -> None:
    """Patch records with ``patch`` from now on: ``frontend.main`` hands over the C++ twin
    (``frontend.native.record_patch``: the same bytes, ~0.5-0.8 µs less per request); the
    core imports no adapter."""
    global patched
    patched = patch


def keep(templates: dict[Form, Template], form: Form, record: bytes) -> None:
    """Keep ``record`` (encoded by ``encode_request``) as ``form``'s template, with its bit."""
    if len(templates) >= FORMS_KEPT:
        templates.clear()
    templates[form] = (record, request_bit(record))
