"""JSON values of KServe v2 HTTP bodies: parsing, typed fields, tensor ``data`` <-> raw bytes.

Imported by the HTTP adapter (``frontend.http.infer_codec``, ``frontend.http.routes``); no
aiohttp, so every rule is testable on values. ``json_tensor_bytes`` packs a JSON ``data``
array into the raw tensor form the core takes (numpy, row-major; BYTES length-prefixed);
``json_output_data`` unpacks an output for a JSON answer. Messages follow Triton's
``http_server.cc`` (shared/reference/triton.md §2).

A member missing or of the wrong JSON type is INTERNAL (HTTP 500) with TritonJson's words
(``access_error``), as Triton answers it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np

from triton_mp.common.datatypes import ELEMENT_BYTES, DataType, element_count
from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.common.numpy_tensors import NUMPY_DTYPES
from triton_mp.frontend.http.json_errors import rapidjson_decode, rapidjson_error

_U32 = struct.Struct("<I")
UINT64_MAX = 2**64 - 1
INT64_MAX = 2**63 - 1


def decode_json(body: bytes | memoryview) -> Any:
    """Parse a request's JSON.

    Raises:
        TritonMPError: (INTERNAL, HTTP 500) the bytes are not JSON: Triton's "failed to parse
            the request JSON buffer: <RapidJSON's message> at <offset>"
            (``json_errors.rapidjson_error``).
        InvalidRequest: JSON msgspec refuses and RapidJSON would read (msgspec's words).
    """
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        where = rapidjson_error(body)
        if where is not None:
            raise TritonMPError(
                f"failed to parse the request JSON buffer: {where}", ErrorCode.INTERNAL
            ) from None
        try:
            return rapidjson_decode(body)
        except ValueError:
            pass  # NOTE: invalid UTF-8: RapidJSON passes it on, triton-mp refuses it
        raise InvalidRequest(f"failed to parse the request JSON buffer: {e}") from None
    except RecursionError:
        # NOTE: nesting deeper than the interpreter's recursion limit (msgspec recurses).
        raise InvalidRequest("failed to parse the request JSON buffer: nested too deeply") from None


_ACCESS = {
    "array": "attempt to access JSON non-array as array",
    "string": "attempt to access JSON non-string as string",
    "uint": "attempt to access JSON non-unsigned-integer as unsigned-integer",
    "int": "attempt to access JSON non-signed-integer as signed-integer",
    "bool": "attempt to access JSON non-boolean as boolean",
    "double": "attempt to access JSON non-number as double",
    "object": "attempt to get members for non-object",
}
"""TritonJson's words (common ``triton_json.h``) for a value of the wrong JSON type."""


def access_error(context: str, kind: str, key: str = "") -> TritonMPError:
    """Triton's INTERNAL (HTTP 500) error for a JSON member that is missing (``kind`` is
    ``missing``: "attempt to access non-existing object member '<key>'") or of the wrong
    type (``_ACCESS``), after ``context`` ("Unable to parse 'shape'"; "" for none)."""
    why = (
        f"attempt to access non-existing object member '{key}'"
        if kind == "missing"
        else _ACCESS[kind]
    )
    return TritonMPError(f"{context}: {why}" if context else why, ErrorCode.INTERNAL)


def is_uint(v: object) -> bool:
    """Whether ``v`` is a JSON integer in uint64 range (booleans are not)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= UINT64_MAX


def json_uint(obj: dict[str, Any], key: str, context: str | None = None) -> int:
    """``obj[key]`` as an unsigned 64-bit integer.

    Args:
        context: what Triton's message starts with ("Unable to parse '<key>'" unless given;
            "" for TritonJson's words alone, as shared-memory registration answers).

    Raises:
        TritonMPError: INTERNAL with TritonJson's words when missing or not one.
    """
    ctx = f"Unable to parse '{key}'" if context is None else context
    if key not in obj:
        raise access_error(ctx, "missing", key)
    v = obj[key]
    if not is_uint(v):
        raise access_error(ctx, "uint")
    return int(v)


def json_string(obj: dict[str, Any], key: str, context: str | None = None) -> str:
    """``obj[key]`` as a string (``context`` as ``json_uint``'s).

    Raises:
        TritonMPError: INTERNAL with TritonJson's words when missing or not a string.
    """
    ctx = f"Unable to parse '{key}'" if context is None else context
    if key not in obj:
        raise access_error(ctx, "missing", key)
    v = obj[key]
    if not isinstance(v, str):
        raise access_error(ctx, "string")
    return v


_ACCESSOR = {"f": "double", "i": "int", "u": "uint", "b": "bool"}
_TYPES: dict[str, set[type]] = {"f": {int, float}, "i": {int}, "u": {int}, "b": {bool}}
"""What Python types (as msgspec decodes JSON) each kind's TritonJson accessor takes."""
_INT64_MIN = -(2**63)
_DOUBLE_LIMIT = 2**1024

MAX_JSON_DEPTH = 100
"""Deepest nesting of a JSON ``data`` array (server ``common.h``
``HTTP_MAX_JSON_NESTING_DEPTH``, upstream main since 2026; 2.51 has no limit)."""

_TOO_DEEP = f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})"
_DATA_TOO_DEEP = f"Unable to parse 'data': {_TOO_DEEP}"
"""Numbers are read under ``RETURN_MSG_IF_ERR(..., "Unable to parse 'data'")``; BYTES'
``JsonBytesArrayByteSize`` is not."""


