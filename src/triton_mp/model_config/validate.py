"""Config rules (core ``model_config_utils.cc``: ValidateModelConfig, ValidateModelIOConfig,
ValidateInstanceGroup). Each check raises ``ConfigError`` with Triton's message for the first
rule broken; none changes the config.

Run by ``loader``: the model-level rules on the config as written (after the server-side
auto-complete and normalisation), the input/output rules once the backend's auto-complete
has run (or at once when auto-complete is off), and the instance-group rules after the
groups are normalised for this server's GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from triton_mp._proto import model_config_pb2
from triton_mp.backends.registry import BACKENDS
from triton_mp.common.datatypes import DataType
from triton_mp.common.errors import ConfigError
from triton_mp.common.process.gpus import MIN_COMPUTE_CAPABILITY
from triton_mp.model_config.autocomplete import TRITON_PLATFORMS
from triton_mp.model_config.ensemble import ENSEMBLE_PLATFORM, validate_ensemble_scheduling

__all__ = ["validate_instance_group", "validate_model_config", "validate_model_io_config"]

_pb = model_config_pb2


_TENSORRT_PLATFORM = BACKENDS["tensorrt"].platforms[0]

# Backend "types" Triton checks platform/backend pairs against (GetBackendType /
# GetBackendTypeFromPlatform). A backend not in this table (python, custom ones) accepts any
# platform.
_BACKEND_OF_PLATFORM = {
    platform: info.name for info in BACKENDS.values() for platform in info.platforms
} | TRITON_PLATFORMS
_TYPED_BACKENDS = frozenset(_BACKEND_OF_PLATFORM.values())

_WILDCARD_DIM = -1


def validate_model_config(config: model_config_pb2.ModelConfig) -> None:
    """Model-level checks (ValidateModelConfig); inputs/outputs are checked separately.

    Raises:
        ConfigError: the first rule broken, with Triton's message.
    """
    name = config.name
    if not name:
        raise ConfigError("model configuration must specify 'name'")
    if not config.backend:
        if config.platform != ENSEMBLE_PLATFORM:
            raise ConfigError(f"unexpected platform type '{config.platform}' for {name}")
    elif config.platform == ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"Ensemble model '{name}' must have platform type '{config.platform}' and empty "
            "backend type"
        )
    if config.backend in _TYPED_BACKENDS and (
        _BACKEND_OF_PLATFORM.get(config.platform) != config.backend
    ):
        raise ConfigError(
            f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {config.backend}"
        )
    if config.max_batch_size < 0:
        raise ConfigError(f"'max_batch_size' must be non-negative value for {name}")
    if not config.HasField("version_policy"):
        raise ConfigError(f"must specify 'version policy' for {name}")

    if config.HasField("dynamic_batching"):
        _validate_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        _validate_sequence_batching(config)

    if config.HasField("ensemble_scheduling"):
        validate_ensemble_scheduling(config)
    elif config.platform == ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"ensemble scheduling must be set for ensemble {name} whose platform is "
            f"{ENSEMBLE_PLATFORM}"
        )

    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise ConfigError(
            f"Response Cache does not currently support model {name} with 'decoupled' "
            "transaction policy. Please disable the response cache."
        )
    if config.HasField("model_metrics"):
        for control in config.model_metrics.metric_control:
            if not control.HasField("metric_identifier"):
                raise ConfigError("metric control must specify 'metric_identifier'")
            if not control.metric_identifier.family:
                raise ConfigError("metric identifier must specify non-empty 'family'")
            if not control.HasField("histogram_options"):
                raise ConfigError("metric control must specify 'histogram_options'")
            if not control.histogram_options.buckets:
                raise ConfigError("histogram options must specify non-empty 'buckets'")


def _validate_dynamic_batching(config: model_config_pb2.ModelConfig) -> None:
    name = config.name
    db = config.dynamic_batching
    for size in db.preferred_batch_size:
        if size <= 0:
            raise ConfigError(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise ConfigError(
                f"dynamic batching preferred size must be <= max batch size for {name}"
            )
    levels = db.priority_levels
    if levels != 0:
        if db.default_priority_level == 0 or db.default_priority_level > levels:
            raise ConfigError(f"default priority level must be in range [1, {levels}] for {name}")
        for level in db.priority_queue_policy:
            if level == 0 or level > levels:
                raise ConfigError(
                    "priority queue policy must have priority level in range "
                    f"[1, {levels}] for {name}"
                )
    if db.preserve_ordering:
        if levels > 1:
            raise ConfigError(
                f"Only one priority level is allowed when 'preserve_ordering' is true for {name}"
            )
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        for policy in policies:
            if (
                policy.default_timeout_microseconds != 0
                and policy.timeout_action == _pb.ModelQueuePolicy.DELAY
            ):
                raise ConfigError(
                    "Queue policy can not have DELAY as timeout action when "
                    f"'preserve_ordering' is true for {name}"
                )


_Control = _pb.ModelSequenceBatching.Control


def _validate_sequence_batching(config: model_config_pb2.ModelConfig) -> None:
    name = config.name
    seq = config.sequence_batching
    if config.response_cache.enable:
        raise ConfigError(
            f"Response Cache does not currently support model {name} with sequence "
            "batching scheduler. Please disable the response cache."
        )
    for kind in (
        _Control.CONTROL_SEQUENCE_START,
        _Control.CONTROL_SEQUENCE_END,
        _Control.CONTROL_SEQUENCE_READY,
    ):
        _check_sequence_control(seq, name, kind, typed=False)
    corrid_type = _check_sequence_control(seq, name, _Control.CONTROL_SEQUENCE_CORRID, typed=True)
    allowed = (DataType.UINT64, DataType.INT64, DataType.UINT32, DataType.INT32, DataType.STRING)
    if corrid_type is not None and corrid_type not in allowed:
        raise ConfigError(
            f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed "
            "data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )
    if seq.HasField("oldest"):
        for size in seq.oldest.preferred_batch_size:
            if size <= 0:
                raise ConfigError(
                    f"sequence batching preferred batch size must be positive for {name}"
                )
            if size > config.max_batch_size:
                raise ConfigError(
                    f"sequence batching preferred batch size must be <= max batch size for {name}"
                )
    if seq.HasField("direct"):
        utilization = seq.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            raise ConfigError(
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}"
            )


def _check_sequence_control(
    seq: model_config_pb2.ModelSequenceBatching, model: str, kind: int, *, typed: bool
) -> int | None:
    """Check one control kind (Get{Boolean,Typed}SequenceControlProperties).

    Returns the control's data type when ``typed`` and the control is present, else None.
    """
    kind_name = _Control.Kind.Name(kind)
    seen_tensors: set[str] = set()
    found: int | None = None
    seen = False
    for control_input in seq.control_input:
        if not control_input.name:
            raise ConfigError(f"sequence batching control tensor must have a name for {model}")
        if control_input.name in seen_tensors:
            raise ConfigError(
                f"sequence batching control tensor '{control_input.name}' is specified for "
                f"multiple control kinds for {model}"
            )
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            if control.kind != kind:
                continue
            if seen:
                raise ConfigError(
                    f"sequence batching specifies multiple {kind_name} tensors for {model}"
                )
            seen = True
            given = [
                bool(control.int32_false_true),
                bool(control.fp32_false_true),
                bool(control.bool_false_true),
            ]
            if typed:
                found = int(control.data_type)
                if any(given):
                    raise ConfigError(
                        "sequence batching must not specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind_name} for {model}"
                    )
                continue
            if not any(given):
                raise ConfigError(
                    "sequence batching must specify either 'int32_false_true', "
                    f"'fp32_false_true' or 'bool_false_true' for {kind_name} for {model}"
                )
            if sum(given) > 1:
                raise ConfigError(
                    "sequence batching specifies more than one from 'int32_false_true', "
                    f"'fp32_false_true' and 'bool_false_true' for {kind_name} for {model}"
                )
            for field, values in (
                ("int32_false_true", control.int32_false_true),
                ("fp32_false_true", control.fp32_false_true),
                ("bool_false_true", control.bool_false_true),
            ):
                if values and len(values) != 2:
                    raise ConfigError(
                        f"sequence batching control '{field}' must have exactly 2 entries for "
                        f"{kind_name} for {model}"
                    )
    return found


def validate_model_io_config(config: model_config_pb2.ModelConfig) -> None:
    """Input/output checks (ValidateModelIOConfig); messages end with " for <model>".

    Raises:
        ConfigError: the first rule broken.
    """
    suffix = f" for {config.name}"
    try:
        seen: set[str] = set()
        for model_input in config.input:
            _validate_io_shape(model_input, config.max_batch_size, "model input ")
            if model_input.name in seen:
                raise ConfigError(f"model input '{model_input.name}' is specified more than once")
            seen.add(model_input.name)
            if (
                model_input.format
                in (
                    _pb.ModelInput.FORMAT_NHWC,
                    _pb.ModelInput.FORMAT_NCHW,
                )
                and len(model_input.dims) != 3
            ):
                raise ConfigError("model input NHWC/NCHW require 3 dims")
            _validate_trt_only_io(model_input, config.platform, "input")
        seen = set()
        for model_output in config.output:
            _validate_io_shape(model_output, config.max_batch_size, "model output ")
            if model_output.name in seen:
                raise ConfigError(f"model output '{model_output.name}' is specified more than once")
            seen.add(model_output.name)
            _validate_trt_only_io(model_output, config.platform, "output")
        _validate_batch_io(config)
    except ConfigError as exc:
        raise ConfigError(exc.message + suffix) from None


def _validate_trt_only_io(io: Any, platform: str, io_type: str) -> None:
    if platform != _TENSORRT_PLATFORM and io.is_shape_tensor:
        raise ConfigError("shape tensors are only supported for TensorRT platform")
    if io.is_non_linear_format_io:
        if platform != _TENSORRT_PLATFORM:
            raise ConfigError("Non-linear IO format is only supported for the TensorRT platform")
        if len(io.dims) != 3:
            raise ConfigError(f"Non-linear IO format {io_type} requires 3 dims")


def _element_count(dims: Iterable[int]) -> int:
    """Triton's GetElementCount: -1 if any dim is a wildcard, 0 for no dims, else product."""
    count = 0
    for dim in dims:
        if dim == _WILDCARD_DIM:
            return _WILDCARD_DIM
        count = dim if count == 0 else count * dim
    return count


