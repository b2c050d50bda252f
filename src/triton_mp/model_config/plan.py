"""Planning: loaded repository models -> the runtime specs of their versions and instances.

Turns each loadable ``RepositoryModel`` into one ``ipc.protocol.specs.ModelVersionSpec`` per version
(tensors, batching, sequence controls and state, queue policies, the config's JSON form) and
one ``InstanceSpec`` per model instance, with dense instance ids. A model triton-mp cannot
run yet (a backend whose registry row has no worker) gets ``ModelPlan.error``. An ensemble's
version spec carries its steps (``ipc.protocol.specs.EnsembleSpec``) and no instances.
Each instance gets its host policy (``--host-policy`` settings of its group's
``host_policy``, Triton's default names otherwise; a value that does not parse fails the
model, as Triton fails the instance) and its nice value (``optimization.priority``); each
version its ``model_warmup`` samples. Config fields triton-mp does not act on are logged as
warnings (``model_config.unacted``).
Pure but for those warnings: reads the config and the paths, starts nothing. Used by the
supervisor at start and by the model manager on every load.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.backends.registry import BACKENDS
from triton_mp.common.datatypes import DataType
from triton_mp.common.errors import ConfigError
from triton_mp.common.json_form import config_to_json
from triton_mp.common.process.host_policy import (
    default_policy_name,
    parse_cpu_cores,
    parse_numa_node,
)
from triton_mp.ipc.protocol.specs import (
    BackendCapabilities,
    BatchingSpec,
    ControlSpec,
    EnsembleSpec,
    EnsembleStepSpec,
    InstanceSpec,
    ModelVersionSpec,
    QueuePolicySpec,
    RateLimitSpec,
    ResourceSpec,
    SequenceSpec,
    StateSpec,
    TensorSpec,
    WarmupInputSpec,
    WarmupSampleSpec,
)
from triton_mp.model_config.ensemble import ENSEMBLE_PLATFORM
from triton_mp.model_config.loader import ModelVersion, RepositoryModel
from triton_mp.model_config.unacted import refusal, unacted_fields

log = logging.getLogger(__name__)

__all__ = ["ModelPlan", "instance_names", "plan_models", "rate_limits"]

_KIND_NAMES: dict[int, Literal["KIND_CPU", "KIND_GPU", "KIND_MODEL"]] = {
    mc.ModelInstanceGroup.KIND_CPU: "KIND_CPU",
    mc.ModelInstanceGroup.KIND_GPU: "KIND_GPU",
    mc.ModelInstanceGroup.KIND_MODEL: "KIND_MODEL",
}

_CONTROL_KINDS: dict[int, Literal["START", "END", "READY", "CORRID"]] = {
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "START",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "END",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "READY",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}


@dataclass
class ModelPlan:
    """What the supervisor will start for one repository model.

    Attributes:
        repo: the loaded model.
        versions: one spec per planned version, ascending.
        instances: the instances of those versions, in id order.
        failed_versions: version -> reason, for versions that cannot start (filled by the
            model manager).
        error: why the model cannot be served at all ("" when it can).
        worker_configs: version -> the ``config_json`` its planned instances read when it is
            not their version spec's (an in-place change: the version's config at its last
            full load, ``supervisor.models.regroups``).
    """

    repo: RepositoryModel
    versions: list[ModelVersionSpec] = field(default_factory=list)
    instances: list[InstanceSpec] = field(default_factory=list)
    failed_versions: dict[int, str] = field(default_factory=dict)
    error: str = ""
    worker_configs: dict[int, str] = field(default_factory=dict)

    def worker_model(self, version: ModelVersionSpec) -> ModelVersionSpec:
        """The spec a planned instance of ``version`` starts from: ``version`` itself, its
        ``config_json`` replaced by ``worker_configs``' when that names another."""
        config = self.worker_configs.get(version.version)
        if config is None or config == version.config_json:
            return version
        return msgspec.structs.replace(version, config_json=config)


NO_CAPABILITIES = BackendCapabilities()
"""An ensemble's: it has no backend."""


