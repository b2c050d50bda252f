"""bench/exports.py's pure pieces: which commits share the working tree's native sources, and
copying built extensions into an export. (Building one is a benchmark's minute, not a test's.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import exports  # noqa: E402


def test_built_extensions_are_copied_where_the_export_has_their_package(tmp_path: Path) -> None:
    built, export = tmp_path / "built", tmp_path / "export"
    for rel in ("pkg/a/_x.so", "pkg/b/_y.so", "pkg/a/mod.py"):
        (built / rel).parent.mkdir(parents=True, exist_ok=True)
        (built / rel).write_bytes(rel.encode())
    (export / "pkg" / "a").mkdir(parents=True)  # pkg/b is gone at that commit
    assert exports.copy_built_extensions(built, export) == 1
    assert (export / "pkg" / "a" / "_x.so").read_bytes() == b"pkg/a/_x.so"
    assert not (export / "pkg" / "a" / "mod.py").exists()
    assert not (export / "pkg" / "b").exists()


def test_native_sources_are_compared_with_git(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def run(cmd: list[str], check: bool) -> subprocess.CompletedProcess[bytes]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0 if cmd[-6] == "same" else 1)

    monkeypatch.setattr(exports.subprocess, "run", run)
    assert exports.same_native_sources("same")
    assert not exports.same_native_sources("other")
    assert calls[0][-7:] == ["--quiet", "same", "--", "setup.py", "protos", "*.cc", "*.h"]
