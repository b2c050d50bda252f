"""The process roles stay separated: which modules may import what (STYLE.md, design notes).

Checked on the source with ``ast`` (no imports executed):
- the batching core (scheduler clock/dynamic) imports no ipc, grpc, numpy or backend;
- ``ipc`` imports nothing from the role packages;
- only ``frontend`` imports grpc or aiohttp, and its transport-neutral core imports neither;
- only ``backends`` import onnxruntime or tensorrt;
- in the scheduler package only ``main`` (and ``stats``, for the message structs it
  fills) touch ``triton_mp.ipc``;
- only ``common.platform`` calls prctl or sets process titles.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "src" / "triton_mp"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
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


@pytest.mark.parametrize("module", ["scheduler/clock.py", "scheduler/dynamic.py"])
def test_batching_core_is_pure(module: str) -> None:
    imports = _imports(PKG / module)
    for banned in ("triton_mp.ipc", "grpc", "numpy", "onnxruntime", "posix_ipc", "time"):
        assert not _uses(imports, banned) or (banned == "time" and module.endswith("clock.py")), (
            f"{module} imports {banned}"
        )


def test_ipc_imports_no_role_package() -> None:
    for path in _modules("ipc"):
        imports = _imports(path)
        for role in ("frontend", "scheduler", "workers", "supervisor"):
            assert not _uses(imports, f"triton_mp.{role}"), f"{path.name} imports {role}"


def test_only_frontend_imports_grpc() -> None:
    for path in _modules():
        if "frontend" in path.parts:
            continue
        assert not _uses(_imports(path), "grpc"), f"{path.relative_to(PKG)} imports grpc"


def test_only_frontend_imports_aiohttp() -> None:
    for path in _modules():
        if "frontend" in path.parts:
            continue
        assert not _uses(_imports(path), "aiohttp"), f"{path.relative_to(PKG)} imports aiohttp"


def test_http_translation_has_no_transport() -> None:
    """frontend/core.py and frontend/http_infer.py are transport-neutral (testable on bytes)."""
    for name in ("core.py", "http_infer.py"):
        imports = _imports(PKG / "frontend" / name)
        for banned in ("grpc", "aiohttp"):
            assert not _uses(imports, banned), f"frontend/{name} imports {banned}"


def test_only_backends_import_backend_libraries() -> None:
    for path in _modules():
        if "backends" in path.parts:
            continue
        imports = _imports(path)
        for lib in ("onnxruntime", "tensorrt", "pycuda"):
            assert not _uses(imports, lib), f"{path.relative_to(PKG)} imports {lib}"


def test_scheduler_touches_ipc_only_in_main() -> None:
    for path in _modules("scheduler"):
        if path.name in ("main.py", "stats.py"):
            continue
        assert not _uses(_imports(path), "triton_mp.ipc"), f"scheduler/{path.name} imports ipc"


def test_supervisor_process_loads_neither_grpc_nor_onnxruntime() -> None:
    import subprocess
    import sys

    code = (
        "import sys, triton_mp.cli.main, triton_mp.supervisor;"
        "print(','.join(m for m in ('grpc', 'onnxruntime') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(PKG.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == ""


def test_only_the_platform_helper_reaches_prctl_and_process_titles() -> None:
    """``common.platform`` is the one place that calls prctl and setproctitle."""
    for path in _modules():
        if path.relative_to(PKG).as_posix() == "common/platform.py":
            continue
        assert not _uses(_imports(path), "setproctitle"), f"{path.relative_to(PKG)} titles"
        assert ".prctl(" not in path.read_text(), f"{path.relative_to(PKG)} calls prctl"