def plan_models(
    models: list[RepositoryModel],
    first_instance_id: int = 0,
    only_versions: dict[str, set[int]] | None = None,
    host_policies: dict[str, dict[str, str]] | None = None,
    configs: Mapping[str, mc.ModelConfig] | None = None,
) -> tuple[list[ModelPlan], list[InstanceSpec]]:
    """Turn loaded repository models into version specs and instances with dense ids.

    Args:
        models: loaded repository models.
        first_instance_id: the first id to hand out (ids are never reused in a server).
        only_versions: per model, the versions to plan (the others are left out); None
            plans every version.
        host_policies: ``--host-policy`` settings, policy name -> setting -> value.
        configs: the completed configs of the models ensembles' steps name (each step's
            ``decoupled`` and ``max_batch_size``); None: ``models`` only.

    Returns:
        One plan per model, in order, and every planned instance, ids ascending from
        ``first_instance_id``.
    """
    plans = []
    instances: list[InstanceSpec] = []
    for m in models:
        plan = ModelPlan(m)
        plans.append(plan)
        plan.error = _refusal(m)
        if plan.error:
            continue
        assert m.config is not None
        for warning in unacted_fields(m.config):
            log.warning("model '%s': %s (not acted on by triton-mp)", m.name, warning)
        try:
            policies = _host_policies(m.config, host_policies or {})
        except ConfigError as e:
            plan.error = e.message
            continue
        batching = _batching_spec(m.config)
        config_json = json.dumps(config_to_json(m.config))
        for v in m.versions:
            if only_versions is not None and v.version not in only_versions.get(m.name, set()):
                continue
            first = first_instance_id + len(instances)
            version_instances = _instances(m.name, v.version, m.config, first, policies)
            instances.extend(version_instances)
            plan.instances.extend(version_instances)
            spec = _version_spec(m, v, batching, version_instances, config_json)
            if m.config.platform == ENSEMBLE_PLATFORM:
                known = {x.name: x.config for x in models if x.config is not None}
                spec = msgspec.structs.replace(
                    spec, ensemble=_ensemble_spec(m.config, {**known, **(configs or {})})
                )
            plan.versions.append(spec)
    return plans, instances


def _ensemble_spec(cfg: mc.ModelConfig, configs: Mapping[str, mc.ModelConfig]) -> EnsembleSpec:
    """``ensemble_scheduling`` as the scheduler's spec."""
    steps = []
    for step in cfg.ensemble_scheduling.step:
        composing = configs.get(step.model_name)
        steps.append(
            EnsembleStepSpec(
                model=step.model_name,
                version=int(step.model_version),
                input_map=dict(step.input_map),
                output_map=dict(step.output_map),
                decoupled=bool(composing and composing.model_transaction_policy.decoupled),
                max_batch_size=int(composing.max_batch_size) if composing else 0,
            )
        )
    return EnsembleSpec(
        steps=tuple(steps),
        max_inflight_requests=int(cfg.ensemble_scheduling.max_inflight_requests),
    )


def _refusal(m: RepositoryModel) -> str:
    """Why a loaded model cannot be planned ("" when it can)."""
    if m.error is not None or m.config is None:
        return m.error or "failed to load"
    if m.config.platform == ENSEMBLE_PLATFORM:
        return ""
    info = BACKENDS.get(m.config.backend)
    if info is None or not info.runs:
        return f"backend '{m.config.backend}' is not supported by triton-mp yet"
    return info.missing() or refusal(m.config)


def instance_names(config: mc.ModelConfig) -> list[tuple[str, int, int]]:
    """List the model instances a normalised config asks for, in Triton's order and naming.

    Each entry is ``(instance_name, kind, gpu_id)``: ``instance_name`` is
    ``<group_name>_<i>`` for ``i`` in ``range(count)``; ``kind`` is a
    ``ModelInstanceGroup.Kind`` value; ``gpu_id`` is the device for ``KIND_GPU`` and -1
    otherwise. A ``KIND_GPU`` group makes ``count`` instances *per listed GPU*, and (as in
    Triton's backend_model.cc) the copies on different GPUs share the name, so
    ``(instance_name, gpu_id)`` is the unique key. Passive instances are included (they are
    loaded but never scheduled; see ``group.passive``). Ensembles have no instances.
    """
    out: list[tuple[str, int, int]] = []
    if config.HasField("ensemble_scheduling"):
        return out
    for group in config.instance_group:
        for i in range(group.count):
            name = f"{group.name}_{i}"
            if group.kind == mc.ModelInstanceGroup.KIND_GPU:
                out.extend((name, int(group.kind), int(gpu)) for gpu in group.gpus)
            else:
                out.append((name, int(group.kind), -1))
    return out


