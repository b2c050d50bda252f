"""The benchmarks refuse to measure triton-mp's native gRPC frontend with a build that would
not serve it (bench/native_check.py), and bench_vs_triton.py's chart follows ``--json``.

``native_unavailable`` asks a process of the ``src/`` in question what the frontend itself
decides (``triton_mp.frontend.native.UNAVAILABLE``); the tools are run as their command
lines run them, and refuse before any server starts. No server runs here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import bench_vs_triton  # noqa: E402
from native_check import NativeUnavailable, native_unavailable, require_native  # noqa: E402
from vs_triton_workloads import DEFAULT_PNG  # noqa: E402

NATIVE_DIR = ROOT / "src" / "triton_mp" / "frontend" / "native"
BUILT = any(NATIVE_DIR.glob("_native*.so"))


def _src_copy(tmp_path: Path) -> Path:
    """This checkout's ``src/`` copied (with its built extensions)."""
    dest = tmp_path / "src"
    shutil.copytree(ROOT / "src", dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_the_probe_gives_the_frontends_own_decision() -> None:
    """What a server of this checkout would decide, as this process's import decided it:
    "" for a current build; the reason for a missing or stale one (then it is refused)."""
    from triton_mp.frontend import native

    assert native_unavailable(ROOT / "src") == native.UNAVAILABLE
    if native.UNAVAILABLE:
        with pytest.raises(NativeUnavailable):
            require_native(ROOT / "src", "triton-mp")
    else:
        require_native(ROOT / "src", "triton-mp")


@pytest.mark.skipif(not BUILT, reason="the native extension is not built in this checkout")
def test_a_build_of_older_sources_is_refused_in_one_line(tmp_path: Path) -> None:
    src = _src_copy(tmp_path)
    init = src / "triton_mp" / "frontend" / "native" / "__init__.py"
    text = init.read_text()
    assert "\n_ABI = " in text
    init.write_text(text.replace("\n_ABI = ", "\n_ABI = 1000 + ", 1))
    assert "built from older sources (ABI" in native_unavailable(src)
    with pytest.raises(NativeUnavailable) as e:
        require_native(src, "triton-mp")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"refusing to measure triton-mp: the native gRPC frontend of {src}")
    assert "--grpc-frontend python" in message


def test_a_missing_extension_and_native_off_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _src_copy(tmp_path)
    for built in (src / "triton_mp" / "frontend" / "native").glob("_native*.so"):
        built.unlink()
    assert "_native" in native_unavailable(src)
    monkeypatch.setenv("TRITON_MP_NATIVE", "0")
    assert native_unavailable(ROOT / "src") == "TRITON_MP_NATIVE=0"


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TRITON_MP_NATIVE="0")
    return subprocess.run(
        [sys.executable, str(BENCH / tool), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_ab_frontends_refuses_before_any_server_starts() -> None:
    done = _run("ab_frontends.py", "--pairs", "1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"refusing to measure --grpc-frontend native: the native gRPC frontend of "
        f"{ROOT / 'src'} is unavailable (TRITON_MP_NATIVE=0); build it (python setup.py "
        "build_ext --inplace) or measure --grpc-frontend python"
    ]
    assert done.stdout == ""


def test_ab_interleaved_refuses_a_commit_without_its_native_frontend() -> None:
    done = _run("ab_interleaved.py", "--a", "HEAD", "--b", "HEAD", "--pairs", "1")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("refusing to measure A (HEAD): the native gRPC frontend of ")
    assert "(TRITON_MP_NATIVE=0)" in line


def test_ab_c1_refuses_a_commit_without_its_native_frontend_before_triton_starts() -> None:
    done = _run("ab_c1.py", "--commits", "HEAD", "--rounds", "1")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("refusing to measure HEAD: the native gRPC frontend of ")
    assert "(TRITON_MP_NATIVE=0)" in line


def test_bench_vs_triton_refuses_and_says_why_in_its_record(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = _run(
        "bench_vs_triton.py",
        "--workloads",
        "add_sub_c1",
        "--no-private-shm",
        "--json",
        str(out),
    )
    assert done.returncode == 1
    assert "ERROR: refusing to measure triton-mp: " in done.stderr
    assert json.loads(out.read_text())["error"].startswith("refusing to measure triton-mp: ")


def test_sides_that_measure_the_native_frontend_need_it_and_the_python_side_does_not() -> None:
    args = bench_vs_triton.parse_args(["--workloads", "add_sub_c1"])
    assert bench_vs_triton.native_sources(args) == {
        "triton-mp": ROOT / "src",
        "triton-mp fp2": ROOT / "src",
    }
    python_only = bench_vs_triton.parse_args(
        ["--workloads", "add_sub_c1", "--skip-sides", "triton-mp,triton-mp fp2"]
    )
    assert "triton-mp python" in python_only.workloads[0].sides
    assert bench_vs_triton.native_sources(python_only) == {}
    own = bench_vs_triton.parse_args(["--workloads", "add_sub_c1", "--server-cmd", "x"])
    assert bench_vs_triton.native_sources(own) == {}


def test_the_chart_follows_json_unless_png_is_given(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "c16.json"
    assert bench_vs_triton.parse_args(["--json", str(run)]).png == tmp_path / "runs" / "c16.png"
    named = tmp_path / "chart.png"
    assert bench_vs_triton.parse_args(["--json", str(run), "--png", str(named)]).png == named
    assert bench_vs_triton.parse_args([]).png == DEFAULT_PNG
