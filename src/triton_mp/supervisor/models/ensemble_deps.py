"""Ensembles and the models they compose, as model control needs them (pure).

Triton's model repository manager (``model_repository_manager.cc``) keeps a dependency
graph: loading an ensemble polls its composing models too (the "polling chain"), an
ensemble is checked against its composing models' completed configs once they are loaded
(``ValidateEnsembleConfig``, ``model_config.ensemble.validate_ensemble_config``), and an
ensemble whose composing model goes away stops being served. ``supervisor.models.model_control``
calls these functions; none of them starts, stops or reads anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ConfigError, ErrorCode
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.model_config.ensemble import validate_ensemble_config


def steps_of(config: mc.ModelConfig | None) -> list[str]:
    """The model names an ensemble's steps call, in order, without repeats ([] otherwise)."""
    if config is None or not config.HasField("ensemble_scheduling"):
        return []
    return list(dict.fromkeys(s.model_name for s in config.ensemble_scheduling.step))


def composing_to_load(staged: Mapping[str, mc.ModelConfig | None]) -> list[str]:
    """The composing models of the staged ensembles that are not staged themselves, served
    or not (Triton's polling chain, core ``PollModels``: loading an ensemble polls them all
    again, so a served one whose files changed since is reloaded with it)."""
    out: list[str] = []
    for config in staged.values():
        for name in steps_of(config):
            if name not in staged and name not in out:
                out.append(name)
    return out


def unused_steps(
    unloaded: Mapping[str, mc.ModelConfig],
    served: Mapping[str, mc.ModelConfig],
    orphans: Mapping[str, Iterable[str]],
    by_name: Iterable[str],
) -> list[str]:
    """RepositoryModelUnload's ``unload_dependents``: the composing models to unload with
    the ``unloaded`` ensembles, in order (core ``DependencyGraph::RemoveNodes`` with
    cascading removal: a composing model goes when it was not loaded by name and no
    ensemble left calls it; then its own composing models are looked at, and so on).

    Args:
        unloaded: the ensembles unloaded by name, with their configs.
        served: the completed configs of the models that serve now.
        orphans: the ensembles waiting for their composing models to serve again (they
            still call them) -> the models their steps call.
        by_name: the models loaded by name (RepositoryModelLoad, ``--load-model``) since
            their last unload: those stay.
    """
    callers: dict[str, set[str]] = {}
    for name, config in served.items():
        for step in steps_of(config):
            callers.setdefault(step, set()).add(name)
    for name, steps in orphans.items():
        for step in steps:
            callers.setdefault(step, set()).add(name)
    kept, gone = set(by_name), set(unloaded)
    todo = [step for config in unloaded.values() for step in steps_of(config)]
    out: list[str] = []
    while todo:
        name = todo.pop(0)
        if name in gone or name in kept or name not in served:
            continue
        if callers.get(name, set()) - gone:
            continue
        gone.add(name)
        out.append(name)
        todo.extend(steps_of(served[name]))
    return out


def check_ensembles(
    staged: Mapping[str, mc.ModelConfig],
    failed: Mapping[str, str],
    served: Mapping[str, mc.ModelConfig],
) -> dict[str, str]:
    """Check every staged ensemble against its composing models, in dependency order; sets
    ``model_transaction_policy.decoupled`` of each one that passes (as Triton does).

    Args:
        staged: the models of this load that read and validated, by name.
        failed: the models of this load that did not, and why.
        served: the completed configs of the models that serve now.

    Returns:
        ensemble name -> why it cannot load (Triton's messages).
    """
    reasons: dict[str, str] = {}
    pending = [n for n, c in staged.items() if steps_of(c)]
    done: set[str] = set()
    while pending:
        progressed = False
        for name in list(pending):
            steps = steps_of(staged[name])
            waiting = [s for s in steps if s in pending and s != name]
            if waiting:
                continue
            pending.remove(name)
            progressed = True
            reason = _reason(name, steps, staged, failed, served, reasons)
            if not reason:
                configs = {s: staged[s] if s in staged else served[s] for s in steps}
                try:
                    decoupled = validate_ensemble_config(staged[name], configs)
                except ConfigError as e:
                    reason = e.message
                else:
                    staged[name].model_transaction_policy.decoupled = decoupled
            if reason:
                reasons[name] = reason
            done.add(name)
        if not progressed:
            cycle = " -> ".join([*pending, pending[0]])
            for name in pending:
                reasons[name] = f"circular dependency between ensembles: {cycle}"
            break
    return reasons


