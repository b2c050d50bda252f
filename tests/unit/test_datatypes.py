"""``common.datatypes`` (no numpy) and ``common.numpy_tensors`` (its numpy side) agree."""

from __future__ import annotations

import numpy as np

from triton_mp.common.datatypes import ELEMENT_BYTES, DataType
from triton_mp.common.numpy_tensors import BF16_DTYPE, NUMPY_DTYPES, protocol_of


def test_item_sizes_are_numpys() -> None:
    for t in DataType:
        if t in (DataType.INVALID, DataType.STRING):
            assert t.item_size is None
            continue
        assert t.storage is not None
        assert t.item_size == t.storage.itemsize, t
        assert ELEMENT_BYTES[t.wire] == t.item_size
    assert set(ELEMENT_BYTES) == {t.wire for t in DataType} - {"INVALID", "BYTES"}


def test_numpy_and_storage_dtypes() -> None:
    assert DataType.FP32.numpy == np.dtype("<f4")
    assert DataType.STRING.numpy == np.dtype(object)
    assert DataType.BF16.numpy is None
    assert DataType.BF16.storage == BF16_DTYPE
    assert DataType.INVALID.numpy is None
    assert DataType.INVALID.storage is None
    for wire, dtype in NUMPY_DTYPES.items():
        assert protocol_of(dtype) == wire
    assert protocol_of(BF16_DTYPE) == "BF16"
