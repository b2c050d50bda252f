"""BF16 tensors through DLPack, as Triton's python backend hands them to models.

Imported by ``backends.python.pb_utils``. numpy has no bfloat16: triton-mp holds BF16
tensors as ``common.numpy_tensors.BF16_DTYPE`` arrays, and python_backend's ``pb_tensor.cc``
gives a model no numpy form of one either (``as_numpy`` refuses it); the model reaches the
data through ``to_dlpack`` / ``from_dlpack`` (python_backend's ``identity_bf16`` test model:
torch in between). DLPack names the type ``kDLBfloat``, 16 bits, 1 lane
(``pb_stub_utils.cc`` triton_to_dlpack_type / dlpack_to_triton_type), which numpy neither
exports nor imports. So the capsule is numpy's own for the 16-bit words (``kDLUInt``), its
type code rewritten in place to ``kDLBfloat`` on the way out and back to ``kDLUInt`` on the
way in: the data is shared, never copied, and numpy's deleter still frees it.

Layouts (dlpack.h, the unversioned ``DLManagedTensor`` in a capsule named "dltensor"):
``DLTensor`` = data pointer, ``DLDevice`` (int32 type, int32 id), int32 ndim,
``DLDataType`` (uint8 code, uint8 bits, uint16 lanes), int64* shape, int64* strides,
uint64 byte_offset; ``DLManagedTensor`` begins with its ``DLTensor``.
"""

from __future__ import annotations

import ctypes
from typing import Any, cast

import numpy as np

from triton_mp.common.numpy_tensors import BF16_DTYPE

KDL_UINT = 1
"""``DLDataTypeCode.kDLUInt``: numpy's code for the 16-bit words."""
KDL_BFLOAT = 4
"""``DLDataTypeCode.kDLBfloat``: what python_backend exports a BF16 tensor as."""
_CAPSULE_NAME = b"dltensor"


class _DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class _DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class _DLTensor(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    )


_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = (ctypes.py_object, ctypes.c_char_p)
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = (ctypes.py_object, ctypes.c_char_p)


def _dtype_of(capsule: object) -> _DLDataType | None:
    """The ``DLDataType`` inside an unconsumed "dltensor" capsule (writable in place), or
    None for anything else (a consumed or versioned capsule, another object)."""
    if type(capsule).__name__ != "PyCapsule" or not _is_valid(capsule, _CAPSULE_NAME):
        return None
    tensor = _DLTensor.from_address(_get_pointer(capsule, _CAPSULE_NAME))
    dtype: _DLDataType = tensor.dtype
    return dtype


class Capsule:
    """Lends a bare DLPack capsule the ``__dlpack__`` protocol ``np.from_dlpack`` expects
    (``pb_utils.Tensor.from_dlpack`` and the BF16 import here)."""

    def __init__(self, capsule: object) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: object) -> object:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # NOTE: kDLCPU: a bare capsule is taken to be host memory


def export_bf16(arr: np.ndarray) -> object:
    """A "dltensor" capsule of a ``BF16_DTYPE`` array as ``kDLBfloat`` (16 bits, 1 lane),
    sharing its data (a read-only array is copied first: the unversioned capsule cannot
    say read-only).

    Raises:
        BufferError: numpy cannot export the array (e.g. not on the host).
    """
    words = (arr if arr.flags.writeable else arr.copy()).view("<u2")
    capsule = words.__dlpack__()
    dtype = _dtype_of(capsule)
    if dtype is None:
        raise BufferError("numpy gave no DLPack capsule for the BF16 data")
    dtype.code = KDL_BFLOAT
    return capsule


def import_bf16(capsule: object) -> np.ndarray | None:
    """A ``BF16_DTYPE`` array sharing the data of a host "dltensor" capsule of
    ``kDLBfloat`` 16-bit scalars (the capsule is consumed); None, with the capsule left as
    it was, for any other capsule or object.

    Raises:
        BufferError, TypeError, ValueError: numpy refuses the rest of the capsule (a
            device other than the host, strides it cannot view).
    """
    dtype = _dtype_of(capsule)
    if dtype is None or (dtype.code, dtype.bits, dtype.lanes) != (KDL_BFLOAT, 16, 1):
        return None
    dtype.code = KDL_UINT
    try:
        words = np.from_dlpack(cast(Any, Capsule(capsule)))
    except Exception:
        dtype.code = KDL_BFLOAT
        raise
    return words.view(BF16_DTYPE)


def is_bf16(arr: np.ndarray) -> bool:
    """Whether ``arr`` holds a BF16 tensor (``BF16_DTYPE``)."""
    d = arr.dtype
    return d.char == "V" and d == BF16_DTYPE
