"""What a model's config asks of onnxruntime: session and run options, execution providers.

Pure (``session_settings``: the config's JSON form -> ``SessionSettings``) plus one small
step that builds onnxruntime's objects from it (``build``). Imported by the onnxruntime
backend in worker processes. Names, values and messages follow Triton's onnxruntime backend
(``src/onnxruntime.cc``, ModelState::ModelState and LoadModel):

- ``optimization.graph.level``: -1 ORT_ENABLE_BASIC, 1 ORT_ENABLE_EXTENDED, 2 ORT_DISABLE_ALL,
  anything else ORT_ENABLE_ALL (onnxruntime's default);
- ``parameters`` (string values): ``execution_mode`` 0 sequential / 1 parallel,
  ``intra_op_thread_count`` and ``inter_op_thread_count`` (0 = onnxruntime's default),
  ``enable_mem_arena`` and ``enable_mem_pattern`` (booleans),
  ``memory.enable_memory_arena_shrinkage`` (a run option), and any ``session.*`` key as a
  session config entry;
- ``optimization.execution_accelerators``: ``cpu_execution_accelerator`` ``openvino``,
  ``gpu_execution_accelerator`` ``tensorrt`` and ``cuda``, each needing its onnxruntime
  execution provider; any other name is Triton's "unknown Execution Accelerator". Where this
  host's onnxruntime lacks the provider the load is refused, never silently run without it.
  Triton applies GPU accelerators to GPU instances only; a KIND_CPU instance ignores them,
  with a warning here;
- ``model_operations.op_library_filename``: custom-op libraries registered on the session.

Without ``intra_op_thread_count`` the intra-op pool follows the cores the instance may use:
the host policy's ``cpu-cores`` when it has some, else every usable core but one
(``default_intra_op_threads``: the frontend feeding the instance needs one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from triton_mp.common.errors import ConfigError

__all__ = ["SessionSettings", "default_intra_op_threads", "session_settings"]

GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
"""``optimization.graph.level`` -> ``onnxruntime.GraphOptimizationLevel`` member name; any
other level is ``ORT_ENABLE_ALL``."""

CPU_ACCELERATORS = {"openvino": "OpenVINOExecutionProvider"}
GPU_ACCELERATORS = {"tensorrt": "TensorrtExecutionProvider", "cuda": "CUDAExecutionProvider"}
"""Triton's accelerator names -> the onnxruntime execution provider each needs."""

_TRUE = {"true", "1", "on", "yes"}
_FALSE = {"false", "0", "off", "no"}


def default_intra_op_threads() -> int:
    """Intra-op threads of a CPU session whose config does not set ``intra_op_thread_count``
    and whose instance is not pinned: the cores this process may run on, less one for the
    frontend (at least 1)."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


@dataclass(frozen=True)
class SessionSettings:
    """The onnxruntime settings of one instance (what ``build`` turns into objects).

    Attributes:
        graph_level: ``GraphOptimizationLevel`` member name.
        parallel: ``ExecutionMode.ORT_PARALLEL`` (else sequential).
        intra_op_threads, inter_op_threads: pool sizes; 0 = onnxruntime's default.
        mem_arena, mem_pattern: ``enable_cpu_mem_arena`` / ``enable_mem_pattern``; None
            leaves onnxruntime's default.
        session_entries: ``SessionOptions.add_session_config_entry`` pairs.
        run_entries: ``RunOptions.add_run_config_entry`` pairs.
        providers: execution providers in priority order (CPU last).
        op_libraries: custom-op shared libraries to register.
        warnings: sentences for the load log (settings ignored as Triton ignores them).
    """

    graph_level: str = "ORT_ENABLE_ALL"
    parallel: bool = False
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    mem_arena: bool | None = None
    mem_pattern: bool | None = None
    session_entries: dict[str, str] = field(default_factory=dict)
    run_entries: dict[str, str] = field(default_factory=dict)
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    op_libraries: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def _string(params: dict[str, Any], key: str) -> str | None:
    entry = params.get(key)
    if isinstance(entry, dict) and "string_value" in entry:
        return str(entry["string_value"])
    return None


def _int(params: dict[str, Any], key: str) -> int | None:
    text = _string(params, key)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise ConfigError(f"failed to convert '{key}' value '{text}' to integral number") from None


def _bool(params: dict[str, Any], key: str) -> bool | None:
    text = _string(params, key)
    if text is None:
        return None
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(f"failed to convert '{key}' value '{text}' to boolean")


def _accelerators(
    config: dict[str, Any], kind: str, available: tuple[str, ...], model: str
) -> tuple[tuple[str, ...], list[str]]:
    """The execution providers the config's accelerators add, and the warnings."""
    eas = config.get("optimization", {}).get("execution_accelerators", {})
    providers: list[str] = []
    warnings: list[str] = []
    for group, table in (
        ("gpu_execution_accelerator", GPU_ACCELERATORS),
        ("cpu_execution_accelerator", CPU_ACCELERATORS),
    ):
        for ea in eas.get(group, []):
            name = str(ea.get("name", ""))
            provider = table.get(name)
            if provider is None:
                raise ConfigError(f"unknown Execution Accelerator '{name}' is requested")
            if provider not in available:
                raise ConfigError(
                    f"model '{model}' requests the '{name}' execution accelerator "
                    f"({group}), which this host cannot provide: onnxruntime here has no "
                    f"{provider} (it has {', '.join(available)})"
                )
            if group == "gpu_execution_accelerator" and kind != "KIND_GPU":
                warnings.append(
                    f"optimization.execution_accelerators.{group} '{name}' applies to "
                    f"KIND_GPU instances only (as in Triton); this {kind} instance runs "
                    "without it"
                )
                continue
            if provider not in providers:
                providers.append(provider)
    return tuple(providers), warnings


