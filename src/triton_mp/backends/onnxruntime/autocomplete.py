"""ONNX auto-complete: inputs, outputs, max_batch_size and dynamic batching from the graph.

Reproduces onnxruntime_backend ``ModelState::AutoCompleteConfig`` (shared/reference/triton.md
§4.3). Run by the model-config loader in the supervisor through the backend registry's hook;
it reads the graph's declared inputs and outputs by field number (``common.onnx_file``),
never with ``onnx`` or onnxruntime.

Differences from Triton, on purpose: it also completes inputs/outputs the config lists
partially and adds those it leaves out (Triton only fills an empty list), and it keeps
max_batch_size 0 when the config's own dims have the graph's full rank. One config per model
here, so the newest loadable version's graph decides (Triton completes per version).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_mp._proto import model_config_pb2
from triton_mp.backends.registry import AutoCompleteOptions
from triton_mp.common.datatypes import DataType
from triton_mp.common.errors import ConfigError
from triton_mp.common.onnx_file import GraphIO, OnnxFileError, elem_type_name, read_signature

log = logging.getLogger(__name__)

__all__ = ["auto_complete"]

ONNX_FILENAME = "model.onnx"
"""The graph file inside a directory ``model.onnx/`` (a large model with external data)."""

_WILDCARD_DIM = -1

# ONNX TensorProto.DataType -> config DataType (onnxruntime_backend
# OnnxDataTypeToModelConfigDataType). Keys are ONNX's stable enum numbers.
_ONNX_TO_CONFIG_DTYPE = {
    1: DataType.FP32,  # FLOAT
    2: DataType.UINT8,
    3: DataType.INT8,
    4: DataType.UINT16,
    5: DataType.INT16,
    6: DataType.INT32,
    7: DataType.INT64,
    8: DataType.STRING,
    9: DataType.BOOL,
    10: DataType.FP16,
    11: DataType.FP64,  # DOUBLE
    12: DataType.UINT32,
    13: DataType.UINT64,
    16: DataType.BF16,
}


@dataclass(frozen=True)
class GraphTensor:
    """One graph input or output as the ORT backend sees it: dims use -1 for unknown."""

    name: str
    data_type: int
    dims: tuple[int, ...]


def auto_complete(
    config: model_config_pb2.ModelConfig, model_file: Path, options: AutoCompleteOptions
) -> None:
    """Complete inputs, outputs, max_batch_size and dynamic batching from the ONNX graph.

    Args:
        config: the model's config, completed in place.
        model_file: ``model.onnx`` (a file, or a directory holding ``model.onnx``).
        options: ``default_max_batch_size`` for a batchable model whose config gives 0.

    Raises:
        ConfigError: the graph cannot be read, the config names a tensor the graph lacks, or
            max_batch_size > 0 for a model whose tensors have no dynamic first dimension.
    """
    name = config.name
    graph_inputs, graph_outputs = read_onnx_signature(model_file, name)
    graph_in = {t.name: t for t in graph_inputs}
    graph_out = {t.name: t for t in graph_outputs}
    _check_listed(name, "input", config.input, graph_in)
    _check_listed(name, "output", config.output, graph_out)
    _complete_batching(config, graph_inputs, graph_outputs, options.default_max_batch_size)

    batching = config.max_batch_size > 0
    # Graph inputs the scheduler feeds (sequence controls, implicit state, batch inputs)
    # are not client inputs, so they are never added to config.input.
    internal = {c.name for c in config.sequence_batching.control_input}
    internal.update(s.input_name for s in config.sequence_batching.state)
    for batch_input in config.batch_input:
        internal.update(batch_input.target_name)
    state_outputs = {s.output_name for s in config.sequence_batching.state}

    _complete_ios(config.input, graph_inputs, internal, batching)
    _complete_ios(config.output, graph_outputs, state_outputs, batching)


def read_onnx_signature(path: Path, model_name: str) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """Read the graph inputs (minus initializers) and outputs of an ONNX file, by field
    number (``common.onnx_file``: no ``onnx`` import, the weights skipped).

    Raises:
        ConfigError: the file cannot be read or a tensor has a type the config cannot express.
    """
    if path.is_dir():  # a directory model.onnx/ holds model.onnx plus external data
        path = path / ONNX_FILENAME
    try:
        signature = read_signature(path)
    except OnnxFileError as exc:
        raise ConfigError(
            f"unable to load model '{model_name}': failed to read ONNX model '{path}' for "
            f"auto-complete: {exc}"
        ) from exc
    if not signature.has_graph:
        raise ConfigError(
            f"unable to load model '{model_name}': ONNX model '{path}' holds no graph"
        )

    def convert(io: GraphIO, io_kind: str) -> GraphTensor:
        where = f"{io_kind} '{io.name}' of model '{model_name}'"
        if io.elem_type is None:
            raise ConfigError(f"autofill failed for model '{model_name}': {where} is not a tensor")
        data_type = _ONNX_TO_CONFIG_DTYPE.get(io.elem_type)
        if data_type is None:
            raise ConfigError(
                f"autofill failed for model '{model_name}': unsupported ONNX data type "
                f"{elem_type_name(io.elem_type)} for {where}"
            )
        dims = tuple(_WILDCARD_DIM if d is None else d for d in io.dims)
        return GraphTensor(io.name, int(data_type), dims)

    inputs = [convert(v, "input") for v in signature.inputs]
    outputs = [convert(v, "output") for v in signature.outputs]
    return inputs, outputs


def _check_listed(name: str, io_kind: str, ios: Any, graph: dict[str, GraphTensor]) -> None:
    """Every named config input (output) must be a graph input (output)."""
    for io in ios:
        if io.name and io.name not in graph:
            allowed = ", ".join(sorted(graph))
            raise ConfigError(
                f"unable to load model '{name}': unexpected inference {io_kind} "
                f"'{io.name}', allowed {io_kind}s are: {allowed}"
            )


def _complete_batching(
    config: model_config_pb2.ModelConfig,
    graph_inputs: list[GraphTensor],
    graph_outputs: list[GraphTensor],
    default_max_batch_size: int,
) -> None:
    """max_batch_size (and an empty dynamic_batching) from whether the graph can batch.

    Raises:
        ConfigError: max_batch_size > 0 for a graph without a dynamic first dimension.
    """
    name = config.name
    graph_in = {t.name: t for t in graph_inputs}
    graph_out = {t.name: t for t in graph_outputs}
    can_batch = all(t.dims and t.dims[0] == _WILDCARD_DIM for t in graph_inputs + graph_outputs)
    full_rank = any(
        _config_rank(io) == len(graph[io.name].dims)
        for ios, graph in ((config.input, graph_in), (config.output, graph_out))
        for io in ios
        if io.name in graph and _config_rank(io) is not None
    )
    if can_batch:
        if config.max_batch_size == 0 and not full_rank:
            config.max_batch_size = max(default_max_batch_size, 0)
            log.warning(
                "autofilled max_batch_size to %d for model '%s' since batching is supported "
                "but no max_batch_size is specified in model configuration. Must specify "
                "max_batch_size to utilize autofill with a larger max batch size",
                config.max_batch_size,
                name,
            )
        if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        raise ConfigError(
            f"autofill failed for model '{name}': model does not support batching while "
            "non-zero max_batch_size is specified"
        )


def _config_rank(io: Any) -> int | None:
    """The rank the backend sees for a config IO (reshape wins over dims); None if unknown."""
    if io.HasField("reshape"):
        return len(io.reshape.shape)
    if io.dims:
        return len(io.dims)
    return None


def _complete_ios(ios: Any, graph: list[GraphTensor], skip: set[str], batching: bool) -> None:
    """Fill missing data_type/dims of listed IOs and append the graph's unlisted ones."""
    listed = {io.name: io for io in ios}
    for tensor in graph:
        io = listed.get(tensor.name)
        if io is None:
            if tensor.name in skip:
                continue
            io = ios.add(name=tensor.name)
        if io.data_type == DataType.INVALID:
            io.data_type = tensor.data_type
        if not io.dims and not io.HasField("reshape"):
            dims = tensor.dims[1:] if batching else tensor.dims
            if dims:
                io.dims.extend(dims)
            else:
                # A scalar (per batch item) is written as dims [1] + empty reshape; the empty
                # reshape is only valid for a batching model.
                io.dims.append(1)
                if batching:
                    io.reshape.SetInParent()
