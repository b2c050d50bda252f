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

import struct
from typing import Any

import msgspec
import numpy as np

from triton_mp.common.datatypes import ELEMENT_BYTES, NUMPY_DTYPES, DataType, element_count
from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.http.json_errors import rapidjson_error

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


def json_object(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """``obj[key]`` as a JSON object ({} when missing).

    Raises:
        InvalidRequest: "Unable to parse '<key>'" when it is not an object.
    """
    v = obj.get(key, {})
    if not isinstance(v, dict):
        raise InvalidRequest(f"Unable to parse '{key}': expected a JSON object")
    return v


_ACCESSOR = {"f": "double", "i": "int", "u": "uint", "b": "bool"}


def _flatten(data: list[Any], out: list[Any]) -> None:
    for item in data:
        if isinstance(item, list):
            _flatten(item, out)
        else:
            out.append(item)


_KINDS = {
    t.wire: t.numpy.kind
    for t in DataType
    if t.numpy is not None and t not in (DataType.FP16, DataType.STRING)
}
"""Datatype -> what JSON numbers it takes (its numpy kind): b booleans, u unsigned, i integers,
f any number. FP16, BF16 and BYTES take no JSON numbers here."""

_SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"


def json_tensor_bytes(name: str, datatype: str, data: object, count: int) -> bytes:
    """Pack a JSON ``data`` array (flat or nested, row-major) into the raw tensor form.

    Args:
        name: the input's name (for messages).
        datatype: the request's datatype string for the input.
        data: the decoded JSON value of ``data``.
        count: element count of the input's shape.

    Raises:
        InvalidRequest: FP16/BF16 (Triton takes them in binary form only), an unknown
            datatype, ``data`` that is not an array, elements of the wrong JSON type
            (booleans for BOOL, strings for BYTES, integers for integer types, numbers for
            floating point; no negatives for unsigned types), or an element count that
            differs from the shape's. Integers out of a narrower type's range wrap, as
            Triton's casts do, and a boolean among numbers counts as 0 or 1 (numpy's rule;
            Triton refuses it).
    """
    if datatype in ("FP16", "BF16"):
        raise InvalidRequest(
            f"receiving {datatype} data via JSON is not supported. Please use the binary "
            f"data format for input {name}"
        )
    if datatype not in NUMPY_DTYPES:
        raise InvalidRequest(f"invalid datatype for input {name}")
    if not isinstance(data, list):
        raise InvalidRequest("Unable to parse 'data': expected a JSON array")
    flat = data
    if any(isinstance(item, list) for item in data):
        flat = []
        _flatten(data, flat)
    if datatype == "BYTES":
        # NOTE: no count check here: core's ValidateBytesInputs says "expected N string
        # elements ..." as for any BYTES input.
        parts = []
        for item in flat:
            if not isinstance(item, str):
                raise access_error("Unable to parse JSON bytes array", "string")
            b = item.encode("utf-8")
            parts.append(_U32.pack(len(b)))
            parts.append(b)
        return b"".join(parts)
    if len(flat) != count:
        raise TritonMPError(_SHAPE_MISMATCH, ErrorCode.INTERNAL)
    # NOTE: Triton reads each element with AsDouble / AsInt / AsUInt / AsBool.
    bad = access_error("Unable to parse 'data'", _ACCESSOR[_KINDS[datatype]])
    try:
        arr = np.array(flat)
    except (ValueError, TypeError, OverflowError):
        raise bad from None
    want = _KINDS[datatype]
    kind = arr.dtype.kind
    if want in ("i", "u") and kind in ("f", "O") and all(type(x) is int for x in flat):
        # NOTE: integers numpy could not hold in int64 (it made floats or objects of them).
        try:
            arr = np.array(flat, dtype=np.uint64 if want == "u" else np.int64)
        except OverflowError:
            raise bad from None
        kind = arr.dtype.kind
    if want == "b":
        ok = kind == "b"
    elif want == "f":
        ok = kind in ("i", "u", "f")
    else:
        ok = kind in ("i", "u")
    if not ok or arr.size != count or (want == "u" and arr.size and arr.min() < 0):
        raise bad
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
    return np.frombuffer(buf, dtype=NUMPY_DTYPES[datatype]).tolist()
