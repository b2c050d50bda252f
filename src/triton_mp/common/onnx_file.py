"""An ONNX file's graph signature and metadata, read by field number without ``onnx``.

Imported by ``cli.assets`` (the recogniser's dictionary in ``metadata_props``) and
``backends.onnxruntime.autocomplete`` (the graph's inputs and outputs). Both run in the
supervisor on every start that serves ONNX models or the project's repository, where
``import onnx`` was ~0.1 s (numpy's import with it) and ``onnx.load`` parsed every weight;
here the file is mapped and only the messages asked for are decoded
(``common.protobuf_wire``), the weights skipped by their lengths.

The field numbers are ``onnx/onnx.proto3``'s (ONNX 1.0 on, never renumbered):
``ModelProto`` graph 7, metadata_props 14; ``StringStringEntryProto`` key 1, value 2;
``GraphProto`` initializer 5, input 11, output 12; ``TensorProto`` name 8;
``ValueInfoProto`` name 1, type 2; ``TypeProto`` tensor_type 1 (a oneof);
``TypeProto.Tensor`` elem_type 1, shape 2; ``TensorShapeProto`` dim 1;
``TensorShapeProto.Dimension`` dim_value 1, dim_param 2 (a oneof).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from triton_mp.common.protobuf_wire import WireError, string, submessages, varint

T = TypeVar("T")

MODEL_GRAPH = 7
MODEL_METADATA_PROPS = 14
ENTRY_KEY, ENTRY_VALUE = 1, 2
GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT = 5, 11, 12
TENSOR_NAME = 8
VALUE_INFO_NAME, VALUE_INFO_TYPE = 1, 2
TYPE_TENSOR_TYPE = 1
TENSOR_TYPE_ELEM_TYPE, TENSOR_TYPE_SHAPE = 1, 2
SHAPE_DIM = 1
DIM_VALUE = 1

ELEM_TYPE_NAMES = (
    "UNDEFINED",
    "FLOAT",
    "UINT8",
    "INT8",
    "UINT16",
    "INT16",
    "INT32",
    "INT64",
    "STRING",
    "BOOL",
    "FLOAT16",
    "DOUBLE",
    "UINT32",
    "UINT64",
    "COMPLEX64",
    "COMPLEX128",
    "BFLOAT16",
    "FLOAT8E4M3FN",
    "FLOAT8E4M3FNUZ",
    "FLOAT8E5M2",
    "FLOAT8E5M2FNUZ",
    "UINT4",
    "INT4",
    "FLOAT4E2M1",
    "FLOAT8E8M0",
    "UINT2",
    "INT2",
    "FLOAT6E2M3",
    "FLOAT6E3M2",
)
"""``TensorProto.DataType`` names by number (``onnx.TensorProto.DataType.Name``, ONNX 1.23;
a newer number is worded by its value)."""


class OnnxFileError(ValueError):
    """The file is not a readable ONNX model (not protobuf, truncated, not a file)."""


@dataclass(frozen=True)
class GraphIO:
    """One graph input or output as declared: its element type (``TensorProto.DataType``
    number; None when its type is not a tensor) and dims (None for a dimension with no
    ``dim_value``: symbolic or unknown)."""

    name: str
    elem_type: int | None
    dims: tuple[int | None, ...]


@dataclass(frozen=True)
class GraphSignature:
    """A graph's declared inputs (initializers excluded, as onnxruntime does) and outputs;
    ``has_graph`` False when the model holds no graph (then both are empty)."""

    has_graph: bool
    inputs: tuple[GraphIO, ...]
    outputs: tuple[GraphIO, ...]


def elem_type_name(elem_type: int) -> str:
    """``TensorProto.DataType``'s name of ``elem_type`` (its number when unknown)."""
    if 0 <= elem_type < len(ELEM_TYPE_NAMES):
        return ELEM_TYPE_NAMES[elem_type]
    return str(elem_type)


def _read(path: Path, parse: Callable[[memoryview], T]) -> T:
    """``parse`` over the mapped bytes of ``path`` (an empty file: empty bytes).

    Raises:
        OnnxFileError: the file cannot be opened or ``parse`` finds it malformed.
    """
    try:
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return parse(memoryview(b""))
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                # NOTE: every slice of the map is gone when parse returns or its error's
                # frames are dropped (end of the except below), before the map closes.
                try:
                    return parse(memoryview(mm))
                except (WireError, UnicodeDecodeError) as exc:
                    message = f"{type(exc).__name__}: {exc}"
        raise OnnxFileError(message)
    except OSError as exc:
        raise OnnxFileError(f"{type(exc).__name__}: {exc}") from exc


def _value_info(buf: memoryview) -> GraphIO:
    name = string(buf, VALUE_INFO_NAME)
    elem_type: int | None = None
    dims: list[int | None] = []
    for type_proto in submessages(buf, VALUE_INFO_TYPE):
        elem_type, dims = None, []
        for tensor in submessages(type_proto, TYPE_TENSOR_TYPE):
            elem_type = varint(tensor, TENSOR_TYPE_ELEM_TYPE) or 0
            for shape in submessages(tensor, TENSOR_TYPE_SHAPE):
                dims = [varint(d, DIM_VALUE) for d in submessages(shape, SHAPE_DIM)]
    return GraphIO(name, elem_type, tuple(_signed(d) for d in dims))


def _signed(value: int | None) -> int | None:
    """An int64 varint as its signed value (negatives are 10-byte two's complement)."""
    if value is None or value < 2**63:
        return value
    return value - 2**64


def _signature(buf: memoryview) -> GraphSignature:
    graphs = list(submessages(buf, MODEL_GRAPH))
    if not graphs:
        return GraphSignature(False, (), ())
    graph = graphs[-1]
    initializers = {string(t, TENSOR_NAME) for t in submessages(graph, GRAPH_INITIALIZER)}
    inputs = tuple(
        io
        for io in (_value_info(v) for v in submessages(graph, GRAPH_INPUT))
        if io.name not in initializers
    )
    outputs = tuple(_value_info(v) for v in submessages(graph, GRAPH_OUTPUT))
    return GraphSignature(True, inputs, outputs)


def read_signature(path: Path) -> GraphSignature:
    """The declared inputs and outputs of the ONNX model at ``path``.

    Raises:
        OnnxFileError: not a readable ONNX file.
    """
    return _read(path, _signature)


def _metadata(buf: memoryview) -> dict[str, str]:
    return {
        string(entry, ENTRY_KEY): string(entry, ENTRY_VALUE)
        for entry in submessages(buf, MODEL_METADATA_PROPS)
    }


def read_metadata(path: Path) -> dict[str, str]:
    """The ``metadata_props`` of the ONNX model at ``path`` (key -> value).

    Raises:
        OnnxFileError: not a readable ONNX file.
    """
    return _read(path, _metadata)
