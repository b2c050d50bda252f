"""The README's and docs/' runnable blocks, run as a reader would run them.

One server serves the default repository with ``--allow-client-shm=true`` (the README's
set-up command); every block marked ``<!-- doc-test: run -->`` is run against it, shell
blocks through bash and python blocks through python, in a scratch folder that has the
repository's ``examples/``, with ``localhost:8000/8001/8002`` pointed at the server's ports and
this checkout's ``triton-mp`` and ``python`` first on the PATH. Blocks of one page run in page
order in one folder (the VAD client's second block reads the file its first one wrote). The
``/metrics`` excerpt of docs/metrics.md must be what the server writes, and the trace tools'
block runs on the file of a server that traced a request and stopped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.helpers.docs_blocks import ROOT, Block, all_blocks
from tests.helpers.repos import copy_models
from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess, server_factory, wait_for
from tests.helpers.triton_peer import require_peers
from triton_mp.cli.assets import materialise_default_models
from triton_mp.common.errors import TritonMPError

pytestmark = pytest.mark.timeout(300)

BLOCKS = all_blocks()
RUN = [b for b in BLOCKS if b.kind == "run"]

# What a block must print, beyond exiting 0: (page, a piece of the block) -> a piece of stdout.
EXPECTED = {
    ("README.md", "curl -s localhost:8000/v2/models/add_sub/infer"): '"data":[1.0,2.0,3.0,4.0,5.0',
    ("README.md", "create_shared_memory_region"): "[[ 1.  2.  3.  4.",
    ("README.md", "perf_analyzer -m"): "Throughput:",
    ("README.md", "triton-mp stat"): "add_sub_py v1 · dynamic batcher",
    ("docs/shared-memory.md", "create_shared_memory_region"): "[[ 1.  2.  3.  4.",
    ("docs/models.md", 'print(client.infer("add_sub"'): "[[ 0.  2.  4.  6.",
    ("docs/models.md", "curl localhost:8000/v2/health/ready"): "HTTP/1.1 200",
    ("docs/python-backend.md", "repeat_int32"): "[2] [0]",
    # the segments docs/sequences.md shows as the client's output
    ("docs/sequences.md", "--synthesise demo.wav"): "demo.wav  speech    0.93 s -   2.33 s\n"
    "demo.wav  speech    4.67 s -   6.24 s\ndemo.wav  speech    8.29 s -   9.44 s\n",
    ("docs/scheduling.md", "--json --model ocr_cls"): '"depth"',
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    try:
        materialise_default_models(PROJECT_REPOSITORY)
    except TritonMPError as e:
        pytest.skip(f"the default repository's model files are not installed: {e.message}")
    with server_factory(tmp_path_factory.mktemp("docs_server")) as start:
        s = start(PROJECT_REPOSITORY, "--allow-client-shm=true")
        wait_for(lambda: _ready(s), 180, "every model of the default repository to be ready")
        yield s


def _ready(s: ServerProcess) -> bool:
    assert s.proc.poll() is None, s.log()
    try:
        return requests.get(f"http://{s.http_url}/v2/health/ready", timeout=5).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder first on the blocks' PATH: perf_analyzer from the peers when the PATH has
    none (the README's set-up command puts one there; this session's venv may not)."""
    d = tmp_path_factory.mktemp("bin")
    if shutil.which("perf_analyzer") is None:
        try:
            env = require_peers("PERF_ANALYZER")
        except pytest.skip.Exception:
            return d
        shim = d / "perf_analyzer"
        shim.write_text(
            f"#!/bin/sh\nLD_LIBRARY_PATH={env.get('LD_LIBRARY_PATH', '')} "
            f'exec {env["PERF_ANALYZER"]} "$@"\n'
        )
        shim.chmod(0o755)
    return d


def _point_at(text: str, s: ServerProcess) -> str:
    return (
        text.replace("localhost:8000", s.http_url)
        .replace("localhost:8001", s.url)
        .replace("localhost:8002", f"127.0.0.1:{s.metrics_port}")
    )


def _env(bin_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env["PATH"]])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    return env


def _run(block: Block, text: str, cwd: Path, env: dict[str, str]) -> str:
    if "perf_analyzer" in text and shutil.which("perf_analyzer", path=env["PATH"]) is None:
        pytest.skip("perf_analyzer is not installed (README set-up, or bench/peers)")
    if block.lang == "python":
        script = cwd / "block.py"
        script.write_text(text)
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-e", "-o", "pipefail", "-c", text]
    for _attempt in range(3):
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
        # NOTE: on two shared cores perf_analyzer may find no stable windows; that says
        # nothing about the server or the doc, so such a run is tried again.
        if "Failed to obtain stable measurement" not in done.stderr + done.stdout:
            break
    assert done.returncode == 0, (
        f"{block}: exit {done.returncode}\n--- block\n{text}\n--- stdout\n{done.stdout}\n"
        f"--- stderr\n{done.stderr}"
    )
    for (page, piece), want in EXPECTED.items():
        if block.page == page and piece in block.text:
            assert want in done.stdout, f"{block}: no {want!r} in\n{done.stdout}"
    return done.stdout


@pytest.fixture(scope="module")
def workdirs() -> dict[str, Path]:
    """One scratch folder per page, made on the page's first block."""
    return {}


@pytest.mark.parametrize("block", RUN, ids=str)
def test_block_runs(
    block: Block,
    server: ServerProcess,
    bin_dir: Path,
    workdirs: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    cwd = workdirs.get(block.page)
    if cwd is None:
        cwd = workdirs[block.page] = tmp_path_factory.mktemp("page")
        (cwd / "examples").symlink_to(ROOT / "examples")
    _run(block, _point_at(block.text, server), cwd, _env(bin_dir))


def test_metrics_excerpt_is_what_the_server_writes(server: ServerProcess) -> None:
    (block,) = [b for b in BLOCKS if b.kind == "output-metrics"]
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    served = set(text.splitlines())
    meta = [ln for ln in block.text.splitlines() if ln.startswith(("# HELP", "# TYPE"))]
    assert len(meta) >= 20
    missing = [ln for ln in meta if ln not in served]
    assert not missing, f"{block}: the server does not write:\n" + "\n".join(missing)
    names = {re.split(r"[{ ]", ln)[0] for ln in block.text.splitlines() if ln[:1].isalpha()}
    written = {re.split(r"[{ ]", ln)[0] for ln in served if ln[:1].isalpha()}
    assert names <= written, f"{block}: series the server does not write: {names - written}"


def test_trace_tools_block_runs_on_a_real_trace(tmp_path: Path, bin_dir: Path) -> None:
    (block,) = [b for b in BLOCKS if b.kind == "run-trace"]
    repo = copy_models(tmp_path / "repo", "add_sub")
    trace = tmp_path / "trace.json"
    with server_factory(tmp_path) as start:
        s = start(
            repo,
            f"--trace-config=triton,file={trace}",
            "--trace-config=level=TIMESTAMPS",
            "--trace-config=rate=1",
        )
        body = {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}
                for n in ("INPUT0", "INPUT1")
            ]
        }
        r = requests.post(f"http://{s.http_url}/v2/models/add_sub/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert s.stop() == 0
    out = _run(block, block.text.replace("/tmp/trace.json", str(trace)), tmp_path, _env(bin_dir))
    assert "add_sub" in out
    assert (tmp_path / "tl.json").stat().st_size > 0
