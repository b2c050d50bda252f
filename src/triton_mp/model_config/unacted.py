"""The ModelConfig fields triton-mp does not act on: a warning each, never silence.

Pure: reads a normalised, validated config. ``unacted_fields`` lists one sentence per field
that is set (differs from its default) but changes nothing in triton-mp, naming the field
path; ``model_config.plan`` logs each as a warning when the model loads. ``refusal`` is the
one field Triton itself fails the load for when it cannot provide it (repository agents:
triton-mp has none).

Fields other parts act on are not listed: batching, sequences, instances and their host
policies, warmup, the optimization settings the onnxruntime backend takes
(``backends.onnxruntime.options``: graph level, accelerators, ``model_operations``),
``priority`` (the worker's nice value), ``response_cache`` and ``rate_limiter`` (the
response cache and the rate limiter), ``ensemble_scheduling`` (ensembles), and the GPU
fields the GPU instances own (``gpus``, ``cc_model_filenames``, ``profile``);
``optimization.cuda`` is listed (CUDA graphs and busy-wait events are TensorRT's, and no
TensorRT worker runs yet).
"""

from __future__ import annotations

import json

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.backends.registry import BACKENDS

__all__ = ["ORT_PARAMETERS", "PYTORCH_PARAMETERS", "refusal", "unacted_fields"]

ORT_PARAMETERS = frozenset(
    {
        "intra_op_thread_count",
        "inter_op_thread_count",
        "execution_mode",
        "enable_mem_arena",
        "enable_mem_pattern",
        "memory.enable_memory_arena_shrinkage",
        "session.use_device_allocator_for_initializers",
    }
)
"""``parameters`` keys the onnxruntime backend acts on (besides any ``session.*`` entry)."""

PYTORCH_PARAMETERS = frozenset(
    {
        "DISABLE_OPTIMIZED_EXECUTION",
        "INFERENCE_MODE",
        "DISABLE_CUDNN",
        "ENABLE_CACHE_CLEANING",
        "ENABLE_WEIGHT_SHARING",
        "ENABLE_TENSOR_FUSER",
        "ENABLE_JIT_PROFILING",
        "ENABLE_JIT_EXECUTOR",
        "INTRA_OP_THREAD_COUNT",
        "INTER_OP_THREAD_COUNT",
    }
)
"""``parameters`` keys the PyTorch backend reads (``backends.pytorch.parameters``; it warns
itself that ``ENABLE_WEIGHT_SHARING`` cannot act)."""


def _optimization(config: mc.ModelConfig) -> list[str]:
    out = []
    opt = config.optimization
    if opt.graph.level != 0 and config.backend != "onnxruntime":
        out.append(
            f"optimization.graph.level {opt.graph.level} is only used by the onnxruntime "
            f"backend; ignored for backend '{config.backend}'"
        )
    eas = opt.execution_accelerators
    if (eas.gpu_execution_accelerator or eas.cpu_execution_accelerator) and (
        config.backend != "onnxruntime"
    ):
        out.append(
            "optimization.execution_accelerators are only used by the onnxruntime backend; "
            f"ignored for backend '{config.backend}'"
        )
    if opt.HasField("input_pinned_memory") and not opt.input_pinned_memory.enable:
        out.append("optimization.input_pinned_memory: triton-mp has no pinned memory pool")
    if opt.HasField("output_pinned_memory") and not opt.output_pinned_memory.enable:
        out.append("optimization.output_pinned_memory: triton-mp has no pinned memory pool")
    cuda = opt.cuda
    if cuda.graphs or cuda.graph_spec:
        out.append("optimization.cuda.graphs / graph_spec: CUDA graphs are TensorRT's; not used")
    if cuda.busy_wait_events:
        out.append("optimization.cuda.busy_wait_events: TensorRT only; not used")
    if cuda.output_copy_stream:
        out.append("optimization.cuda.output_copy_stream: no separate output copy stream")
    if opt.gather_kernel_buffer_threshold:
        out.append("optimization.gather_kernel_buffer_threshold: no gather kernel in triton-mp")
    if opt.eager_batching:
        out.append("optimization.eager_batching: not implemented by triton-mp")
    return out