def _segment_counts(dims: Iterable[int]) -> list[int]:
    """Element counts of the runs of fixed dims between wildcards."""
    counts: list[int] = []
    current = 1
    for dim in dims:
        if dim == _WILDCARD_DIM:
            counts.append(current)
            current = 1
        else:
            current *= dim
    counts.append(current)
    return counts


def _validate_io_shape(io: Any, max_batch_size: int, prefix: str) -> None:
    """ValidateIOShape for one ModelInput or ModelOutput."""
    if not io.name:
        raise ConfigError(prefix + "must specify 'name'")
    prefix = f"{prefix}'{io.name}' "
    if io.data_type == DataType.INVALID:
        raise ConfigError(prefix + "must specify 'data_type'")
    if not io.dims:
        raise ConfigError(prefix + "must specify 'dims'")
    has_reshape = io.HasField("reshape")
    if has_reshape and not io.reshape.shape and max_batch_size == 0:
        raise ConfigError(
            prefix + "cannot have empty reshape for non-batching model as scalar tensors are "
            "not supported"
        )
    for dim in io.dims:
        if dim < 1 and dim != _WILDCARD_DIM:
            raise ConfigError(
                prefix + f"dimension must be integer >= 1, or {_WILDCARD_DIM} to indicate a "
                "variable-size dimension"
            )
    if not has_reshape:
        return
    for dim in io.reshape.shape:
        if dim < 1 and dim != _WILDCARD_DIM:
            raise ConfigError(
                prefix + f"reshape dimensions must be integer >= 1, or {_WILDCARD_DIM} to "
                "indicate a variable-size dimension"
            )
    dims_size = _element_count(io.dims)
    reshape_size = _element_count(io.reshape.shape)
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        raise ConfigError(prefix + "has different size for dims and reshape")
    if dims_size == _WILDCARD_DIM:
        dim_counts = _segment_counts(io.dims)
        reshape_counts = _segment_counts(io.reshape.shape)
        if len(dim_counts) != len(reshape_counts):
            raise ConfigError(
                prefix + "has different number of variable-size dimensions for dims and reshape"
            )
        if dim_counts != reshape_counts:
            raise ConfigError(prefix + "has different size for dims and reshape")