_Policy = tuple[str, tuple[int, ...], int]
"""An instance's host policy: (name, cpu cores, NUMA node or -1)."""


def _host_policies(cfg: mc.ModelConfig, settings: dict[str, dict[str, str]]) -> list[_Policy]:
    """The host policy of each instance of ``instance_names(cfg)``, in that order.

    Raises:
        ConfigError: a ``cpu-cores`` or ``numa-node`` value that does not parse.
    """
    out: list[_Policy] = []
    if cfg.HasField("ensemble_scheduling"):
        return out
    for group in cfg.instance_group:
        kind = _KIND_NAMES.get(group.kind, "KIND_CPU")
        gpus = list(group.gpus) if kind == "KIND_GPU" else [-1]
        for _ in range(group.count):
            for gpu in gpus:
                name = group.host_policy or default_policy_name(kind, gpu)
                policy = settings.get(name, {})
                cores = parse_cpu_cores(policy["cpu-cores"]) if "cpu-cores" in policy else ()
                node = parse_numa_node(policy["numa-node"]) if "numa-node" in policy else -1
                out.append((name, cores, node))
    return out


_NICE = {mc.ModelOptimizationPolicy.PRIORITY_MIN: 19}
"""``optimization.priority`` -> the worker's nice increment, after Triton's GetCpuNiceLevel
(PRIORITY_MAX 0, PRIORITY_MIN 19). Triton's default level was 5, here 0: an unprivileged
process cannot go below its start, so MAX and the default share the best level there is."""


def _instances(
    model: str, version: int, cfg: mc.ModelConfig, first_id: int, policies: list[_Policy]
) -> list[InstanceSpec]:
    """The instances of one version, ids from ``first_id``; ``policies`` per instance."""
    nice = _NICE.get(cfg.optimization.priority, 0)
    return [
        InstanceSpec(
            instance_id=first_id + i,
            name=name,
            model=model,
            version=version,
            kind=_KIND_NAMES.get(kind, "KIND_CPU"),
            gpu_id=gpu,
            host_policy=policy[0],
            cpu_cores=policy[1],
            numa_node=policy[2],
            nice=nice,
        )
        for i, ((name, kind, gpu), policy) in enumerate(
            zip(instance_names(cfg), policies, strict=True)
        )
    ]


_WARMUP_SOURCES: dict[str | None, Literal["zero", "random", "file", ""]] = {
    "zero_data": "zero",
    "random_data": "random",
    "input_data_file": "file",
}


def _warmup_specs(cfg: mc.ModelConfig, model_dir: Path) -> tuple[WarmupSampleSpec, ...]:
    """``model_warmup`` as specs; data files live in ``<model dir>/warmup/`` (Triton's
    ``kWarmupDataFolder``). Inputs in name order (the config's map has none)."""
    samples = []
    for w in cfg.model_warmup:
        inputs = []
        for name in sorted(w.inputs):
            inp = w.inputs[name]
            source = _WARMUP_SOURCES.get(inp.WhichOneof("input_data_type"), "")
            inputs.append(
                WarmupInputSpec(
                    name=name,
                    datatype=_wire(inp.data_type),
                    dims=tuple(int(d) for d in inp.dims),
                    source=source,
                    data_file=(
                        str(model_dir / "warmup" / inp.input_data_file) if source == "file" else ""
                    ),
                    file_name=inp.input_data_file if source == "file" else "",
                )
            )
        samples.append(
            WarmupSampleSpec(
                name=w.name, batch_size=int(w.batch_size), count=int(w.count), inputs=tuple(inputs)
            )
        )
    return tuple(samples)


