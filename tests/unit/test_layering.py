"""The process roles stay separated: which modules may import what (STYLE.md, design notes).

Checked on the source with ``ast`` (no imports executed):
- the batching core (scheduler clock, the policy contract, the queues and every policy)
  imports no ipc, grpc, numpy or backend, directly or through what it imports;
- ``ipc`` imports nothing from the role packages;
- only ``frontend`` imports grpc or aiohttp (and ``cli/admin_client``, the ``stat`` client,
  grpc); the frontend's transport-free core (everything but its ``grpc/`` and ``http/``
  adapters, ``kserve``, ``metrics.endpoint`` and ``main``) imports neither, nor protobuf, nor any
  wire proto, nor an adapter; the HTTP codec is testable on bytes (no aiohttp);
- only ``backends`` import onnxruntime or tensorrt, and backends and ``model_config`` import
  no process role;
- in the scheduler package only the modules that speak messages (the ``main`` shell, the
  ``core``, its ``lifecycle``, ``outbox``, ``instances``, ``status`` views, ``stats`` and the
  spec-reading ``registry``) touch ``triton_mp.ipc``;
- only ``common.process.platform`` calls prctl or sets process titles;
- in the supervisor, ``processes`` (children, wiring, instances) imports no model control;
- no import cycle among ``triton_mp``'s modules, nor among its packages, counting imports
  inside functions and under ``TYPE_CHECKING``;
- the scheduler process (spawn target plus entry point) loads no numpy, protobuf, backend
  or model loader (run in a subprocess).
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "src" / "triton_mp"


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for every test of this file."""
    return ast.parse(path.read_text())