def _validate_batch_io(config: model_config_pb2.ModelConfig) -> None:
    """ValidateBatchIO: batch_input / batch_output sources and targets."""
    input_names = {i.name for i in config.input}
    output_names = {o.name for o in config.output}
    for batch_input in config.batch_input:
        kind_name = _pb.BatchInput.Kind.Name(batch_input.kind)
        if len(batch_input.source_input) != 1:
            raise ConfigError(
                f"batch input kind '{kind_name}' expects 1 source input, got "
                f"{len(batch_input.source_input)}"
            )
        if int(batch_input.data_type) not in (DataType.INT32, DataType.FP32):
            raise ConfigError("batch input data type must be TYPE_INT32 or TYPE_FP32")
        for source in batch_input.source_input:
            if source not in input_names:
                raise ConfigError(f"unknown source input name '{source}'")
    for batch_output in config.batch_output:
        kind_name = _pb.BatchOutput.Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            raise ConfigError(
                f"batch output kind '{kind_name}' expects 1 source input, got "
                f"{len(batch_output.source_input)}"
            )
        for source in batch_output.source_input:
            if source not in input_names:
                raise ConfigError(f"unknown source input name '{source}'")
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in output_names:
                raise ConfigError(f"unknown target output name '{target}'")
            if target in targets:
                raise ConfigError(f"target output name '{target}' can only be specified once")
            targets.add(target)


