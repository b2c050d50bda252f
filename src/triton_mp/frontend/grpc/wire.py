"""ModelInfer's tensor bytes on the gRPC wire without protobuf's copies.

protobuf's Python runtime copies a ``bytes`` field when it parses a message and again each
time the field is read; building a response copies each appended ``bytes`` in, and
``SerializeToString`` copies it out once more. For a 1 MiB tensor those copies are most of a
request's CPU in the frontend. The two fields that carry tensor bytes are handled here by
hand, everything else still goes through protobuf:

- ``ModelInferRequest.raw_input_contents`` (field 7): ``split_infer_request`` finds its entries
  in the received message and hands them on as memoryviews into it; protobuf parses the rest.
- ``ModelInferResponse.raw_output_contents`` (field 6): ``infer_response_bytes`` serializes
  the response without it, then appends one length-delimited field 6 per output straight
  from the worker's arena: one copy per output, into the message grpc sends.

Both produce or accept standard protobuf wire format (fields may come in any order; a
repeated field's entries keep their order), so every client sees the same bytes-for-bytes
meaning as from ``SerializeToString``.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any

from google.protobuf.message import DecodeError

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.common.protobuf_wire import read_varint

_RAW_INPUT_FIELD = 7
"""``ModelInferRequest.raw_input_contents`` (grpc_service.proto)."""
_ID_FIELD = 3
"""``ModelInferRequest.id`` (grpc_service.proto)."""
_RAW_OUTPUT_TAG = bytes([(6 << 3) | 2])
"""``ModelInferResponse.raw_output_contents``: field 6, wire type 2 (length-delimited)."""


class Malformed:
    """What a tolerant deserializer gives for bytes that are not the method's message."""

    __slots__ = ()


MALFORMED = Malformed()
"""The one ``Malformed``: a unary handler answers it INTERNAL "Unable to parse request"
(grpc C++'s answer to a request that does not parse), the stream stops reading at it."""

PARSE_FAILURE = "Unable to parse request"
"""grpc C++'s status details (INTERNAL) for a unary request that does not parse."""


def tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    """``deserialize`` returning ``MALFORMED`` instead of raising ``DecodeError`` (grpc.aio
    would answer UNKNOWN "Unexpected <class ...DecodeError>" for the raise)."""

    def parse(data: bytes) -> Any:
        if deserialize is None:
            return data
        try:
            return deserialize(data)
        except DecodeError:
            return MALFORMED

    return parse


