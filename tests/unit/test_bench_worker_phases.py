"""bench/worker_phases.py's patches: they hold on this tree's worker loop, batch path and
python backend (a patch that no longer matches fails the benchmark at its start), the patched
modules compile, and the accumulator adds each phase's thread CPU and writes the sums."""

from __future__ import annotations

import importlib.util
import py_compile
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import worker_phases  # noqa: E402


def _patched(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src"
    for rel in worker_phases._PATCHES:  # noqa: SLF001 - the module's own table
        dest = src / "triton_mp" / rel[0]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / "src" / "triton_mp" / rel[0], dest)
    out = tmp_path / "out"
    out.mkdir()
    worker_phases.instrument(src, out)
    return src, out


def test_every_patch_holds_on_this_tree_and_the_modules_compile(tmp_path: Path) -> None:
    src, _out = _patched(tmp_path)
    for rel in {p[0] for p in worker_phases._PATCHES}:  # noqa: SLF001
        text = (src / "triton_mp" / rel).read_text()
        assert "from triton_mp import _wp" in text
        py_compile.compile(str(src / "triton_mp" / rel), doraise=True)
    main = (src / "triton_mp" / "workers" / "main.py").read_text()
    assert main.count("_wp.mark(") == 3  # wait, drain, release
    assert "_wp.start()" in main
    assert "_wp.write()" in main


def test_a_patch_that_no_longer_matches_stops_the_benchmark(tmp_path: Path) -> None:
    src, out = _patched(tmp_path)  # NOTE: patched once: the old text is gone
    with pytest.raises(SystemExit, match="differs from what worker_phases patches"):
        worker_phases.instrument(src, out)


def test_the_accumulator_adds_each_phase_and_writes_the_sums(tmp_path: Path) -> None:
    src, out = _patched(tmp_path)
    spec = importlib.util.spec_from_file_location("_wp_test", src / "triton_mp" / "_wp.py")
    assert spec is not None
    assert spec.loader is not None
    wp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wp)
    ticks = iter([100, 130, 180, 1000])
    wp._T = lambda: next(ticks)  # noqa: SLF001 - a fake thread clock
    wp.start()
    wp.mark(worker_phases.PHASES.index("decode"))
    wp.mark(worker_phases.PHASES.index("execute"))
    wp.mark(worker_phases.PHASES.index("decode"))
    wp.counts[:] = [1, 8, 2]
    wp.write()
    (written,) = out.glob("phases_*.txt")
    values = [int(v) for v in written.read_text().split()]
    assert values[:3] == [1, 8, 2]
    acc = dict(zip(worker_phases.PHASES, values[3:], strict=True))
    assert acc["decode"] == 30 + 820
    assert acc["execute"] == 50
    assert sum(acc.values()) == 900
