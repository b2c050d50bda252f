"""Triton datatypes: config enum numbers, wire names, byte sizes, BYTES buffer counting.

Imported by every role: the supervisor's config checks, the frontend (request validation,
typed contents) and the workers. No numpy here (the supervisor and the scheduler never load
it; ~0.1-0.16 s of a process's start): numpy's side, the dtypes, BF16's stand-in and BYTES
tensors as arrays, is ``common.numpy_tensors``; ``DataType.numpy`` and ``DataType.storage``
import numpy on their first call (``storage_dtypes``). No gRPC, no shared memory here.

BYTES tensors travel serialised as Triton does on the wire: for each element, a
little-endian ``u32`` length followed by that many bytes, elements in row-major order.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
        """The little-endian numpy dtype; ``object`` for STRING; None for BF16 and INVALID
        (imports numpy on the first call: ``storage_dtypes``)."""
        return None if self is DataType.BF16 else storage_dtypes().get(self)

    @property
    def storage(self) -> np.dtype | None:
        """The dtype triton-mp holds tensors of this type in: ``numpy``, and for BF16
        ``common.numpy_tensors.BF16_DTYPE``; None for INVALID (``storage_dtypes``)."""
        return storage_dtypes().get(self)

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


_ITEM_SIZE: dict[DataType, int] = {
    DataType.BOOL: 1,
    DataType.UINT8: 1,
    DataType.UINT16: 2,
    DataType.UINT32: 4,
    DataType.UINT64: 8,
    DataType.INT8: 1,
    DataType.INT16: 2,
    DataType.INT32: 4,
    DataType.INT64: 8,
    DataType.FP16: 2,
    DataType.FP32: 4,
    DataType.FP64: 8,
    DataType.BF16: 2,
}
"""Bytes per element of the fixed-size types (numpy's item sizes: tests/unit/test_datatypes.py)."""
_NUMPY_CODES: dict[DataType, str] = {
    DataType.BOOL: "?",
    DataType.UINT8: "u1",
    DataType.UINT16: "<u2",
    DataType.UINT32: "<u4",
    DataType.UINT64: "<u8",
    DataType.INT8: "i1",
    DataType.INT16: "<i2",
    DataType.INT32: "<i4",
    DataType.INT64: "<i8",
    DataType.FP16: "<f2",
    DataType.FP32: "<f4",
    DataType.FP64: "<f8",
    DataType.STRING: "O",
}
"""numpy's dtype strings of the types with a numpy type (little-endian)."""
_BY_WIRE: dict[str, DataType] = {t.wire: t for t in DataType if t is not DataType.INVALID}
_BY_CONFIG_NAME: dict[str, DataType] = {t.config_name: t for t in DataType}

ELEMENT_BYTES: dict[str, int] = {t.wire: n for t, n in _ITEM_SIZE.items()}
"""Bytes per element of fixed-size datatypes (BYTES is variable)."""

_U32 = struct.Struct("<I")


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    """Number of elements of a shape (1 for a scalar shape ``()``)."""
    n = 1
    for d in shape:
        n *= d
    return n


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


@cache
def storage_dtypes() -> dict[DataType, np.dtype]:
    """Every type's storage dtype (``DataType.storage``): its numpy dtype, and BF16's
    stand-in (one little-endian 16-bit field per element, ``common.numpy_tensors.BF16_DTYPE``).
    Built once, on the first call: numpy is imported here, never with this module."""
    import numpy as np  # noqa: PLC0415 - see the module docstring

    out = {t: np.dtype(code) for t, code in _NUMPY_CODES.items()}
    out[DataType.BF16] = np.dtype([("bfloat16", "<u2")])
    return out
