"""Triton's defaults for a config (core ``NormalizeModelConfig`` / ``NormalizeInstanceGroup``).

Run by ``loader`` before and after the backend's auto-complete (both are idempotent); the
instance groups are normalised last, for the GPUs of this server.
"""

from __future__ import annotations

from triton_mp._proto import model_config_pb2
from triton_mp.backends.registry import BACKENDS
from triton_mp.model_config.autocomplete import TF_BACKEND

__all__ = ["SEQUENCE_IDLE_DEFAULT_US", "normalize_instance_group", "normalize_model_config"]

_pb = model_config_pb2

SEQUENCE_IDLE_DEFAULT_US = 1_000_000
"""Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS: idle timeout written when the config gives 0."""

_TWO_CPU_INSTANCES = frozenset({BACKENDS["onnxruntime"].name, TF_BACKEND})
"""Backends whose KIND_CPU groups without a count get 2 instances (NormalizeInstanceGroup)."""


def normalize_model_config(config: model_config_pb2.ModelConfig) -> None:
    """Fill Triton's defaults (NormalizeModelConfig). Idempotent.

    The version policy (latest 1), preferred batch sizes (max_batch_size) of the dynamic and
    the oldest-sequence batchers, the sequence idle time (``SEQUENCE_IDLE_DEFAULT_US``) and
    pinned input/output memory (on) for every model but an ensemble.
    """
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    mbs = config.max_batch_size
    if (
        config.HasField("dynamic_batching")
        and not config.dynamic_batching.preferred_batch_size
        and mbs > 0
    ):
        config.dynamic_batching.preferred_batch_size.append(mbs)
    if config.HasField("sequence_batching"):
        seq = config.sequence_batching
        if seq.max_sequence_idle_microseconds == 0:
            seq.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if seq.HasField("oldest") and not seq.oldest.preferred_batch_size and mbs > 0:
            seq.oldest.preferred_batch_size.append(mbs)
    if not config.HasField("ensemble_scheduling"):
        opt = config.optimization
        if not opt.HasField("input_pinned_memory"):
            opt.input_pinned_memory.enable = True
        if not opt.HasField("output_pinned_memory"):
            opt.output_pinned_memory.enable = True


def normalize_instance_group(
    config: model_config_pb2.ModelConfig, gpu_ids: tuple[int, ...]
) -> None:
    """Default instance groups (NormalizeInstanceGroup) for a server with ``gpu_ids``.

    No group: one group named after the model. Each group gets a name
    (``<model>_<index>``), KIND_AUTO resolves to KIND_GPU when every listed GPU is one of
    ``gpu_ids`` (and there are some), else KIND_CPU; a count below 1 becomes 1 (2 for CPU
    groups of onnxruntime and tensorflow); a GPU group without GPUs gets all of them.
    Ensembles have no instances.
    """
    if config.HasField("ensemble_scheduling"):
        return
    kinds = _pb.ModelInstanceGroup
    supported = set(gpu_ids)
    if not config.instance_group:
        # NOTE: the backends' "preferred groups" (python: KIND_GPU on GPU builds, else
        # KIND_CPU) resolve to the same kind as KIND_AUTO below, so none are modelled.
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == kinds.KIND_AUTO:
            if not supported or any(g not in supported for g in group.gpus):
                group.kind = kinds.KIND_CPU
            else:
                group.kind = kinds.KIND_GPU
        if group.count < 1:
            group.count = 1
            if group.kind == kinds.KIND_CPU and config.backend in _TWO_CPU_INSTANCES:
                group.count = 2
        if group.kind == kinds.KIND_GPU and not group.gpus:
            group.gpus.extend(sorted(supported))
