"""NVIDIA's Model Analyzer (``triton-model-analyzer`` from PyPI) profiles triton-mp unchanged.

Model Analyzer runs in its own virtual environment, built once per version from PyPI and
cached (``$TRITON_MP_MA_VENV``, default ``<tmp>/triton_mp_model_analyzer_<version>``); the
tests are skipped where it cannot be built (no registry) or perf_analyzer is missing (the
peers, ``bench/peers/install-peers.sh``). Each runs a small ``profile``: ``add_sub``, the
shipped config plus two instance counts, concurrency 1, short windows, and checks that it
finished and wrote results for every measured config.

- local mode: Model Analyzer starts the server itself, as it starts ``tritonserver``, with
  tritonserver's argv, through the ``triton-mp-tritonserver`` entry point. CPU metrics are
  on (``collect_cpu_metrics``): its RAM figure is the USS of the one process it started.
- remote mode: it drives a triton-mp server started here (``--model-control-mode=explicit``).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.repos import copy_models
from tests.helpers.server import REPO_ROOT, ServerProcess, free_port
from tests.helpers.triton_peer import require_peers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MA_VERSION = "1.58.0"
MA_VENV = Path(
    os.environ.get(
        "TRITON_MP_MA_VENV",
        Path(tempfile.gettempdir()) / f"triton_mp_model_analyzer_{MA_VERSION}",
    )
)
CONFIGS = ("add_sub_config_default", "add_sub_config_0", "add_sub_config_1")


def _model_analyzer() -> Path:
    """Model Analyzer's executable, building its venv on first use (skip if impossible)."""
    exe = MA_VENV / "bin" / "model-analyzer"
    marker = MA_VENV / "built-ok"
    if exe.exists() and marker.exists():
        return exe
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(MA_VENV)], check=True)
    pip = subprocess.run(
        [str(MA_VENV / "bin" / "pip"), "install", "-q", f"triton-model-analyzer=={MA_VERSION}"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if pip.returncode != 0 or not exe.exists():
        pytest.skip(f"cannot build Model Analyzer's venv: {pip.stderr.strip()[-300:]}")
    marker.write_text(MA_VERSION)
    return exe


def _server_executable(tmp_path: Path) -> Path:
    """What Model Analyzer launches as ``triton_server_path``: the installed
    ``triton-mp-tritonserver`` script, or, where this checkout is not installed, a launcher
    calling the same function as pip's console script does."""
    installed = Path(sys.executable).parent / "triton-mp-tritonserver"
    if installed.exists():
        return installed
    launcher = tmp_path / "triton-mp-tritonserver"
    # NOTE: the __main__ guard matters: spawned children re-import the main script
    launcher.write_text(
        f"#!{sys.executable}\nimport sys\nfrom triton_mp.cli.main import tritonserver_main\n"
        "if __name__ == '__main__':\n    sys.exit(tritonserver_main())\n"
    )
    launcher.chmod(0o755)
    return launcher


def _profile(tmp_path: Path, mode_lines: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    exe = _model_analyzer()
    env = require_peers("PERF_ANALYZER")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")) if p
    )
    out = tmp_path / "ma"
    (out / "ckpt").mkdir(parents=True)
    config = tmp_path / "ma.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        model_repository: {tmp_path / "repo"}
        output_model_repository_path: {out / "models"}
        override_output_model_repository: true
        export_path: {out}
        checkpoint_directory: {out / "ckpt"}
        perf_analyzer_path: {env["PERF_ANALYZER"]}
        perf_analyzer_flags:
          # NOTE: time windows: Model Analyzer's default (count_windows) makes each of
          # perf_analyzer's three windows last a second whatever the interval says
          measurement-mode: time_windows
          measurement-interval: 250
          # NOTE: any spread counts as stable: on shared CI cores perf_analyzer otherwise
          # fails to settle within its trials and Model Analyzer drops the configuration.
          stability-percentage: 1000
        # NOTE: its metrics sampled every 0.2 s (default 1 s), server-only metrics for 1 s (3)
        monitoring_interval: 0.2
        duration_seconds: 1
        run_config_search_disable: true
        inference_output_fields: [model_name, model_config_path, instance_group,
                                  perf_throughput, perf_latency_p99, cpu_used_ram]
        profile_models:
          add_sub:
            parameters:
              concurrency: [1]
            model_config_parameters:
              instance_group:
                - kind: KIND_CPU
                  count: [1, 2]
        """)
        + textwrap.dedent(mode_lines)
    )
    proc = subprocess.run(
        [str(exe), "profile", "-f", str(config)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=800, check=False,
    )  # fmt: skip
    return proc, out


def _check_every_config(proc: subprocess.CompletedProcess[str], out: Path) -> list[dict[str, str]]:
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    errors = out / "perf_analyzer_error.log"
    pa_errors = errors.read_text()[-2000:] if errors.exists() else ""
    assert "Profiled 3 configurations" in log, log[-3000:] + pa_errors
    assert "Unexpected argument" not in log
    with open(out / "results" / "metrics-model-inference.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["Model Config Path"] for r in rows) == sorted(CONFIGS), rows
    for r in rows:
        assert float(r["Throughput (infer/sec)"]) > 0, r
        assert float(r["p99 Latency (ms)"]) > 0, r
    assert {r["Instance Group"] for r in rows} == {"1:CPU", "2:CPU"}
    assert (out / "reports" / "summaries" / "add_sub" / "result_summary.html").is_file()
    return rows


def test_model_analyzer_local_mode_launches_triton_mp(tmp_path: Path) -> None:
    copy_models(tmp_path / "repo", "add_sub")
    http, grpc, metrics = free_port(), free_port(), free_port()
    server = _server_executable(tmp_path)
    proc, out = _profile(
        tmp_path,
        f"""\
        triton_launch_mode: local
        triton_server_path: {server}
        triton_http_endpoint: localhost:{http}
        triton_grpc_endpoint: localhost:{grpc}
        triton_metrics_url: http://localhost:{metrics}/metrics
        triton_output_path: {tmp_path / "server.log"}
        collect_cpu_metrics: true
        """,
    )
    rows = _check_every_config(proc, out)
    log = proc.stdout + proc.stderr
    assert "CPU metric(s) are not being collected" not in log
    # the USS of the process it launched (the supervisor): measured, not zero
    assert all(float(r["RAM Usage (MB)"]) > 0 for r in rows), rows


def test_model_analyzer_remote_mode_drives_a_running_server(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub")
    proc, out = _profile(
        tmp_path,
        f"""\
        triton_launch_mode: remote
        triton_http_endpoint: {server.http_url}
        triton_grpc_endpoint: {server.url}
        triton_metrics_url: http://127.0.0.1:{server.metrics_port}/metrics
        """,
    )
    _check_every_config(proc, out)
    assert "Unexpected argument" not in server.log()
