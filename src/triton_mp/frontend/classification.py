"""The classification extension: an output asked for with ``classification`` = k comes back
as its top k classes, strings "<value>:<index>[:<label>]", instead of its values.

Imported by ``frontend.dispatch.ticket`` (applied to each successful response, before either
transport encodes it). Upstream server ``classification.cc`` ``TopkClassifications`` and
the gRPC/HTTP response writers that call it:

- a batching model's output is split along its first dimension (each batch entry gets its
  own top k); otherwise the whole tensor is one entry;
- classes are sorted by value, largest first; the value is written as ``std::to_string``
  writes it (``%f`` for FP32/FP64, the integer for integer types), then ``:`` and the class
  index, then ``:`` and the label when ``label_filename`` has one for that index;
- the result is a BYTES tensor of shape ``[batch, min(k, n)]`` (``[min(k, n)]`` without
  batching), ``n`` the elements of one entry;
- other datatypes are refused INVALID_ARG "class result not available for output due to
  unsupported type '<T>'", and more than 1,000,000 elements per entry "classification output
  tensor too large".
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from triton_mp.common.errors import ErrorCode, TritonMPError

if TYPE_CHECKING:
    from triton_mp.frontend.model_table import Model
    from triton_mp.frontend.request import InferenceRequest

MAX_ELEMENTS = 1_000_000
"""``kMaxClassificationElements``: the most elements one batch entry may have."""

_TYPES = {
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP32": np.float32, "FP64": np.float64,
}  # fmt: skip
_U32 = struct.Struct("<I")


def _text(value: float, floating: bool) -> str:
    return f"{float(value):f}" if floating else str(int(value))


def top_k(
    data: bytes | memoryview,
    datatype: str,
    shape: Sequence[int],
    count: int,
    batched: bool,
    labels: Sequence[str] = (),
) -> tuple[bytes, tuple[int, ...]]:
    """One output's classification.

    Args:
        data: the output's raw little-endian bytes; ``datatype``, ``shape``: its own.
        count: the ``classification`` parameter (> 0).
        batched: the model batches (``max_batch_size`` > 0): the first dimension is the batch.
        labels: the output's labels, index -> label ("" or past the end: no label).

    Returns:
        The BYTES tensor's serialized elements (``u32 LE length`` + UTF-8) and its shape.

    Raises:
        TritonMPError: INVALID_ARG, Triton's words (see the module docstring).
    """
    dtype = _TYPES.get(datatype)
    if dtype is None:
        raise TritonMPError(
            f"class result not available for output due to unsupported type '{datatype}'",
            ErrorCode.INVALID_ARG,
        )
    batch = int(shape[0]) if batched and len(shape) > 0 else 0
    per_entry = int(np.prod(shape[1:] if batch else shape, dtype=np.int64))
    if per_entry > MAX_ELEMENTS:
        raise TritonMPError("classification output tensor too large", ErrorCode.INVALID_ARG)
    values = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"))
    floating = datatype.startswith("FP")
    out = bytearray()
    k = min(count, per_entry)
    for entry in range(max(1, batch)):
        probs = values[entry * per_entry : (entry + 1) * per_entry]
        order = np.argsort(-probs.astype(np.float64), kind="stable")[:k]
        for idx in order.tolist():
            text = f"{_text(probs[idx], floating)}:{idx}"
            if idx < len(labels) and labels[idx]:
                text += f":{labels[idx]}"
            encoded = text.encode()
            out += _U32.pack(len(encoded)) + encoded
    return bytes(out), ((batch, k) if batch else (k,))


@dataclass(frozen=True, slots=True)
class Classify:
    """What a request asks to classify: output name -> k, with the model's batching and
    labels (``top_k``'s arguments)."""

    counts: dict[str, int]
    batched: bool
    labels: dict[str, tuple[str, ...]]


def classification(request: InferenceRequest, model: Model) -> Classify | None:
    """The request's ``classification`` outputs (already checked: a positive int64), or
    None when it asks for none."""
    counts = {
        o.name: int(cast(int, o.parameters["classification"].value))
        for o in request.outputs
        if "classification" in o.parameters
    }
    if not counts:
        return None
    return Classify(counts, model.max_batch_size > 0, model.labels)
