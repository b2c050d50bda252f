"""A tensor as a TENSORS-level trace writes it (``ipc.protocol.messages.TensorTrace``).

Imported by the frontend (``TENSOR_QUEUE_INPUT``, from the request's bytes) and the workers
(``TENSOR_BACKEND_INPUT`` / ``TENSOR_BACKEND_OUTPUT``, from the backend's arrays), only when
a request is traced at the TENSORS level; never by the scheduler (it loads numpy). The text
form is that of Triton's ``TraceManager::TraceTensorActivity``: the elements comma-separated
(BOOL as 0/1, BYTES elements quoted, FP16/BF16 left empty), the shape comma-separated.
"""

from __future__ import annotations

import numpy as np

from triton_mp.common.numpy_tensors import NUMPY_DTYPES, deserialize_bytes_tensor, protocol_of
from triton_mp.ipc.protocol.messages import TensorTrace


def _elements(datatype: str, arr: np.ndarray) -> str:
    if datatype in ("FP16", "BF16"):
        return ""
    flat = arr.reshape(-1)
    if datatype == "BYTES":
        return ",".join(
            '"' + (v.decode(errors="replace") if isinstance(v, bytes) else str(v)) + '"'
            for v in flat.tolist()
        )
    if datatype == "BOOL":
        return ",".join("1" if v else "0" for v in flat.tolist())
    return ",".join(str(v) for v in flat.tolist())


def trace_array(activity: str, name: str, arr: np.ndarray) -> TensorTrace:
    """A backend's input or output array as a trace entry."""
    text = arr.dtype == np.object_ or arr.dtype.kind in "SU"
    datatype = "BYTES" if text else protocol_of(arr.dtype)
    return TensorTrace(
        activity, name, _elements(datatype, arr), ",".join(str(d) for d in arr.shape), datatype
    )


def trace_bytes(
    activity: str, name: str, datatype: str, shape: tuple[int, ...], data: bytes | memoryview
) -> TensorTrace:
    """A tensor in its wire bytes (a request's input as the frontend holds it)."""
    if datatype == "BYTES":
        arr = deserialize_bytes_tensor(data, shape)
    elif datatype in NUMPY_DTYPES:
        arr = np.frombuffer(data, dtype=NUMPY_DTYPES[datatype]).reshape(shape)
    else:
        arr = np.zeros(0)
    return TensorTrace(
        activity, name, _elements(datatype, arr), ",".join(str(d) for d in shape), datatype
    )
