"""Ensembles: the step graph of one ensemble, and dependencies between ensembles.

``validate_ensemble_scheduling`` is core ``ValidateEnsembleSchedulingConfig``
(model_config_utils.cc / ensemble_utils.cc): placement rules and the data flow of the
steps. ``ensemble_failures`` is what the repository load adds once every model is loaded
(model_repository_manager.cc): an ensemble whose steps name a missing or failed model
fails, and ensembles that depend on each other in a cycle fail. Both are pure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field

from triton_mp._proto import model_config_pb2
from triton_mp.common.errors import ConfigError

__all__ = [
    "ENSEMBLE_PLATFORM",
    "ensemble_failures",
    "validate_ensemble_config",
    "validate_ensemble_scheduling",
]

ENSEMBLE_PLATFORM = "ensemble"
"""Triton's platform of an ensemble (core constants.h ``kEnsemblePlatform``)."""


def validate_ensemble_scheduling(config: model_config_pb2.ModelConfig) -> None:
    """ValidateEnsembleSchedulingConfig: placement rules and the data flow of the steps.

    Raises:
        ConfigError: the first rule broken, with Triton's message.
    """
    name = config.name
    _check_placement(config)
    graph = _step_graph(config)
    for model_input in config.input:
        if model_input.name not in graph.written:
            raise ConfigError(
                f"ensemble input '{model_input.name}' for ensemble {name}' is not used"
            )
    ready = graph.reachable_from([model_input.name for model_input in config.input])
    outputs_seen: set[str] = set()
    for model_output in config.output:
        tensor = model_output.name
        if tensor not in graph.written:
            raise ConfigError(f"ensemble output '{tensor}' for ensemble {name}' is not used")
        if tensor not in ready:
            message = f"output '{tensor}' for ensemble '{name}' is not written"
            source = graph.first_unready_source(tensor, ready)
            if source != tensor:
                message += f": at least one of its depending tensors, '{source}', is not connected"
            raise ConfigError(message)
        outputs_seen.add(tensor)
    for tensor in sorted(graph.written):
        if tensor in outputs_seen:
            continue
        if tensor not in ready or not graph.nxt[tensor]:
            raise ConfigError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _check_placement(config: model_config_pb2.ModelConfig) -> None:
    """What an ensemble may not have (instances, optimization, warmup) and must (steps)."""
    name = config.name
    if config.platform != ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}"
        )
    if config.instance_group:
        raise ConfigError(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise ConfigError(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise ConfigError(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise ConfigError(f"must specify 'step' for ensemble '{name}'")


@dataclass
class _StepGraph:
    """The ensemble's tensors as a graph: a step's outputs depend on all of its inputs.

    Attributes:
        written: tensor -> whether some step's output_map writes it.
        prev: tensor -> the tensors it depends on (the inputs of the step writing it).
        nxt: tensor -> the tensors depending on it.
    """

    written: dict[str, bool] = field(default_factory=dict)
    prev: dict[str, list[str]] = field(default_factory=dict)
    nxt: dict[str, list[str]] = field(default_factory=dict)

    def reachable_from(self, sources: Sequence[str]) -> set[str]:
        """The tensors computable from ``sources`` (known tensors), breadth first."""
        ready = set(sources)
        queue = list(sources)
        while queue:
            node = queue.pop(0)
            for candidate in self.nxt[node]:
                if candidate not in ready and all(p in ready for p in self.prev[candidate]):
                    ready.add(candidate)
                    queue.append(candidate)
        return ready

    def first_unready_source(self, tensor: str, ready: set[str]) -> str:
        """The furthest tensor upstream of ``tensor`` that is not ready (Triton's hint)."""
        last = tensor
        seen: set[str] = set()
        nodes = self.prev[tensor]
        while nodes:
            following: list[str] = []
            for node in nodes:
                if node not in ready and node not in seen:
                    seen.add(node)
                    last = node
                    following = self.prev[node]
                    break
            nodes = following
        return last


def _step_graph(config: model_config_pb2.ModelConfig) -> _StepGraph:
    """Build the graph of the steps, checking each step's fields and single writers.

    Raises:
        ConfigError: a step lacks model_name/input_map/output_map, or two steps write one
            tensor.
    """
    name = config.name
    graph = _StepGraph()
    for index, step in enumerate(config.ensemble_scheduling.step):
        for field_name in ("model_name", "input_map", "output_map"):
            if not getattr(step, field_name):
                raise ConfigError(
                    f"must specify '{field_name}' in step {index} of ensemble '{name}'"
                )
        outputs: list[str] = []
        for tensor in step.output_map.values():
            if graph.written.get(tensor):
                raise ConfigError(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}"
                )
            graph.written[tensor] = True
            graph.prev.setdefault(tensor, [])
            graph.nxt.setdefault(tensor, [])
            outputs.append(tensor)
        # NOTE: input_map is a proto map, so a model input cannot be mapped twice here.
        for tensor in step.input_map.values():
            graph.written.setdefault(tensor, False)
            graph.prev.setdefault(tensor, [])
            graph.nxt.setdefault(tensor, [])
            for out in outputs:
                graph.prev[out].append(tensor)
                graph.nxt[tensor].append(out)
    return graph


def ensemble_failures(
    ensembles: Mapping[str, Sequence[str]], present: Set[str], failed: Set[str]
) -> dict[str, str]:
    """Which ensembles fail once the whole repository is loaded, and why.

    Cycles first (reported on every ensemble that lies on one), then availability to a
    fixpoint: an ensemble of a failed ensemble fails too. Ensembles are judged in the
    order of ``ensembles``.

    Args:
        ensembles: every model whose config is an ensemble (failed or not) -> its steps'
            model names, in repository order.
        present: the names of every model of the repository.
        failed: the models that failed to load on their own.

    Returns:
        ensemble name -> reason ("circular dependency between ensembles: a -> b -> a", or
        "ensemble <m> contains models that are not available: x, y"), in the order found.
    """
    reasons: dict[str, str] = {}
    for name in ensembles:
        if name in failed:
            continue
        cycle = _find_cycle(name, ensembles)
        if cycle is not None:
            reasons[name] = "circular dependency between ensembles: " + " -> ".join(cycle)
    bad = set(failed) | set(reasons)
    changed = True
    while changed:
        changed = False
        for name, steps in ensembles.items():
            if name in bad:
                continue
            missing = sorted({step for step in steps if step not in present or step in bad})
            if missing:
                reasons[name] = (
                    f"ensemble {name} contains models that are not available: " + ", ".join(missing)
                )
                bad.add(name)
                changed = True
    return reasons


def _find_cycle(start: str, ensembles: Mapping[str, Sequence[str]]) -> list[str] | None:
    """Return ``[start, ..., start]`` if ``start`` reaches itself through ensemble steps."""
    stack: list[tuple[str, Iterator[str]]] = [(start, iter(ensembles[start]))]
    path = [start]
    seen = {start}
    while stack:
        _, children = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            path.pop()
            continue
        if child == start:
            return [*path, start]
        if child in seen or child not in ensembles:
            continue
        seen.add(child)
        path.append(child)
        stack.append((child, iter(ensembles[child])))
    return None


@dataclass
class _Tensor:
    """An ensemble tensor as ``ValidateEnsembleConfig`` sees it (``TensorNode``)."""

    model: str
    data_type: int = 0
    dims: tuple[int, ...] = ()
    full_dims: tuple[int, ...] = ()
    decoupled: bool = False
    label: int = 0
    visited: bool = False
    prev: list[_Tensor] = field(default_factory=list)
    nxt: list[_Tensor] = field(default_factory=list)
    sibling: _Tensor | None = None


def _node(model: str, batching: bool, data_type: int, dims: Sequence[int]) -> _Tensor:
    shape = tuple(int(d) for d in dims)
    return _Tensor(model, data_type, shape, (-1, *shape) if batching else shape)


def _dims_match(a: Sequence[int], b: Sequence[int]) -> bool:
    """``CompareDimsWithWildcard``: same rank, each dim equal or either one -1."""
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _dims_text(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _consistent(lhs: _Tensor, rhs: _Tensor, prefix: str) -> None:
    """``ValidateTensorConsistency``: same data type, and shapes that agree."""
    if lhs.data_type != rhs.data_type:
        raise ConfigError(
            f"{prefix}inconsistent data type: {_type_name(lhs.data_type)} is inferred from model "
            f"{lhs.model} while {_type_name(rhs.data_type)} is inferred from model {rhs.model}"
        )
    if not _dims_match(lhs.dims, rhs.dims) and not _dims_match(lhs.full_dims, rhs.full_dims):
        raise ConfigError(
            f"{prefix}inconsistent shape: {_dims_text(lhs.full_dims)} is inferred from model "
            f"{lhs.model} while {_dims_text(rhs.full_dims)} is inferred from model {rhs.model}"
        )


def _type_name(data_type: int) -> str:
    return model_config_pb2.DataType.Name(data_type)


def validate_ensemble_config(
    config: model_config_pb2.ModelConfig, composing: Mapping[str, model_config_pb2.ModelConfig]
) -> bool:
    """Core ``ValidateEnsembleConfig`` (ensemble_utils.cc), once the composing models are
    loaded: every step against its model's completed config, then the decoupled data flow.

    Args:
        config: the ensemble's config (``validate_ensemble_scheduling`` passed).
        composing: the completed config of every model its steps name.

    Returns:
        Whether the ensemble is decoupled (a decoupled model lies on its data path): Triton
        sets ``model_transaction_policy.decoupled`` of the ensemble to it.

    Raises:
        ConfigError: the first rule broken, with Triton's message.
    """
    name = config.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _Tensor] = {}
    for t in config.input:
        dims = t.reshape.shape if t.HasField("reshape") else t.dims
        tensors[t.name] = _node(name, batching, t.data_type, dims)
    for o in config.output:
        dims = o.reshape.shape if o.HasField("reshape") else o.dims
        tensors.setdefault(o.name, _node(name, batching, o.data_type, dims))
    for step in config.ensemble_scheduling.step:
        model = composing[step.model_name]
        if model.max_batch_size != 0 and model.max_batch_size < config.max_batch_size:
            raise ConfigError(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {step.model_name} which only allows maximum batch size to be "
                f"{model.max_batch_size}"
            )
        _check_step_mapping(name, step, model, tensors)
    return _decoupled_flow(name, config, tensors)


def _check_step_mapping(
    name: str,
    step: model_config_pb2.ModelEnsembling.Step,
    model: model_config_pb2.ModelConfig,
    tensors: dict[str, _Tensor],
) -> None:
    """``ValidateTensorMapping``: one step's maps against its model's inputs and outputs."""
    step_id = step.model_name
    batching = model.max_batch_size > 0
    inputs = {t.name for t in model.input}
    for model_input, tensor in step.input_map.items():
        if model_input not in inputs:
            raise ConfigError(
                f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input "
                f"{model_input} in model {step_id}"
            )
    for t in model.input:
        if t.name not in step.input_map:
            if t.optional:
                continue
            raise ConfigError(
                f"in ensemble {name}, input {t.name} in model {step_id} is not mapped to any "
                "ensemble tensors"
            )
        tensor = step.input_map[t.name]
        node = _node(step_id, batching, t.data_type, t.dims)
        if tensor in tensors:
            _consistent(tensors[tensor], node, f"in ensemble {name}, ensemble tensor {tensor}: ")
        else:
            tensors[tensor] = node
    outputs = {t.name: t for t in model.output}
    for model_output, tensor in step.output_map.items():
        if model_output not in outputs:
            raise ConfigError(
                f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output "
                f"{model_output} in model {step_id}"
            )
    sibling = _Tensor(step_id)
    for model_output, tensor in step.output_map.items():
        out = outputs[model_output]
        node = _node(step_id, batching, out.data_type, out.dims)
        if tensor in tensors:
            _consistent(tensors[tensor], node, f"in ensemble {name}, ensemble tensor {tensor}: ")
        else:
            tensors[tensor] = node
        tensors[tensor].sibling = sibling
    decoupled = bool(model.model_transaction_policy.decoupled)
    for tensor in step.output_map.values():
        node = tensors[tensor]
        node.decoupled = decoupled
        for source in step.input_map.values():
            node.prev.append(tensors[source])
            tensors[source].nxt.append(node)


def _decoupled_flow(
    name: str, config: model_config_pb2.ModelConfig, tensors: dict[str, _Tensor]
) -> bool:
    """Label each tensor with the decoupled step it descends from; a step may not take
    inputs descending from different decoupled models. Returns whether any is decoupled."""
    label = 0
    queue = []
    for t in config.input:
        node = tensors[t.name]
        node.visited = True
        queue.append(node)
    while queue:
        current = queue.pop(0)
        for node in current.nxt:
            if node.visited or not all(p.visited for p in node.prev):
                continue
            first = node.prev[0].label
            if any(p.label != first for p in node.prev):
                raise ConfigError(
                    f"in ensemble {name}, step of model '{node.model}' receives inputs "
                    "originated from different decoupled models"
                )
            sibling = node.sibling
            if sibling is not None and sibling.visited:
                node.label = sibling.label
            else:
                if node.decoupled:
                    label += 1
                    node.label = label
                else:
                    node.label = first
                if sibling is not None:
                    sibling.label, sibling.visited = node.label, True
            node.visited = True
            queue.append(node)
    return label != 0
