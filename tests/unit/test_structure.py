"""The package's structure, as docs/architecture.md states it (checked with ``ast``, nothing run).

- Imports flow one way between the top-level packages (``ALLOWED`` below); the process roles
  (frontend, scheduler, workers) never import each other.
- Every module is named in docs/architecture.md, in the section of its package.
- No module is over 600 lines (generated ``_proto`` and ``pb_utils`` excepted) and no
  function over 80.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "triton_mp"
DOC = ROOT / "docs" / "architecture.md"

ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "ipc": {"common"},
    "backends": {"ipc", "common", "_proto"},
    "model_config": {"backends", "ipc", "common", "_proto"},
    "frontend": {"ipc", "common", "_proto"},
    "scheduler": {"ipc", "common"},
    "workers": {"backends", "ipc", "common"},
    "supervisor": {
        "model_config",
        "frontend",
        "scheduler",
        "workers",
        "backends",
        "ipc",
        "common",
        "_proto",
    },
    "cli": {"supervisor", "frontend", "ipc", "common", "_proto", "analyze"},
    "analyze": {"common", "_proto"},
}
"""Top-level package -> the other top-level packages it may import. The supervisor imports
the roles only to start them (their entry points, from ``supervisor.processes.child_entry``)."""

MODULE_LINES = 600
FUNCTION_LINES = 80
LONG_MODULES_ALLOWED = {"backends/python/pb_utils.py"}
"""pb_utils is one module, as upstream's triton_python_backend_utils is."""


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "_proto" not in p.relative_to(PKG).parts)


def _package(path: Path) -> str:
    return path.relative_to(PKG).parts[0].removesuffix(".py")


def _triton_imports(path: Path) -> set[str]:
    """Every ``triton_mp.*`` module ``path`` imports, at any depth (functions, TYPE_CHECKING)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m == "triton_mp" or m.startswith("triton_mp.")}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_imports_flow_one_way(path: Path) -> None:
    pkg = _package(path)
    if pkg not in ALLOWED:
        return  # __init__ / __main__ of the top level
    for module in _triton_imports(path):
        parts = module.split(".")
        target = parts[1] if len(parts) > 1 else ""
        if target in ("", pkg, "__version__"):
            continue
        assert target in ALLOWED[pkg], f"{path.relative_to(PKG)} ({pkg}) imports {module}"


def test_the_roles_never_import_each_other() -> None:
    for role in ("frontend", "scheduler", "workers"):
        others = {"frontend", "scheduler", "workers"} - {role}
        assert not ALLOWED[role] & others


def test_every_allowed_table_entry_is_a_package() -> None:
    for pkg in ALLOWED:
        assert (PKG / pkg / "__init__.py").is_file(), pkg


def _doc_sections() -> dict[str, str]:
    """``### `pkg/` ...`` section headings of docs/architecture.md -> their text."""
    text = DOC.read_text()
    sections: dict[str, str] = {}
    for m in re.finditer(r"^### `([a-z_]+)/`[^\n]*\n(.*?)(?=^### |^## |\Z)", text, re.M | re.S):
        sections[m.group(1)] = m.group(2)
    return sections


def test_the_architecture_doc_has_a_section_per_package() -> None:
    sections = _doc_sections()
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()} - {"_proto"}
    assert set(sections) == packages


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_every_module_is_in_the_architecture_doc(path: Path) -> None:
    rel = path.relative_to(PKG)
    if len(rel.parts) == 1 or rel.name == "__init__.py" and len(rel.parts) == 2:
        return  # the top-level __init__/__main__, and a package's own __init__
    section = _doc_sections()[rel.parts[0]]
    names = set(re.findall(r"`([a-z_/]+)`", section))
    tokens = {t for name in names for t in name.strip("/").split("/")}
    for part in rel.parts[1:-1]:
        assert part in tokens, f"docs/architecture.md does not name {rel.parts[0]}/{part}/"
    if rel.name != "__init__.py":
        assert path.stem in tokens, f"docs/architecture.md does not name {rel}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_no_module_or_function_is_too_long(path: Path) -> None:
    rel = str(path.relative_to(PKG))
    source = path.read_text()
    if rel not in LONG_MODULES_ALLOWED:
        assert len(source.splitlines()) <= MODULE_LINES, f"{rel} is over {MODULE_LINES} lines"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            assert length <= FUNCTION_LINES, f"{rel}:{node.name} is {length} lines"
