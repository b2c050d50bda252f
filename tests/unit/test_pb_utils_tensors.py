"""``pb_utils.Tensor`` as user models use it: numpy and DLPack forms, BF16 through DLPack only
(no processes, no server)."""

from __future__ import annotations

import numpy as np
import pytest

from triton_mp.backends.python import pb_utils
from triton_mp.backends.python.dlpack import import_bf16
from triton_mp.common.numpy_tensors import BF16_DTYPE


def test_tensor_basics() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb_utils.Tensor("OUT", arr)
    assert t.name() == "OUT"
    assert t.as_numpy() is arr, "no copy"
    assert t.shape() == [2, 3]
    assert t.triton_dtype() == pb_utils.TRITONSERVER_TYPE_FP32
    assert t.is_cpu()
    with pytest.raises(pb_utils.TritonModelException, match="numpy array"):
        pb_utils.Tensor("X", [1, 2, 3])  # type: ignore[arg-type]


def test_tensor_dlpack_round_trip_shares_memory() -> None:
    arr = np.arange(8, dtype=np.int64)
    t = pb_utils.Tensor("A", arr)
    back = pb_utils.Tensor.from_dlpack("B", t.to_dlpack())
    assert back.name() == "B"
    np.testing.assert_array_equal(back.as_numpy(), arr)
    assert np.shares_memory(back.as_numpy(), arr)
    # an object with __dlpack__ (our Tensor itself, or a numpy array) works too
    np.testing.assert_array_equal(np.from_dlpack(t), arr)
    np.testing.assert_array_equal(pb_utils.Tensor.from_dlpack("C", arr).as_numpy(), arr)


BF16_REFUSAL = (
    "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() "
    "instead."
)
"""python_backend pb_tensor.cc AsNumpy."""


def _bf16(words: list[int]) -> np.ndarray:
    return np.array(words, "<u2").view(BF16_DTYPE)


def test_a_bf16_tensor_has_no_numpy_form_and_round_trips_through_dlpack() -> None:
    arr = _bf16([0x3F80, 0xC000, 0x7FC0])
    t = pb_utils.Tensor("A", arr)
    assert t.triton_dtype() == pb_utils.TRITONSERVER_TYPE_BF16
    assert t.shape() == [3]
    with pytest.raises(pb_utils.TritonModelException) as e:
        t.as_numpy()
    assert str(e.value) == BF16_REFUSAL
    back = pb_utils.Tensor.from_dlpack("B", t.to_dlpack())
    assert back.triton_dtype() == pb_utils.TRITONSERVER_TYPE_BF16
    assert pb_utils._tensor_data(back).tobytes() == arr.tobytes()  # noqa: SLF001
    assert np.shares_memory(pb_utils._tensor_data(back), arr)  # noqa: SLF001
    # Our Tensor as a producer, and a read-only array (copied: legacy DLPack has no flag).
    assert pb_utils._tensor_data(pb_utils.Tensor.from_dlpack("C", t)).tobytes() == arr.tobytes()  # noqa: SLF001
    frozen = arr.copy()
    frozen.flags.writeable = False
    again = pb_utils.Tensor.from_dlpack("D", pb_utils.Tensor("F", frozen).to_dlpack())
    assert pb_utils._tensor_data(again).tobytes() == arr.tobytes()  # noqa: SLF001


def test_a_bf16_capsule_is_kdlbfloat_as_torch_reads_it() -> None:
    torch = pytest.importorskip("torch")
    t = pb_utils.Tensor("A", _bf16([0x3F80, 0xC000]))
    as_torch = torch.utils.dlpack.from_dlpack(t.to_dlpack())
    assert as_torch.dtype == torch.bfloat16
    assert as_torch.tolist() == [1.0, -2.0]
    doubled = as_torch * 2
    for source in (torch.utils.dlpack.to_dlpack(doubled), doubled):
        out = pb_utils.Tensor.from_dlpack("B", source)
        assert out.triton_dtype() == pb_utils.TRITONSERVER_TYPE_BF16
        assert pb_utils._tensor_data(out).view("<u2").tolist() == [0x4000, 0xC080]  # noqa: SLF001


def test_capsules_of_other_types_are_left_to_numpy() -> None:
    assert import_bf16(np.arange(3, dtype=np.uint16).__dlpack__()) is None
    assert import_bf16("not a capsule") is None
    words = np.arange(3, dtype=np.uint16)
    back = pb_utils.Tensor.from_dlpack("U", words.__dlpack__())
    assert back.triton_dtype() == pb_utils.TRITONSERVER_TYPE_UINT16


def test_bytes_tensor_has_no_dlpack_form() -> None:
    t = pb_utils.Tensor("S", np.array([b"a"], dtype=np.object_))
    assert t.triton_dtype() == pb_utils.TRITONSERVER_TYPE_BYTES
    with pytest.raises(pb_utils.TritonModelException):
        t.to_dlpack()
