"""Triton datatypes and numpy: dtype mapping, byte sizes, BYTES tensor (de)serialisation.

Imported by the frontend (request validation, typed contents) and the workers (views over
arenas). No gRPC, no shared memory here.

BYTES tensors travel serialised as Triton does on the wire: for each element, a
little-endian ``u32`` length followed by that many bytes, elements in row-major order.
BF16 has no numpy type; its tensors are held as ``BF16_DTYPE`` arrays (each element's 16
bits, untouched), which the python backend hands models as Triton does: no numpy form,
DLPack only (``backends.python.dlpack``).
"""

from __future__ import annotations

import struct
from enum import IntEnum

import numpy as np


class DataType(IntEnum):
    """One Triton datatype: its config enum number, wire name, numpy dtype and item size.

    The values are ModelConfig's ``DataType`` numbers (model_config.proto: ``TYPE_BOOL`` = 1
    ... ``TYPE_BF16`` = 14), which are also ``TRITONSERVER_DataType``'s. ``wire`` is the
    KServe v2 protocol string (``TYPE_STRING`` travels as ``"BYTES"``).
    """

    INVALID = 0
    BOOL = 1
    UINT8 = 2
    UINT16 = 3
    UINT32 = 4
    UINT64 = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FP16 = 10
    FP32 = 11
    FP64 = 12
    STRING = 13
    BF16 = 14

    @property
    def wire(self) -> str:
        """The protocol datatype string: ``"FP32"``, ``"BYTES"`` for STRING, ``"INVALID"``."""
        return "BYTES" if self is DataType.STRING else self.name

    @property
    def config_name(self) -> str:
        """The config.pbtxt enum name: ``"TYPE_FP32"``, ``"TYPE_STRING"``."""
        return f"TYPE_{self.name}"

    @property
    def numpy(self) -> np.dtype | None:
        """The little-endian numpy dtype; ``object`` for STRING; None for BF16 and INVALID."""
        return _NUMPY_OF.get(self)

    @property
    def storage(self) -> np.dtype | None:
        """The dtype triton-mp holds tensors of this type in: ``numpy``, and for BF16
        ``BF16_DTYPE``; None for INVALID."""
        return BF16_DTYPE if self is DataType.BF16 else _NUMPY_OF.get(self)

    @property
    def item_size(self) -> int | None:
        """Bytes per element of a fixed-size type; None for STRING (variable) and INVALID."""
        return _ITEM_SIZE.get(self)

    @classmethod
    def from_wire(cls, name: str) -> DataType:
        """The type of a protocol string (exact, upper case); INVALID when unknown."""
        return _BY_WIRE.get(name, cls.INVALID)

    @classmethod
    def from_config_name(cls, name: str) -> DataType:
        """The type of a config enum name (``"TYPE_FP32"``); INVALID when unknown."""
        return _BY_CONFIG_NAME.get(name, cls.INVALID)


BF16_DTYPE = np.dtype([("bfloat16", "<u2")])
"""BF16 tensors in numpy, which has no bfloat16: one 16-bit field per element holding the
value's bits as sent (little-endian), never converted. Arrays of it are copied, sliced and
written as any other; ``protocol_of`` names it "BF16"."""

_NUMPY_OF: dict[DataType, np.dtype] = {
    DataType.BOOL: np.dtype(np.bool_),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.UINT16: np.dtype("<u2"),
    DataType.UINT32: np.dtype("<u4"),
    DataType.UINT64: np.dtype("<u8"),
    DataType.INT8: np.dtype(np.int8),
    DataType.INT16: np.dtype("<i2"),
    DataType.INT32: np.dtype("<i4"),
    DataType.INT64: np.dtype("<i8"),
    DataType.FP16: np.dtype("<f2"),
    DataType.FP32: np.dtype("<f4"),
    DataType.FP64: np.dtype("<f8"),
    DataType.STRING: np.dtype(np.object_),
}
_ITEM_SIZE: dict[DataType, int] = {
    t: d.itemsize for t, d in _NUMPY_OF.items() if t is not DataType.STRING
}
_ITEM_SIZE[DataType.BF16] = 2
_BY_WIRE: dict[str, DataType] = {t.wire: t for t in DataType if t is not DataType.INVALID}
_BY_CONFIG_NAME: dict[str, DataType] = {t.config_name: t for t in DataType}

NUMPY_DTYPES: dict[str, np.dtype] = {t.wire: d for t, d in _NUMPY_OF.items()}
"""Protocol datatype string -> numpy dtype (BF16 has none)."""

ELEMENT_BYTES: dict[str, int] = {t.wire: n for t, n in _ITEM_SIZE.items()}
"""Bytes per element of fixed-size datatypes (BYTES is variable)."""

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


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    """Number of elements of a shape (1 for a scalar shape ``()``)."""
    n = 1
    for d in shape:
        n *= d
    return n


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


def bytes_tensor_elements(buf: memoryview | bytes) -> int | None:
    """How many elements a serialised BYTES buffer holds; None when it is malformed."""
    n = 0
    pos = 0
    end = len(buf)
    while pos < end:
        if pos + 4 > end:
            return None
        (length,) = _U32.unpack_from(buf, pos)
        pos += 4 + length
        if pos > end:
            return None
        n += 1
    return n


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