def validate_instance_group(
    config: model_config_pb2.ModelConfig,
    gpu_ids: tuple[int, ...],
    min_compute_capability: float = MIN_COMPUTE_CAPABILITY,
) -> None:
    """ValidateInstanceGroup after normalisation, for a server with ``gpu_ids`` (the CUDA
    ordinals of ``common.process.gpus.Devices.supported_ids``); ``min_compute_capability`` is quoted
    in the invalid-gpu-id message (``--min-supported-compute-capability``)."""
    if config.HasField("ensemble_scheduling"):
        return
    name = config.name
    kinds = _pb.ModelInstanceGroup
    if not config.instance_group:
        raise ConfigError(f"must specify one or more 'instance group's for {name}")
    supported = set(gpu_ids)
    for group in config.instance_group:
        where = f"instance group {group.name} of model {name}"
        if group.kind == kinds.KIND_MODEL:
            if group.gpus:
                raise ConfigError(f"{where} has kind KIND_MODEL but specifies one or more GPUs")
        elif group.kind == kinds.KIND_GPU:
            if not group.gpus:
                if not supported:
                    raise ConfigError(f"{where} has kind KIND_GPU but no GPUs are available")
                raise ConfigError(f"{where} has kind KIND_GPU but specifies no GPUs")
            for gpu in group.gpus:
                if gpu not in supported:
                    listed = ", ".join(str(g) for g in sorted(supported))
                    raise ConfigError(
                        f"{where} specifies invalid or unsupported gpu id {gpu}. GPUs with at "
                        "least the minimum required CUDA compute compatibility of "
                        f"{min_compute_capability:.6f} are: {listed}"
                    )
        elif group.kind == kinds.KIND_CPU:
            if group.gpus:
                raise ConfigError(f"{where} has kind KIND_CPU but specifies one or more GPUs")
        else:
            raise ConfigError(f"{where} has unexpected kind KIND_AUTO")
        if group.profile:
            if config.platform != _TENSORRT_PLATFORM:
                raise ConfigError(
                    f"{where} and platform {config.platform} specifies profile field which is "
                    "only supported for TensorRT models"
                )
            for profile in group.profile:
                _check_profile(profile, where, config.platform)


def _check_profile(profile: str, where: str, platform: str) -> None:
    """A TensorRT optimisation profile must be a non-negative integer (GetProfileIndex)."""
    if not profile:
        raise ConfigError("profile name must not be empty")
    # NOTE: Triton parses with std::stoi, which skips leading blanks and ignores trailing text.
    match = re.match(r"\s*([+-]?[0-9]+)", profile)
    if match is None:
        raise ConfigError(f"unable to parse '{profile}': stoi")
    if int(match.group(1)) < 0:
        raise ConfigError(
            f"{where} and platform {platform} specifies invalid profile {profile}. The field "
            "should contain the string representation of a non-negative integer."
        )