def _reason(
    name: str,
    steps: list[str],
    staged: Mapping[str, mc.ModelConfig],
    failed: Mapping[str, str],
    served: Mapping[str, mc.ModelConfig],
    reasons: Mapping[str, str],
) -> str:
    """Why an ensemble's composing models do not allow it to load ("" when they do)."""
    missing = []
    for step in steps:
        why = failed.get(step) or reasons.get(step)
        if why is not None:
            return (
                f"ensemble '{name}' depends on '{step}' which is not valid. Model '{step}' "
                f"failed with error: {why}"
            )
        if step not in staged and step not in served:
            missing.append(step)
    if missing:
        return f"ensemble {name} contains models that are not available: " + ", ".join(missing)
    return ""


def dependents(names: Iterable[str], served: Mapping[str, mc.ModelConfig]) -> list[str]:
    """The served ensembles that call any of ``names``, directly or through other
    ensembles (sorted)."""
    gone = set(names)
    out: set[str] = set()
    changed = True
    while changed:
        changed = False
        for ensemble, config in served.items():
            if ensemble in gone or ensemble in out:
                continue
            if any(step in gone or step in out for step in steps_of(config)):
                out.add(ensemble)
                changed = True
    return sorted(out)


def broken_dependents(
    loaded: Iterable[str], served: Mapping[str, mc.ModelConfig]
) -> dict[str, str]:
    """The served ensembles that call a model of ``loaded`` (directly or through other
    ensembles) and no longer validate against what serves now, with why (Triton's messages):
    after a load, 2.51's repository manager checks the loaded models' dependents again
    (``ValidateEnsembleConfig``) and unloads those that fail. ``served`` holds the configs
    that serve now (the loaded ones' new configs among them); those of the dependents are
    changed (``check_ensembles`` sets their ``decoupled``)."""
    names = set(loaded)
    deps = [d for d in dependents(names, served) if d not in names]
    if not deps:
        return {}
    staged = {d: served[d] for d in deps}
    return check_ensembles(staged, {}, {n: c for n, c in served.items() if n not in staged})


def reloadable(orphans: Mapping[str, Iterable[str]], serving: Iterable[str]) -> list[str]:
    """The ensembles a composing model's unload took down whose composing models all serve
    again (sorted): Triton 2.51's dependency graph loads such an ensemble again when the
    last of them loads (an ensemble unloaded by name stays unloaded).

    Args:
        orphans: ensemble -> the models its steps call.
        serving: the models with a version that serves now.
    """
    have = set(serving)
    return sorted(name for name, steps in orphans.items() if have.issuperset(steps))


def ensemble_load_failure(name: str, why: str) -> ErrorInfo:
    """The answer to a load of an ensemble its checks refused (``CheckNode`` and
    ``ValidateEnsembleConfig`` set the node's status; ``LoadModel`` answers it as
    "load failed for model '<name>': <why>" and a newline, INVALID_ARG)."""
    return ErrorInfo(ErrorCode.INVALID_ARG, f"load failed for model '{name}': {why}\n")


def composing_failure(
    name: str, config: mc.ModelConfig | None, versions: Mapping[str, Iterable[int]]
) -> str:
    """Why an ensemble cannot serve once its composing models' loads ended ("" when it can):
    a step's model has no loaded version, or not the version the step names (Triton's
    ``CheckNode``).

    Args:
        versions: model -> its versions that serve now.
    """
    if config is None:
        return ""
    for step in config.ensemble_scheduling.step:
        served = set(versions.get(step.model_name, ()))
        if not served:
            return f"ensemble '{name}' depends on '{step.model_name}' which has no loaded version."
        if step.model_version != -1 and step.model_version not in served:
            return (
                f"ensemble '{name}' depends on '{step.model_name}' whose required version "
                f"{step.model_version} is not loaded."
            )
    return ""