def _tensors(config: mc.ModelConfig) -> list[str]:
    out = []
    for t in config.input:
        if t.format != mc.ModelInput.FORMAT_NONE:
            out.append(f"input '{t.name}' format {mc.ModelInput.Format.Name(t.format)}")
        if t.is_shape_tensor:
            out.append(f"input '{t.name}' is_shape_tensor (TensorRT only)")
        if t.is_non_linear_format_io:
            out.append(f"input '{t.name}' is_non_linear_format_io (TensorRT only)")
    for o in config.output:
        if o.is_shape_tensor:
            out.append(f"output '{o.name}' is_shape_tensor (TensorRT only)")
        if o.is_non_linear_format_io:
            out.append(f"output '{o.name}' is_non_linear_format_io (TensorRT only)")
    if config.batch_input:
        out.append("batch_input: triton-mp does not create batch inputs")
    if config.batch_output:
        out.append("batch_output: triton-mp does not scatter batch outputs")
    return out


def _scheduling(config: mc.ModelConfig) -> list[str]:
    out = []
    for group in config.instance_group:
        if group.passive:
            out.append(
                f"instance_group '{group.name}' passive: its instances are scheduled like any other"
            )
        if group.secondary_devices:
            out.append(f"instance_group '{group.name}' secondary_devices (NVDLA)")
    if config.HasField("sequence_batching"):
        seq = config.sequence_batching
        for st in seq.state:
            if st.use_same_buffer_for_input_output:
                out.append(
                    f"sequence_batching.state '{st.input_name}' use_same_buffer_for_input_output"
                )
            if st.use_growable_memory:
                out.append(f"sequence_batching.state '{st.input_name}' use_growable_memory")
    return out


def _parameters(config: mc.ModelConfig) -> list[str]:
    if config.backend == "onnxruntime":
        unknown = [
            k
            for k in sorted(config.parameters)
            if k not in ORT_PARAMETERS and not k.startswith("session.")
        ]
        return [f"parameters '{k}': not an onnxruntime backend parameter" for k in unknown]
    if config.backend == "pytorch":
        return [
            f"parameters '{k}': not a PyTorch backend parameter"
            for k in sorted(config.parameters)
            if k not in PYTORCH_PARAMETERS
        ]
    info = BACKENDS.get(config.backend)
    if info is None:
        return []
    return [
        f"parameters '{k}': {info.unacted_reason}"
        for k in sorted(config.parameters)
        if k in info.unacted_parameters
    ]


def unacted_fields(config: mc.ModelConfig) -> list[str]:
    """One sentence per set field of ``config`` that triton-mp does not act on, naming it.

    Returns:
        Sentences in field order; empty when every set field is acted on.
    """
    out = []
    if config.runtime:
        out.append(f"runtime '{config.runtime}': the backend's default runtime is used")
    out += _tensors(config)
    out += _optimization(config)
    out += _scheduling(config)
    out += _parameters(config)
    if config.model_operations.op_library_filename and config.backend != "onnxruntime":
        out.append("model_operations.op_library_filename is only used by the onnxruntime backend")
    if config.metric_tags:
        out.append(f"metric_tags {json.dumps(dict(config.metric_tags))}: not added to metrics")
    if config.HasField("model_metrics"):
        out.append("model_metrics: custom histogram buckets are not supported")
    return out


def refusal(config: mc.ModelConfig) -> str:
    """Why the config cannot load at all for a field triton-mp cannot provide ("" if none).

    Triton fails a load whose repository agent it cannot find; triton-mp has none.
    """
    agents = config.model_repository_agents.agents
    if agents:
        names = ", ".join(f"'{a.name}'" for a in agents)
        return f"model repository agents are not supported by triton-mp (requested: {names})"
    return ""