class WireInferRequest:
    """A ModelInferRequest parsed without its ``raw_input_contents``.

    Attributes:
        raw: the ``raw_input_contents`` entries in order, as memoryviews into the received
            message (valid as long as this object or the views live).
        key: the message without its ``raw_input_contents`` and ``id`` fields (bytes as
            received, in order): equal for two requests that differ only in their tensor
            bytes and id, so the frontend can recognise a request it validated before
            (``Inference.submit_known``); None when the scanner left the message whole to
            protobuf, or the id is not UTF-8.
        client_id: the ``id`` field (its last entry, as protobuf reads it); "" when absent.
    """

    __slots__ = ("_head", "_request", "client_id", "key", "raw")

    def __init__(
        self,
        request: pb.ModelInferRequest | None,
        raw: list[memoryview],
        *,
        head: bytes = b"",
        key: bytes | None = None,
        client_id: str = "",
    ) -> None:
        self._request = request
        self._head = head
        self.raw = raw
        self.key = key
        self.client_id = client_id

    @property
    def request(self) -> pb.ModelInferRequest:
        """Every field except ``raw_input_contents`` (left empty); parsed on first use when
        the deserializer skipped it (a known ``key``).

        Raises:
            google.protobuf.message.DecodeError: the fields do not parse.
        """
        if self._request is None:
            self._request = pb.ModelInferRequest.FromString(self._head)
        return self._request


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _scan(
    data: bytes, buf: memoryview
) -> tuple[list[memoryview], list[memoryview], list[int], memoryview | None]:
    """One pass over a ModelInferRequest's top-level fields (``split_infer_request``).

    Returns:
        The ``raw_input_contents`` entries; the rest of the message in pieces, in order
        (each ``id`` field a piece of its own); the indexes of those ``id`` pieces; the
        last ``id``'s value.

    Raises:
        ValueError, IndexError: a field this scanner does not understand or that runs
            past the end.
    """
    end = len(buf)
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    ids: list[int] = []
    """Indexes in ``rest`` of the ``id`` fields."""
    id_view: memoryview | None = None
    kept_from = 0
    pos = 0
    while pos < end:
        start = pos
        # NOTE: one-byte varints (nearly every key and size) are read inline.
        key = data[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = read_varint(buf, pos, end)
        wire_type = key & 7
        if wire_type == 2:
            size = data[pos]
            if size < 0x80:
                pos += 1
            else:
                size, pos = read_varint(buf, pos, end)
            field = key >> 3
            if field in (_RAW_INPUT_FIELD, _ID_FIELD):
                if pos + size > end:
                    raise ValueError("truncated field")
                if start > kept_from:
                    rest.append(buf[kept_from:start])
                if field == _RAW_INPUT_FIELD:
                    raw.append(buf[pos : pos + size])
                else:
                    ids.append(len(rest))
                    rest.append(buf[start : pos + size])
                    id_view = buf[pos : pos + size]
                kept_from = pos + size
            pos += size
        elif wire_type == 0:
            _, pos = read_varint(buf, pos, end)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError("group or unknown wire type")
        if pos > end:
            raise ValueError("truncated field")
    if kept_from < end:
        rest.append(buf[kept_from:end])
    return raw, rest, ids, id_view


def split_infer_request(data: bytes, known: Container[object] = ()) -> WireInferRequest:
    """gRPC request deserializer for ModelInfer: raw tensor bytes as views, no copies.

    Args:
        data: one serialized ``inference.ModelInferRequest`` as grpc received it.
        known: keys (``WireInferRequest.key``) whose fields parsed before: for those the
            protobuf parse is left until ``WireInferRequest.request`` is read.

    Returns:
        The parsed request and its ``raw_input_contents`` views. A message this scanner does
        not understand (a group, a truncated field) is left whole to protobuf, which parses
        it or raises as it would have anyway.

    Raises:
        google.protobuf.message.DecodeError: the message is not a valid ModelInferRequest
            (grpc answers the call with an error; the server goes on).
    """
    buf = memoryview(data)
    try:
        raw, rest, ids, id_view = _scan(data, buf)
    except (ValueError, IndexError):  # NOTE: IndexError: a size byte past the end
        return WireInferRequest(pb.ModelInferRequest.FromString(data), [])
    if len(rest) == 1:
        head = data if len(rest[0]) == len(data) else rest[0].tobytes()
    else:
        head = b"".join(rest)
    if id_view is None:
        return _assembled(raw, head, head, None, known)
    key = b"".join(v for i, v in enumerate(rest) if i not in ids)
    return _assembled(raw, head, key, id_view, known)


Split = tuple[bytes, bytes, bytes | None, tuple[tuple[int, int], ...]]
"""A ModelInferRequest split by the native server (``native/request_split.h``, ``_scan``'s
twin): the message without its ``raw_input_contents``, that without its ``id`` fields too,
the last ``id``'s value (None: no id), each ``raw_input_contents`` entry's (offset,
length) in the message."""


def split_native(
    data: bytes, split: Split | None, known: Container[object] = ()
) -> WireInferRequest:
    """``split_infer_request`` from the native server's split of ``data`` (None: it declined,
    or there is none: ``split_infer_request`` scans it here).

    Raises:
        google.protobuf.message.DecodeError: as ``split_infer_request``.
    """
    if split is None:
        return split_infer_request(data, known)
    head, key, id_value, spans = split
    buf = memoryview(data)
    return _assembled([buf[at : at + n] for at, n in spans], head, key, id_value, known)


def _assembled(
    raw: list[memoryview],
    head: bytes,
    key: bytes,
    id_value: bytes | memoryview | None,
    known: Container[object],
) -> WireInferRequest:
    """The request from its scanned pieces: ``key`` is known only with a UTF-8 id."""
    wire_key: bytes | None = key
    client_id = ""
    if id_value is not None:
        try:
            client_id = str(id_value, "utf-8")
        except UnicodeDecodeError:
            wire_key = None  # NOTE: protobuf refuses it below, as it would have anyway
    if wire_key is not None and wire_key in known:
        return WireInferRequest(None, raw, head=head, key=wire_key, client_id=client_id)
    request = pb.ModelInferRequest.FromString(head)
    return WireInferRequest(request, raw, head=head, key=wire_key, client_id=request.id)


def infer_response_bytes(
    response: pb.ModelInferResponse | bytes, raw: Sequence[memoryview | bytes | None]
) -> bytes:
    """A serialized ModelInferResponse whose ``raw_output_contents`` are ``raw``.

    Args:
        response: every field except ``raw_output_contents`` (must be empty), or that
            message already serialized.
        raw: one entry per output in ``response.outputs`` order; None (an output written
            to the client's shared memory) is sent as an empty entry, as Triton does.

    Returns:
        The message, ``response``'s own serialization followed by one field-6 entry per
        output: the only copy of each tensor's bytes.
    """
    return b"".join(infer_response_parts(response, raw))


def infer_response_parts(
    response: pb.ModelInferResponse | bytes, raw: Sequence[memoryview | bytes | None]
) -> list[bytes | memoryview]:
    """``infer_response_bytes`` before the join: the pieces whose concatenation is the
    message (``raw``'s entries among them, uncopied), for a writer that copies each piece
    once into its own buffer (``_native.reply``)."""
    head = response if isinstance(response, bytes) else response.SerializeToString()
    parts: list[bytes | memoryview] = [head]
    for data in raw:
        parts.append(_RAW_OUTPUT_TAG)
        if data is None:
            parts.append(b"\x00")
            continue
        parts.append(_encode_varint(len(data)))
        parts.append(data)
    return parts
