"""Triton datatypes as numpy: dtypes, BF16's stand-in, BYTES tensors as arrays.

The numpy side of ``common.datatypes`` (which stays free of numpy, for the supervisor and
the scheduler): imported by the frontend (request validation, JSON tensors, traces) and
the workers (views over arenas). The dtypes themselves are
``common.datatypes.storage_dtypes``'s (``DataType.numpy``, ``DataType.storage``).

BF16 has no numpy type; its tensors are held as ``BF16_DTYPE`` arrays (each element's 16
bits, untouched), which the python backend hands models as Triton does: no numpy form,
DLPack only (``backends.python.dlpack``). BYTES tensors are object arrays of ``bytes``,
serialised as Triton's wire form (``common.datatypes``).
"""

from __future__ import annotations

import struct

import numpy as np

from triton_mp.common.datatypes import DataType, element_count, storage_dtypes

BF16_DTYPE = storage_dtypes()[DataType.BF16]
"""BF16 tensors in numpy, which has no bfloat16: one 16-bit field per element holding the
value's bits as sent (little-endian), never converted. Arrays of it are copied, sliced and
written as any other; ``protocol_of`` names it "BF16"."""

NUMPY_DTYPES: dict[str, np.dtype] = {
    t.wire: d for t, d in storage_dtypes().items() if t is not DataType.BF16
}
"""Protocol datatype string -> numpy dtype (BF16 has none)."""

_BY_KIND = {(v.kind, v.itemsize): k for k, v in NUMPY_DTYPES.items() if k not in ("BYTES",)}
_U32 = struct.Struct("<I")


def protocol_of(dtype: np.dtype) -> str:
    """The protocol datatype string of a numpy dtype.

    Raises:
        ValueError: numpy dtype with no Triton datatype (complex, datetime, ...).
    """
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    if dtype == BF16_DTYPE:
        return "BF16"
    try:
        return _BY_KIND[(dtype.kind, dtype.itemsize)]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no Triton datatype") from None


def serialize_bytes_tensor(arr: np.ndarray) -> bytes:
    """Serialise a BYTES tensor (object/bytes/str array) to Triton's length-prefixed form."""
    parts = []
    for item in arr.reshape(-1):
        b = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(_U32.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def tensor_wire_bytes(arr: np.ndarray) -> tuple[str, memoryview]:
    """An array's protocol datatype and its bytes as sent: BYTES tensors length-prefixed
    (a new buffer), others a view of the C-contiguous data (a copy only when ``arr`` is not
    contiguous).

    Raises:
        ValueError: a dtype with no Triton datatype (``protocol_of``).
    """
    datatype = protocol_of(arr.dtype)
    if datatype == "BYTES":
        return datatype, memoryview(serialize_bytes_tensor(arr))
    arr = np.ascontiguousarray(arr)
    return datatype, arr.reshape(-1).view(np.uint8).data if arr.nbytes else memoryview(b"")


def deserialize_bytes_tensor(buf: memoryview | bytes, shape: tuple[int, ...]) -> np.ndarray:
    """A numpy object array of ``bytes`` from Triton's serialised BYTES form.

    Raises:
        ValueError: the buffer does not hold exactly ``prod(shape)`` elements.
    """
    count = element_count(shape)
    out = np.empty(count, dtype=np.object_)
    pos = 0
    mv = memoryview(buf)
    for i in range(count):
        if pos + 4 > len(mv):
            raise ValueError(f"BYTES tensor holds fewer than {count} elements")
        (length,) = _U32.unpack_from(mv, pos)
        pos += 4
        out[i] = bytes(mv[pos : pos + length])
        pos += length
    if pos != len(mv):
        raise ValueError(f"BYTES tensor holds more than {count} elements")
    return out.reshape(shape)