def _elements(data: Any, too_deep: str, depth: int = 0) -> Iterator[Any]:
    """The scalars of a nested ``data`` array in row-major order, as http_server.cc's
    ``ReadDataFromJsonHelper`` visits them; a value ``MAX_JSON_DEPTH`` arrays deep is
    refused when reached, with ``too_deep`` (INVALID_ARG)."""
    if depth >= MAX_JSON_DEPTH:
        raise InvalidRequest(too_deep)
    if isinstance(data, list):
        for item in data:
            yield from _elements(item, too_deep, depth + 1)
    else:
        yield data


def _fits(kind: str, x: Any) -> bool:
    """Whether TritonJson's accessor for ``kind`` reads ``x`` (IsBool / IsUint64 / IsInt64 /
    IsNumber; a boolean is none of the numbers)."""
    if type(x) not in _TYPES[kind]:
        return False
    if kind == "u":
        return 0 <= x <= UINT64_MAX  # type: ignore[no-any-return]
    if kind == "i":
        return _INT64_MIN <= x <= INT64_MAX  # type: ignore[no-any-return]
    # NOTE: RapidJSON refuses an integer past the double range when it parses the body;
    # here it is refused as no number.
    return type(x) is not int or abs(x) < _DOUBLE_LIMIT


_SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"
"""2.51's words for more or fewer elements than the shape (upstream main's PR #8676 words
fewer elements "Failed to parse 'data' field: shape does not match true shape")."""


def _check_elements(data: list[Any], kind: str, count: int) -> None:
    """Visit ``data`` in Triton's order and raise its first error: the nesting depth, one
    element past ``count``, an element of the wrong JSON type; then too few elements.

    Raises:
        InvalidRequest: too deep. TritonMPError: INTERNAL otherwise.
    """
    seen = 0
    for x in _elements(data, _DATA_TOO_DEEP):
        if seen >= count:
            raise TritonMPError(_SHAPE_MISMATCH, ErrorCode.INTERNAL)
        if not _fits(kind, x):
            raise access_error("Unable to parse 'data'", _ACCESSOR[kind])
        seen += 1
    if seen != count:
        raise TritonMPError(_SHAPE_MISMATCH, ErrorCode.INTERNAL)