def rate_limits(config: mc.ModelConfig) -> tuple[RateLimitSpec, ...]:
    """Each instance's group's ``rate_limiter``, in ``instance_names`` order."""
    out: list[RateLimitSpec] = []
    if config.HasField("ensemble_scheduling"):
        return ()
    for group in config.instance_group:
        rl = group.rate_limiter
        resources = tuple(
            ResourceSpec(r.name, bool(getattr(r, "global")), int(r.count)) for r in rl.resources
        )
        gpu = group.kind == mc.ModelInstanceGroup.KIND_GPU
        devices = [int(g) for g in group.gpus] if gpu else [0]
        for _ in range(group.count):
            out.extend(
                RateLimitSpec(resources=resources, priority=int(rl.priority), device=d)
                for d in devices
            )
    return tuple(out)


def _version_spec(
    m: RepositoryModel,
    v: ModelVersion,
    batching: BatchingSpec,
    instances: list[InstanceSpec],
    config_json: str,
) -> ModelVersionSpec:
    """The runtime spec of one version of a plannable model."""
    cfg = m.config
    assert cfg is not None
    return ModelVersionSpec(
        model=m.name,
        version=v.version,
        backend=cfg.backend,
        model_file=str(v.model_file.resolve()),
        max_batch_size=cfg.max_batch_size,
        batching=batching,
        inputs=_tensor_specs(cfg.input, True),
        outputs=_tensor_specs(cfg.output, False),
        instance_ids=tuple(inst.instance_id for inst in instances),
        instance_names=tuple(inst.name for inst in instances),
        sequence=(_sequence_spec(cfg, m.directory) if cfg.HasField("sequence_batching") else None),
        config_json=config_json,
        decoupled=bool(cfg.model_transaction_policy.decoupled),
        warmup=_warmup_specs(cfg, m.directory),
        rate_limits=rate_limits(cfg),
        capabilities=info.capabilities if (info := BACKENDS.get(cfg.backend)) else NO_CAPABILITIES,
    )


def _wire(data_type: int) -> str:
    """The protocol datatype string of a config data type; "INVALID" for unknown numbers."""
    try:
        return DataType(data_type).wire
    except ValueError:
        return DataType.INVALID.wire


def _tensor_specs(tensors: Any, optional: bool) -> tuple[TensorSpec, ...]:
    """Config inputs or outputs as specs; ``optional`` honours the inputs' flag."""
    return tuple(
        TensorSpec(
            name=t.name,
            datatype=_wire(t.data_type),
            dims=tuple(int(d) for d in t.dims),
            reshape=tuple(int(d) for d in t.reshape.shape) if t.HasField("reshape") else None,
            optional=bool(getattr(t, "optional", False)) and optional,
            allow_ragged_batch=bool(getattr(t, "allow_ragged_batch", False)),
        )
        for t in tensors
    )


def _batching_spec(cfg: mc.ModelConfig) -> BatchingSpec:
    """The scheduler's batching: sequence, dynamic (with queue policies) or default."""
    dyn = cfg.dynamic_batching if cfg.HasField("dynamic_batching") else None
    is_sequence = cfg.HasField("sequence_batching")
    kind: Literal["default", "dynamic", "sequence", "ensemble"] = (
        "sequence" if is_sequence else "dynamic" if dyn is not None else "default"
    )
    if cfg.HasField("ensemble_scheduling"):
        kind = "ensemble"
    return BatchingSpec(
        kind=kind,
        max_batch_size=cfg.max_batch_size,
        preferred_batch_sizes=tuple(dyn.preferred_batch_size) if dyn else (),
        max_queue_delay_us=int(dyn.max_queue_delay_microseconds) if dyn else 0,
        preserve_ordering=bool(dyn.preserve_ordering) if dyn else False,
        priority_levels=int(dyn.priority_levels) if dyn else 0,
        default_priority_level=int(dyn.default_priority_level) if dyn else 0,
        default_queue_policy=_queue_policy(dyn.default_queue_policy if dyn else None),
        priority_queue_policy=(
            {int(k): _queue_policy(v) for k, v in dyn.priority_queue_policy.items()} if dyn else {}
        ),
    )