def _imports(path: Path) -> set[str]:
    tree = _tree(path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def _modules(sub: str = "") -> list[Path]:
    root = PKG / sub if sub else PKG
    return sorted(p for p in root.rglob("*.py") if "_proto" not in p.parts)


def _uses(imports: set[str], prefix: str) -> bool:
    return any(i == prefix or i.startswith(prefix + ".") for i in imports)


BATCHING_CORE = sorted(
    str(p.relative_to(PKG)) for p in (PKG / "scheduler" / "policies").glob("*.py")
)
"""The pure batching core: policies and what they are made of (``scheduler.policies.policy``)."""
SCHEDULER_IPC_MODULES = {
    "main.py",
    "core.py",
    "batch_end.py",  # NOTE: the core's BatchDone handler, moved out of core.py
    "direct.py",
    "ensembles.py",
    "ensemble_tensors.py",  # NOTE: ensembles.py's tensors and blocks as messages, moved out
    "lifecycle.py",
    "outbox.py",
    "instances.py",
    "status.py",
    "stats.py",
    "registry.py",
    "queries.py",
    "request_wakeups.py",  # NOTE: the frontend rings' quiet word: its bits are ipc's
    "forming.py",  # NOTE: the frontend rings' forming words: their buckets are ipc's
    "pass_words.py",  # NOTE: both words above in one walk (walk_words)
    "plain_requests.py",  # NOTE: queues request records (ipc.recordio.records) as they are
    "cancels.py",  # NOTE: the core's CancelRequest handler, moved out of core.py
    "assign_push.py",  # NOTE: the shell's send of a BatchAssign into its worker's Ring, in C
}


def test_the_batching_core_lists_every_policy() -> None:
    assert "scheduler/policies/policy.py" in BATCHING_CORE
    assert "scheduler/policies/queues.py" in BATCHING_CORE
    assert "scheduler/policies/dynamic.py" in BATCHING_CORE
    assert "scheduler/policies/sequence.py" in BATCHING_CORE
    assert "scheduler/policies/default.py" in BATCHING_CORE


@pytest.mark.parametrize("module", BATCHING_CORE)
def test_batching_core_is_pure(module: str) -> None:
    imports = _imports(PKG / module)
    for banned in ("triton_mp.ipc", "grpc", "numpy", "onnxruntime", "posix_ipc", "time"):
        assert not _uses(imports, banned) or (banned == "time" and module.endswith("clock.py")), (
            f"{module} imports {banned}"
        )
    in_scheduler = {i for i in imports if i.startswith("triton_mp.scheduler.")}
    for dep in in_scheduler:
        path = PKG / (dep.removeprefix("triton_mp.").replace(".", "/") + ".py")
        assert str(path.relative_to(PKG)) in BATCHING_CORE, f"{module} imports {dep}"


def test_batching_core_loads_no_ipc_when_imported() -> None:
    """What the core imports, transitively (package ``__init__`` files included), stays pure."""
    import subprocess
    import sys

    mods = [
        "triton_mp." + m.removesuffix(".py").replace("/", ".")
        for m in BATCHING_CORE
        if not m.endswith("__init__.py")
    ]
    code = (
        f"import sys, {', '.join(mods)};"
        "print(','.join(m for m in sys.modules if m.split('.')[0] in "
        "('posix_ipc', 'numpy', 'grpc', 'msgspec') or m.startswith('triton_mp.ipc')))"
    )
    env = {**os.environ, "PYTHONPATH": str(PKG.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == ""


def test_ipc_imports_no_role_package() -> None:
    for path in _modules("ipc"):
        imports = _imports(path)
        for role in ("frontend", "scheduler", "workers", "supervisor"):
            assert not _uses(imports, f"triton_mp.{role}"), f"{path.name} imports {role}"


GRPC_CLIENTS = {PKG / "cli" / "admin_client.py"}
"""Modules outside the frontend that may import grpc: the client of ``triton-mp stat``."""


def test_only_frontend_imports_grpc() -> None:
    for path in _modules():
        if "frontend" in path.parts or path in GRPC_CLIENTS:
            continue
        assert not _uses(_imports(path), "grpc"), f"{path.relative_to(PKG)} imports grpc"


def test_only_frontend_imports_aiohttp() -> None:
    for path in _modules():
        if "frontend" in path.parts:
            continue
        assert not _uses(_imports(path), "aiohttp"), f"{path.relative_to(PKG)} imports aiohttp"


FRONTEND = PKG / "frontend"
FRONTEND_ADAPTERS = ("grpc", "http", "native")
"""The frontend's transport packages (native: the C++ gRPC server and its binding)."""
FRONTEND_SHELL = ("main.py", "metrics/endpoint.py", "kserve.py")
"""Frontend modules outside the core: the process shell, the metrics endpoint (aiohttp) and
the proto forms of the core's answers both transports use."""
CORE_PROTOS = {"triton_mp._proto.model_config_pb2"}
"""The one generated module the core may import: ModelConfig, the model's configuration."""


def _imported_names(path: Path) -> set[str]:
    """Every module ``path`` imports, with ``from a import b`` also counted as ``a.b``."""
    out = _imports(path)
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _frontend_core() -> list[Path]:
    return [
        p
        for p in _modules("frontend")
        if p.relative_to(FRONTEND).parts[0] not in FRONTEND_ADAPTERS
        and p.relative_to(FRONTEND).as_posix() not in FRONTEND_SHELL
    ]


def test_frontend_core_speaks_no_transport() -> None:
    """Requests reach the core as transport-free objects: no grpc, aiohttp or protobuf, and
    no wire proto (the ModelConfig proto is the model's configuration, not a wire form)."""
    core = _frontend_core()
    names = {p.relative_to(FRONTEND).as_posix() for p in core}
    assert {"inference.py", "dispatch/ticket.py", "request.py", "validation/request.py"} <= names
    for path in core:
        rel = path.relative_to(PKG)
        imports = _imported_names(path)
        for banned in ("grpc", "aiohttp", "google.protobuf"):
            assert not _uses(imports, banned), f"{rel} imports {banned}"
        protos = {i for i in imports if i.startswith("triton_mp._proto.")} - CORE_PROTOS
        assert not protos, f"{rel} imports {sorted(protos)}"


def test_frontend_core_imports_no_adapter() -> None:
    """Adapters import the core, never the other way round."""
    adapters = [f"triton_mp.frontend.{a}" for a in FRONTEND_ADAPTERS] + [
        f"triton_mp.frontend.{m.removesuffix('.py').replace('/', '.')}" for m in FRONTEND_SHELL
    ]
    for path in _frontend_core():
        imports = _imported_names(path)
        for adapter in adapters:
            assert not _uses(imports, adapter), f"{path.relative_to(PKG)} imports {adapter}"


@pytest.mark.parametrize("module", ["http/infer_codec.py", "http/json_tensors.py"])
def test_http_codec_has_no_transport(module: str) -> None:
    """The HTTP body codec is testable on bytes: no aiohttp, no grpc."""
    imports = _imported_names(FRONTEND / module)
    for banned in ("grpc", "aiohttp"):
        assert not _uses(imports, banned), f"frontend/{module} imports {banned}"


def test_only_backends_import_backend_libraries() -> None:
    for path in _modules():
        if "backends" in path.parts:
            continue
        imports = _imports(path)
        for lib in ("onnxruntime", "tensorrt", "torch", "pycuda"):
            assert not _uses(imports, lib), f"{path.relative_to(PKG)} imports {lib}"


def test_scheduler_touches_ipc_only_where_it_speaks_messages() -> None:
    for path in _modules("scheduler"):
        if path.parent.name == "scheduler" and path.name in SCHEDULER_IPC_MODULES:
            continue
        assert not _uses(_imports(path), "triton_mp.ipc"), f"scheduler/{path.name} imports ipc"


def test_supervisor_process_loads_neither_grpc_nor_onnxruntime() -> None:
    import subprocess
    import sys

    code = (
        "import sys, triton_mp.cli.main, triton_mp.supervisor.main;"
        "print(','.join(m for m in ('grpc', 'onnxruntime', 'torch') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(PKG.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == ""


def test_only_the_platform_helper_reaches_prctl_and_process_titles() -> None:
    """``common.process.platform`` is the one place that calls prctl and setproctitle."""
    for path in _modules():
        if path.relative_to(PKG).as_posix() == "common/process/platform.py":
            continue
        assert not _uses(_imports(path), "setproctitle"), f"{path.relative_to(PKG)} titles"
        assert ".prctl(" not in path.read_text(), f"{path.relative_to(PKG)} calls prctl"


def test_the_scheduler_process_loads_no_numpy_backend_or_model_config() -> None:
    """What the scheduler process imports (its spawn target, ``supervisor.processes.child_entry``,
    and its entry point, ``scheduler.main``) stays small: no numpy, onnxruntime, grpc, protobuf,
    repository loader or backend, and none of the supervisor's own modules."""
    import subprocess
    import sys

    banned = (
        "numpy",
        "onnxruntime",
        "grpc",
        "google",
        "triton_mp._proto",
        "triton_mp.model_config",
        "triton_mp.backends",
        "triton_mp.supervisor.main",
    )
    code = (
        "import sys, triton_mp.supervisor.processes.child_entry, triton_mp.scheduler.main;"
        f"banned = {banned!r};"
        "print(','.join(m for m in sys.modules if any(m == b or m.startswith(b + '.')"
        " for b in banned)))"
    )
    env = {**os.environ, "PYTHONPATH": str(PKG.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == ""


def test_backends_import_no_role_package() -> None:
    """Workers import backends, never the other way; the loader reaches them by registry."""
    for path in _modules("backends"):
        imports = _imports(path)
        for role in ("frontend", "scheduler", "workers", "supervisor", "model_config", "cli"):
            assert not _uses(imports, f"triton_mp.{role}"), f"backends/{path.name} imports {role}"


def test_supervisor_processes_import_no_model_control() -> None:
    """Inside the supervisor, model control starts and stops processes, never the other way:
    ``supervisor.processes`` imports neither ``supervisor.models`` nor ``supervisor.main``."""
    assert _modules("supervisor/processes"), "supervisor/processes/ has moved"
    for path in _modules("supervisor/processes"):
        imports = _imports(path)
        for other in ("triton_mp.supervisor.models", "triton_mp.supervisor.main"):
            assert not _uses(imports, other), f"supervisor/processes/{path.name} imports {other}"


def test_analyze_sweep_is_pure() -> None:
    """``analyze.sweep`` (configurations, results, search, constraints) imports no I/O: not
    ``analyze.probe``, not the shell modules over it, no subprocess or HTTP client."""
    assert _modules("analyze/sweep"), "analyze/sweep/ has moved"
    banned = (
        "triton_mp.analyze.probe",
        "triton_mp.analyze.runner",
        "triton_mp.analyze.report",
        "triton_mp.analyze.options",
        "subprocess",
        "urllib",
        "http",
    )
    for path in _modules("analyze/sweep"):
        imports = _imports(path)
        for other in banned:
            assert not _uses(imports, other), f"analyze/sweep/{path.name} imports {other}"


@pytest.mark.parametrize(
    ("sub", "banned"),
    [
        ("memory", ("triton_mp.ipc.protocol", "triton_mp.ipc.recordio")),
        ("protocol", ("triton_mp.ipc.recordio",)),
    ],
)
def test_ipc_sub_packages_import_one_way(sub: str, banned: tuple[str, ...]) -> None:
    """``ipc.recordio`` uses ``ipc.protocol``, which uses ``ipc.memory``; never the reverse,
    and none of them the modules at ``ipc``'s top (channel, tensor_pool, direct, ...)."""
    top = [p.stem for p in (PKG / "ipc").glob("*.py") if p.stem != "__init__"]
    assert _modules(f"ipc/{sub}"), f"ipc/{sub}/ has moved"
    for path in _modules(f"ipc/{sub}"):
        imports = _imports(path)
        for other in (*banned, *(f"triton_mp.ipc.{m}" for m in top)):
            assert not _uses(imports, other), f"ipc/{sub}/{path.name} imports {other}"


def test_model_config_imports_no_process_role() -> None:
    """Loading and planning are pure: no process role, no model manager."""
    for path in _modules("model_config"):
        imports = _imports(path)
        for role in ("frontend", "scheduler", "workers", "supervisor", "model_manager", "cli"):
            assert not _uses(imports, f"triton_mp.{role}"), (
                f"model_config/{path.name} imports {role}"
            )


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph() -> dict[str, set[str]]:
    """``triton_mp`` module -> the ``triton_mp`` modules it imports anywhere: at the top,
    inside functions and under ``TYPE_CHECKING``. An import through a package's
    ``__init__`` (``from triton_mp.ipc import encode``) counts as an edge to the module it
    names when that is a module, and to none otherwise (a package re-exporting its modules
    would otherwise be a cycle with each of them), as /shared/tools/structure.py counts."""
    paths = {_module_name(p): p for p in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(_tree(path)):
            candidates: list[str] = []
            if isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = name.split(".") if is_package else name.split(".")[:-1]
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                candidates = [f"{base}.{a.name}" for a in node.names] + [base]
            for cand in candidates:
                while cand and cand not in paths:
                    cand = cand.rpartition(".")[0]
                if cand and cand != name and paths[cand].name != "__init__.py":
                    targets.add(cand)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_modules() -> None:
    """Every ``triton_mp`` module's imports, wherever they are, form a DAG."""
    graph = _module_graph()
    assert "triton_mp.supervisor.main" in graph
    assert _cycles(graph) == []


def test_no_import_cycle_among_packages() -> None:
    """The same one level up: each subpackage of ``triton_mp`` (and each top-level module)
    is one node, so imports flow one way between process roles and layers."""
    top: dict[str, set[str]] = {}
    for name, targets in _module_graph().items():
        node = ".".join(name.split(".")[:2])
        top.setdefault(node, set()).update(
            t for t in (".".join(t.split(".")[:2]) for t in targets) if t != node
        )
    assert _cycles(top) == []
