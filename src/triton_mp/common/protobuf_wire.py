"""Protocol Buffers' wire format, read without a schema: the fields of one message.

Imported by ``cli.assets`` (an ONNX file's ``metadata_props``) and
``backends.onnxruntime.autocomplete`` (an ONNX graph's inputs and outputs), which read a few
fields of ONNX's ``ModelProto`` by their numbers (``onnx/onnx.proto3``, stable since ONNX
1.0) instead of importing ``onnx``: its import is ~0.1 s of the supervisor's start (and
numpy's with it), and ``onnx.load`` parses every weight of the graph, where this reads
only what it is asked for and skips the rest by its length (an ``mmap``-ed file's
skipped pages are never read).

Wire types (protobuf encoding spec): 0 varint, 1 fixed 64-bit, 2 length-delimited (bytes,
strings, sub-messages, packed repeated), 5 fixed 32-bit; groups (3, 4) are refused.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT = 0
FIXED64 = 1
LENGTH_DELIMITED = 2
FIXED32 = 5


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The base-128 varint at ``pos`` of ``buf`` (read no further than ``end``) and the
    position after it. Also the Python gRPC frontend's ModelInfer scanner's
    (``frontend.grpc.wire``).

    Raises:
        WireError: the varint runs past ``end`` or over 10 bytes.
    """
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """``(field number, wire type, value)`` of each field of the message ``buf`` holds, in
    order: an ``int`` for varints and fixed-size fields (little-endian, unsigned), a
    ``memoryview`` slice of ``buf`` for length-delimited ones (nothing is copied).

    Raises:
        WireError: a truncated field, a length past the end, a group or an unknown type.
    """
    pos = 0
    end = len(buf)
    while pos < end:
        tag, pos = read_varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        value: int | memoryview
        if wire == VARINT:
            value, pos = read_varint(buf, pos, end)
        elif wire == LENGTH_DELIMITED:
            n, pos = read_varint(buf, pos, end)
            if pos + n > end:
                raise WireError(f"field {number}: {n} bytes past the end of the message")
            value = buf[pos : pos + n]
            pos += n
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
            if pos + size > end:
                raise WireError(f"field {number}: truncated fixed-size value")
            value = int.from_bytes(buf[pos : pos + size], "little")
            pos += size
        else:
            raise WireError(f"field {number}: unsupported wire type {wire}")
        yield number, wire, value


def submessages(buf: memoryview, number: int) -> Iterator[memoryview]:
    """Each length-delimited field ``number`` of the message ``buf`` (a repeated or
    singular sub-message, a string or bytes), in order."""
    for n, wire, value in fields(buf):
        if n == number and wire == LENGTH_DELIMITED:
            assert isinstance(value, memoryview)
            yield value


def string(buf: memoryview, number: int) -> str:
    """The last string field ``number`` of ``buf`` (protobuf's rule for a repeated scalar
    given twice), UTF-8; "" when absent."""
    out = ""
    for value in submessages(buf, number):
        out = bytes(value).decode("utf-8")
    return out


def varint(buf: memoryview, number: int) -> int | None:
    """The last varint field ``number`` of ``buf``; None when absent."""
    out = None
    for n, wire, value in fields(buf):
        if n == number and wire == VARINT:
            assert isinstance(value, int)
            out = value
    return out