def _queue_policy(policy: object) -> QueuePolicySpec:
    """A ``ModelQueuePolicy`` message (None = absent) as the scheduler's spec."""
    if policy is None:
        return QueuePolicySpec()
    p: Any = policy
    return QueuePolicySpec(
        timeout_action="DELAY" if p.timeout_action == mc.ModelQueuePolicy.DELAY else "REJECT",
        default_timeout_us=int(p.default_timeout_microseconds),
        allow_timeout_override=bool(p.allow_timeout_override),
        max_queue_size=int(p.max_queue_size),
    )


def _control_specs(seq: mc.ModelSequenceBatching) -> tuple[ControlSpec, ...]:
    """The sequence control inputs (already validated): kind, datatype, false/true values."""
    controls = []
    for ci in seq.control_input:
        for c in ci.control:
            kind = _CONTROL_KINDS[c.kind]
            pair: tuple[float, float] = (0.0, 1.0)
            if kind == "CORRID":
                datatype = _wire(c.data_type)
            elif len(c.int32_false_true) == 2:
                datatype = "INT32"
                pair = (float(c.int32_false_true[0]), float(c.int32_false_true[1]))
            elif len(c.fp32_false_true) == 2:
                datatype, pair = "FP32", (c.fp32_false_true[0], c.fp32_false_true[1])
            else:
                datatype = "BOOL"
                pair = (float(c.bool_false_true[0]), float(c.bool_false_true[1]))
            controls.append(
                ControlSpec(
                    name=ci.name,
                    kind=kind,
                    datatype=datatype,
                    false_value=pair[0],
                    true_value=pair[1],
                )
            )
    return tuple(controls)


def _state_specs(seq: mc.ModelSequenceBatching, model_dir: Path) -> tuple[StateSpec, ...]:
    """The implicit states; ``initial_state`` data files live in ``<model dir>/initial_state/``."""
    states = []
    for st in seq.state:
        initial: Literal["none", "zero", "file"] = "none"
        data_file = ""
        if st.initial_state:
            first = st.initial_state[0]
            if first.WhichOneof("state_data") == "data_file":
                initial = "file"
                data_file = str(model_dir / "initial_state" / first.data_file)
            elif first.WhichOneof("state_data") == "zero_data":
                initial = "zero"
        states.append(
            StateSpec(
                input_name=st.input_name,
                output_name=st.output_name,
                datatype=_wire(st.data_type),
                dims=tuple(int(d) for d in st.dims),
                initial=initial,
                data_file=data_file,
            )
        )
    return tuple(states)


def _sequence_spec(cfg: mc.ModelConfig, model_dir: Path) -> SequenceSpec:
    """``sequence_batching`` (already validated and normalised) as the scheduler's and the
    worker's spec."""
    seq = cfg.sequence_batching
    controls = _control_specs(seq)
    states = _state_specs(seq, model_dir)
    idle_us = int(seq.max_sequence_idle_microseconds)
    if seq.WhichOneof("strategy_choice") == "oldest":
        o = seq.oldest
        return SequenceSpec(
            strategy="oldest",
            max_sequence_idle_us=idle_us,
            controls=controls,
            states=states,
            max_queue_delay_us=int(o.max_queue_delay_microseconds),
            max_candidate_sequences=int(o.max_candidate_sequences),
            preferred_batch_sizes=tuple(int(b) for b in o.preferred_batch_size),
            preserve_ordering=bool(o.preserve_ordering),
            iterative=bool(seq.iterative_sequence),
        )
    d = seq.direct
    return SequenceSpec(
        strategy="direct",
        max_sequence_idle_us=idle_us,
        controls=controls,
        states=states,
        max_queue_delay_us=int(d.max_queue_delay_microseconds),
        minimum_slot_utilization=float(d.minimum_slot_utilization),
        iterative=bool(seq.iterative_sequence),
    )
