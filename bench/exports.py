"""A committed triton-mp to benchmark against the working tree: ``src/`` as ``git archive``
exports it, with its native extensions.

``git archive`` exports no build, and without ``_native`` (the gRPC data path) and the C
request decoder a commit serves through the Python fallbacks: an A/B of two commits would
compare the native path with the Python one. So an export gets its extensions one of two ways:

- ``rev``'s native sources (``setup.py``, ``protos/``, ``src/**/*.cc``, ``src/**/*.h``) are the
  working tree's: this checkout's built ``src/**/*.so`` are copied in (instant);
- they differ: ``python setup.py build_ext --inplace`` runs in the export (``nice``, a minute
  or two on 2 cores). When that build fails, the export runs without them, and says so.

``patch_source`` edits an export for the tools that instrument one (``sched_phases``,
``worker_phases``).

Standard library only.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from peers_env import ROOT, BenchError

NATIVE_PATHS = ("setup.py", "protos", "*.cc", "*.h")
"""What decides whether a commit's extensions are this checkout's (``git diff`` pathspecs)."""
EXPORTED = ("src", "setup.py", "protos", "pyproject.toml")
"""What an export takes from the commit: the package and what building it needs."""


def export_commit(rev: str) -> Path:
    """``src/`` as committed at ``rev``, with its native extensions, in a new temporary
    folder, removed when the benchmark exits; returns that ``src/`` (for
    ``TritonMP(src=...)``)."""
    dest = Path(tempfile.mkdtemp(prefix="triton_mp_export."))
    atexit.register(shutil.rmtree, dest, True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, *EXPORTED], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise BenchError(f"git archive {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    if same_native_sources(rev):
        copy_built_extensions(ROOT / "src", dest / "src")
    else:
        build_extensions(rev, dest)
    return dest / "src"


def same_native_sources(rev: str) -> bool:
    """Whether ``rev``'s native sources are the working tree's."""
    diff = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--quiet", rev, "--", *NATIVE_PATHS], check=False
    )
    return diff.returncode == 0


def copy_built_extensions(src: Path, dest: Path) -> int:
    """Copy every ``*.so`` under ``src`` to the same place under ``dest`` (where that folder
    exists); returns how many were copied."""
    copied = 0
    for built in src.rglob("*.so"):
        target = dest / built.relative_to(src)
        if target.parent.is_dir():
            shutil.copy2(built, target)
            copied += 1
    return copied


def build_extensions(rev: str, tree: Path) -> bool:
    """``python setup.py build_ext --inplace`` in an exported tree, niced; False (and a line
    saying so) when it fails."""
    print(f"  {rev}: native sources differ from the working tree: building them", flush=True)
    build = subprocess.run(
        ["nice", sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0:
        tail = (build.stdout + build.stderr).strip().splitlines()[-3:]
        print(f"  {rev}: the build failed, its src/ runs without extensions: {tail}")
        return False
    return True


def patch_source(path: Path, patches: Iterable[tuple[str, str]], tool: str) -> None:
    """Replace each ``(old, new)`` of ``patches`` in the file at ``path`` (an exported
    source); exit naming ``tool`` when the commit's file does not hold an ``old`` exactly
    once (its code differs from what the tool was written against)."""
    text = path.read_text()
    for old, new in patches:
        if text.count(old) != 1:
            raise SystemExit(f"{path}: differs from what {tool} patches: {old!r}")
        text = text.replace(old, new)
    path.write_text(text)
