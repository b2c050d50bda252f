"""bench/ocr_worker_phases.py: its onnxruntime marks hold on this tree's backend (a patch that
no longer matches fails the benchmark at its start), the patched module compiles, and a
worker's sums file reads as phases per batch and per image."""

from __future__ import annotations

import py_compile
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import ocr_worker_phases  # noqa: E402
import worker_phases  # noqa: E402


def _patched(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    rels = {p[0] for p in worker_phases._PATCHES} | {ocr_worker_phases._ORT}  # noqa: SLF001
    for rel in rels:
        dest = src / "triton_mp" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / "src" / "triton_mp" / rel, dest)
    out = tmp_path / "out"
    out.mkdir()
    ocr_worker_phases.instrument_ort(src, out)
    return src


def test_the_onnxruntime_marks_hold_on_this_tree_and_compile(tmp_path: Path) -> None:
    src = _patched(tmp_path)
    backend = src / "triton_mp" / ocr_worker_phases._ORT  # noqa: SLF001
    text = backend.read_text()
    assert "from triton_mp import _wp" in text
    assert f"_wp.mark({worker_phases.PHASES.index('pb_requests')})" in text
    assert f"_wp.mark({worker_phases.PHASES.index('execute')})" in text
    py_compile.compile(str(backend), doraise=True)


def test_a_backend_that_no_longer_matches_stops_the_benchmark(tmp_path: Path) -> None:
    src = _patched(tmp_path)
    with pytest.raises(SystemExit):
        ocr_worker_phases.instrument_ort(src, tmp_path / "out")


def test_the_phases_read_per_batch_and_per_image() -> None:
    acc = [0] * len(worker_phases.PHASES)
    acc[worker_phases.PHASES.index("pb_requests")] = 80_000  # ns over 2 batches
    acc[worker_phases.PHASES.index("execute")] = 9_000_000
    acc[worker_phases.PHASES.index("answer")] = 100_000
    lines = ocr_worker_phases.phase_lines(" ".join(map(str, [2, 16, 0, *acc])))
    assert lines[0].startswith("    first instance: 2 batches of 8.00, 0.00 sleeps per batch")
    assert "4590.0 µs/batch in all" in lines[0]
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert by_name["input"].split()[1:4:2] == ["40.0", "5.00"]
    assert by_name["session.run"].split()[1:4:2] == ["4500.0", "562.50"]
    assert lines[-1].split()[2:5:2] == ["90.0", "11.25"]  # outside run: input + answer