def session_settings(
    config: dict[str, Any],
    model: str,
    kind: str,
    cpu_cores: tuple[int, ...],
    available: tuple[str, ...],
    default_threads: int,
) -> SessionSettings:
    """The onnxruntime settings one instance of a model gets.

    Args:
        config: the model's effective config in Triton's JSON form.
        model: the model name (for messages).
        kind: the instance's kind (``KIND_CPU``, ``KIND_GPU``, ``KIND_MODEL``).
        cpu_cores: the instance's host policy cores (empty: not pinned).
        available: ``onnxruntime.get_available_providers()``.
        default_threads: intra-op threads of an unpinned instance without
            ``intra_op_thread_count`` (``default_intra_op_threads()``).

    Raises:
        ConfigError: a parameter value Triton's backend refuses, an unknown accelerator,
            or one this host's onnxruntime cannot provide.
    """
    params: dict[str, Any] = config.get("parameters", {}) or {}
    level = int(config.get("optimization", {}).get("graph", {}).get("level", 0) or 0)
    mode = _int(params, "execution_mode") or 0
    if mode not in (0, 1):
        raise ConfigError(
            "Invalid configuration value provided. Expected values for  execution_mode are "
            f"0 or 1 but got {mode} ."
        )
    intra = _int(params, "intra_op_thread_count")
    if intra is None:
        intra = len(cpu_cores) if cpu_cores else default_threads
    session_entries = {
        "session.intra_op.allow_spinning": "0",
        "session.inter_op.allow_spinning": "0",
    }
    for key in params:
        if key.startswith("session."):
            session_entries[key] = _string(params, key) or ""
    run_entries = {}
    shrink = _string(params, "memory.enable_memory_arena_shrinkage")
    if shrink is not None:
        run_entries["memory.enable_memory_arena_shrinkage"] = shrink
    accel, warnings = _accelerators(config, kind, available, model)
    providers = list(accel)
    cuda = "CUDAExecutionProvider"
    if kind == "KIND_GPU" and cuda in available and cuda not in providers:
        providers.append(cuda)
    providers.append("CPUExecutionProvider")
    ops = config.get("model_operations", {}).get("op_library_filename", [])
    return SessionSettings(
        graph_level=GRAPH_LEVELS.get(level, "ORT_ENABLE_ALL"),
        parallel=mode == 1,
        intra_op_threads=max(0, intra),
        inter_op_threads=max(0, _int(params, "inter_op_thread_count") or 0),
        mem_arena=_bool(params, "enable_mem_arena"),
        mem_pattern=_bool(params, "enable_mem_pattern"),
        session_entries=session_entries,
        run_entries=run_entries,
        providers=tuple(providers),
        op_libraries=tuple(str(o) for o in ops),
        warnings=tuple(warnings),
    )


def build(settings: SessionSettings) -> tuple[Any, Any]:
    """onnxruntime ``(SessionOptions, RunOptions)`` for ``settings``.

    Raises:
        onnxruntime exceptions: a custom-op library that cannot be loaded.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, settings.graph_level)
    opts.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if settings.parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    opts.intra_op_num_threads = settings.intra_op_threads
    opts.inter_op_num_threads = settings.inter_op_threads
    if settings.mem_arena is not None:
        opts.enable_cpu_mem_arena = settings.mem_arena
    if settings.mem_pattern is not None:
        opts.enable_mem_pattern = settings.mem_pattern
    for key, value in settings.session_entries.items():
        opts.add_session_config_entry(key, value)
    for lib in settings.op_libraries:
        opts.register_custom_ops_library(lib)
    run = ort.RunOptions()
    for key, value in settings.run_entries.items():
        run.add_run_config_entry(key, value)
    return opts, run