def _bytes_elements(data: list[Any]) -> bytes:
    """A BYTES ``data`` array length-prefixed (``JsonBytesArrayByteSize``' checks first)."""
    parts = []
    for item in _elements(data, _TOO_DEEP):
        if not isinstance(item, str):
            raise access_error("Unable to parse JSON bytes array", "string")
        b = item.encode("utf-8")
        parts.append(_U32.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


_KINDS = {
    t.wire: t.numpy.kind
    for t in DataType
    if t.numpy is not None and t not in (DataType.FP16, DataType.STRING)
}
"""Datatype -> what JSON values it takes (its numpy kind): b booleans, u unsigned, i integers,
f any number. FP16, BF16 and BYTES take no JSON numbers here."""


def json_tensor_bytes(name: str, datatype: str, data: object, count: int) -> bytes:
    """Pack a JSON ``data`` array (flat or nested, row-major) into the raw tensor form.

    Args:
        name: the input's name (for messages).
        datatype: the request's datatype string for the input.
        data: the decoded JSON value of ``data``.
        count: element count of the input's shape (not 0; below 0 where Triton's int64
            count wrapped: no ``data`` matches it).

    Raises:
        InvalidRequest: FP16/BF16 (Triton takes them in binary form only), an unknown
            datatype, nesting ``MAX_JSON_DEPTH`` deep.
        TritonMPError: INTERNAL with http_server.cc's / TritonJson's words: ``data`` not an
            array, an element of the wrong JSON type (BOOL takes booleans, unsigned types
            non-negative integers, signed types integers in int64 range, floating point any
            number but a boolean, BYTES strings), more or fewer elements than the shape.
            Integers out of a narrower type's range wrap, as Triton's casts do.
    """
    if datatype in ("FP16", "BF16"):
        raise InvalidRequest(
            f"receiving {datatype} data via JSON is not supported. Please use the binary "
            f"data format for input {name}"
        )
    if datatype not in NUMPY_DTYPES:
        raise InvalidRequest(f"invalid datatype for input {name}")
    if not isinstance(data, list):
        raise access_error("Unable to parse 'data'", "array")
    if datatype == "BYTES":
        # NOTE: no count check here: core's ValidateBytesInputs says "expected N string
        # elements ..." as for any BYTES input.
        return _bytes_elements(data)
    kind = _KINDS[datatype]
    flat = data
    if any(isinstance(item, list) for item in data):
        flat = list(_elements(data, _DATA_TOO_DEEP))
    arr: np.ndarray[Any, Any] | None = None
    if len(flat) == count and set(map(type, flat)) <= _TYPES[kind]:
        wide = {"b": np.bool_, "u": np.uint64, "i": np.int64, "f": np.float64}[kind]
        try:
            arr = np.array(flat, dtype=wide)
        except OverflowError:
            arr = None  # NOTE: an integer out of int64 / uint64 range: found below
    if arr is None:
        _check_elements(data, kind, count)
        raise AssertionError("unreachable: _check_elements refuses what numpy refused")
    out: bytes = arr.astype(NUMPY_DTYPES[datatype], copy=False).tobytes()
    return out


def json_output_data(ref_name: str, datatype: str, shape: tuple[int, ...], buf: memoryview) -> Any:
    """An output's bytes as the flat JSON ``data`` list Triton writes.

    Raises:
        InvalidRequest: FP16/BF16 (JSON cannot carry them; ask for binary data).
        TritonMPError: INTERNAL when the bytes do not match the shape.
    """
    if datatype in ("FP16", "BF16"):
        raise InvalidRequest(
            f"sending {datatype} data via JSON is not supported. Please use the binary data "
            "format for output"
        )
    count = element_count(shape)
    mismatch = TritonMPError(
        f"output tensor shape does not match size of output for '{ref_name}'",
        ErrorCode.INTERNAL,
    )
    if datatype == "BYTES":
        items = []
        pos = 0
        for _ in range(count):
            if pos + 4 > len(buf):
                raise mismatch
            (n,) = _U32.unpack_from(buf, pos)
            pos += 4
            if pos + n > len(buf):
                raise mismatch
            items.append(bytes(buf[pos : pos + n]).decode("utf-8", errors="replace"))
            pos += n
        return items
    if len(buf) != count * ELEMENT_BYTES[datatype]:
        raise mismatch
    arr = np.frombuffer(buf, dtype=NUMPY_DTYPES[datatype])
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        return _non_finite(arr.tolist())
    return arr.tolist()


def _non_finite(values: list[float]) -> msgspec.Raw:
    """Numbers as TritonJson writes them (``kWriteNanAndInfFlag``): ``NaN``, ``Infinity``,
    ``-Infinity`` for what plain JSON cannot hold (msgspec would write ``null``)."""
    words = {math.inf: b"Infinity", -math.inf: b"-Infinity"}
    parts = [
        b"NaN" if x != x else words.get(x) or msgspec.json.encode(x)  # noqa: PLR0124 - NaN
        for x in values
    ]
    return msgspec.Raw(b"[" + b",".join(parts) + b"]")
