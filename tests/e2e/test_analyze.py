"""``triton-mp analyze`` against real servers: a short sweep on ``add_sub`` (a server the
analyzer starts) and on ``ocr_cls`` (a running server given by ``--url``).

Each run must finish, write its report and config files, recommend only points within the
constraints given, and each recommended ``config.pbtxt``, put into a repository, must load
and serve correct answers. The memory figures are checked against ``/proc/<pid>/status``
read here, independently of the analyzer. perf_analyzer is used where it is installed (the
README's set-up command, or the peers); without it the analyzer's built-in load generator
measures (both are real load against a real server).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repos import copy_models
from tests.helpers.server import REPO_ROOT, ServerProcess, default_sigint
from triton_mp.analyze.probe.loadgen import find_perf_analyzer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _analyze(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, "-m", "triton_mp", "analyze", *args],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=540, check=False,
    )  # fmt: skip


def _perf_analyzer_found() -> bool:
    """Whether ``_analyze``'s run finds perf_analyzer (its cwd and environment): on the PATH
    (the README's set-up command installs it there), in $PERF_ANALYZER, or in .peers/."""
    here = Path.cwd()
    os.chdir(REPO_ROOT)
    try:
        return find_perf_analyzer() is not None
    finally:
        os.chdir(here)


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _recommended(out: Path) -> list[tuple[dict, dict, Path]]:
    """(recommendation, its result, its config.pbtxt) for each recommendation."""
    s = _summary(out)
    out_list = []
    for rec in s["recommendations"]:
        match = [r for r in s["results"] if _point_key(r["point"]) == rec["point"]]
        assert len(match) == 1, rec
        out_list.append((rec, match[0], Path(rec["config"])))
    return out_list


def _point_key(p: dict) -> str:
    v = p["variant"]
    if v.get("shipped"):
        return f"shipped@c{p['concurrency']}"
    dyn = f"dyn{v.get('max_queue_delay_us', 0)}" if v["dynamic_batching"] else "nodyn"
    pref = v.get("preferred_batch_sizes") or []
    tail = ("_p" + "-".join(map(str, pref))) if pref else ""
    return f"i{v['instance_count']}_b{v['max_batch_size']}_{dyn}{tail}@c{p['concurrency']}"


def _check_outputs(out: Path, budget_ms: float, proc: subprocess.CompletedProcess[str]) -> list:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "triton-mp analyze" in proc.stdout  # the summary table
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    recs = _recommended(out)
    assert recs, proc.stdout
    s = _summary(out)
    assert s["load_generator"] in ("perf_analyzer", "triton-mp builtin (HTTP/REST closed loop)")
    assert (s["load_generator"] == "perf_analyzer") == _perf_analyzer_found()
    for _, result, path in recs:
        m = result["measurement"]
        assert m["error"] is None
        assert 0 < m["p99_us"] <= budget_ms * 1000  # the constraint holds
        assert m["throughput_per_s"] > 0
        assert path.is_file()
    for r in s["results"]:
        m = r["measurement"]
        if m["error"] is None:
            # one memory entry per instance of the variant, each a worker process
            assert len(m["instances"]) == r["point"]["variant"]["instance_count"]
            assert {p["role"] for p in m["instances"]} == {"worker"}
            assert all(p["rss_bytes"] > 1 << 20 for p in m["processes"])
            assert m["cpu_ms_per_inference"] > 0
            assert m["server"]["requests"] > 0
    return recs


def _serve_each(
    recs: list, model: str, repo: Path, start_server: Callable[..., ServerProcess], check: Callable
) -> None:
    """Put each recommended config.pbtxt into ``repo`` and (re)load it from the file.

    The server does not auto-complete configs, as the analyzer's did: a recommended config
    without a dynamic batcher says so in its header, since auto-complete would add one."""
    server = start_server(repo, "--model-control-mode=explicit", "--disable-auto-complete-config")
    client = server.client()
    try:
        for _, result, path in recs:
            text = path.read_text()
            (repo / model / "config.pbtxt").write_text(text)
            no_batcher = not result["point"]["variant"]["dynamic_batching"]
            assert ("--disable-auto-complete-config" in text) == no_batcher
            client.load_model(model)
            cfg = client.get_model_config(model, as_json=True)["config"]
            v = result["point"]["variant"]
            assert cfg["instance_group"][0]["count"] == v["instance_count"]
            assert int(cfg.get("max_batch_size", 0)) == v["max_batch_size"]
            assert ("dynamic_batching" in cfg) == v["dynamic_batching"]
            check(client)
    finally:
        client.close()


def _leftover(marker: str) -> list[int]:
    """Processes whose command line contains ``marker``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


def test_analyze_add_sub_on_a_server_it_starts(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    out = tmp_path / "out"
    proc = _analyze(
        "--model", "add_sub", "--model-repository", str(repo), "--output", str(out),
        "--instance-counts", "1,2", "--max-batch-sizes", "8", "--max-queue-delays-us", "0",
        "--dynamic-batching", "on,off", "--concurrency", "2", "--measurement-interval-ms", "250",
        "--latency-budget-ms", "40", "--top", "3",
    )  # fmt: skip
    assert not _leftover(str(repo)), "the analyzer left its server running"
    recs = _check_outputs(out, 40, proc)
    keys = {_point_key(r["point"]).split("@")[0] for r in _summary(out)["results"]}
    assert keys == {"shipped", "i1_b8_dyn0", "i1_b8_nodyn", "i2_b8_dyn0", "i2_b8_nodyn"}

    def check(client: grpcclient.InferenceServerClient) -> None:
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.float32)
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
            grpcclient.InferInput("INPUT1", [1, 16], "FP32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        res = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)

    _serve_each(recs, "add_sub", repo, start_server, check)


def _worker_rss(server_pid: int, model: str) -> dict[int, int]:
    """pid -> VmRSS bytes of the server's worker processes of ``model`` (read here)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode()
            if ppid != server_pid or not title.startswith(f"triton-mp: worker {model}_"):
                continue
            with open(f"/proc/{d}/status") as f:
                out[int(d)] = int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024
        except (OSError, AttributeError):
            continue
    return out


def test_analyze_ocr_cls_on_a_running_server(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "ocr_cls")
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=ocr_cls")
    out = tmp_path / "out"
    proc = _analyze(
        "--model", "ocr_cls", "--url", server.http_url, "--grpc-url", server.url,
        "--metrics-url", f"127.0.0.1:{server.metrics_port}", "--output", str(out),
        "--instance-counts", "1,2", "--max-batch-sizes", "8", "--max-queue-delays-us", "500",
        "--dynamic-batching", "on", "--concurrency", "1,4", "--measurement-interval-ms", "400",
        "--latency-budget-ms", "400", "--top", "2",
    )  # fmt: skip
    recs = _check_outputs(out, 400, proc)
    client = server.client()
    try:  # the analyzer gave the server its own config back
        assert client.get_model_config("ocr_cls", as_json=True)["config"]["max_batch_size"] == 32
    finally:
        client.close()

    def check(client: grpcclient.InferenceServerClient) -> None:
        x = grpcclient.InferInput("x", [2, 3, 48, 192], "FP32")
        x.set_data_from_numpy(np.zeros((2, 3, 48, 192), dtype=np.float32))
        probs = client.infer("ocr_cls", [x]).as_numpy("save_infer_model/scale_0.tmp_1")
        assert probs.shape == (2, 2)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)

    _serve_each(recs, "ocr_cls", copy_models(tmp_path / "repo2", "ocr_cls"), start_server, check)


@pytest.mark.parametrize("model", ["add_sub", "ocr_cls"])
def test_memory_figures_are_the_instance_processes_rss(
    tmp_path: Path, start_server: Callable[..., ServerProcess], model: str
) -> None:
    """The analyzer's per-instance and whole-server memory equal /proc read independently."""
    from triton_mp.analyze.probe import procs
    from triton_mp.analyze.probe.loadgen import BuiltinLoad
    from triton_mp.analyze.probe.measure import Target, measure

    repo = copy_models(tmp_path / "repo", model)
    server = start_server(repo, "--model-control-mode=explicit", f"--load-model={model}")
    client = server.client()
    try:
        cfg = client.get_model_config(model, as_json=True)["config"]
        cfg["instance_group"] = [{"count": 3, "kind": "KIND_CPU"}]
        client.load_model(model, config=json.dumps(cfg))
        served = client.get_model_config(model, as_json=True)["config"]
        groups = [g["name"] for g in served["instance_group"]]
    finally:
        client.close()
    target = Target(http_url=server.http_url, root_pid=server.pid)
    load = BuiltinLoad(server.http_url, cfg, window_s=0.5, warmup_s=0.1)
    m = measure(target, load, model, 2, groups)
    assert m.ok, m.error
    for _ in range(5):  # idle now: RSS is steady; read until two reads agree
        first = _worker_rss(server.pid, model)
        m_pids = {
            p.pid: p.rss_bytes
            for p in procs.instances_of(procs.memory(procs.snapshot(server.pid)), groups)
        }
        if first == _worker_rss(server.pid, model) == m_pids:
            break
    assert len(first) == 3
    assert {p.pid for p in m.instances} == set(first)
    # what the measurement recorded, right after the load, within 2 MiB of an idle re-read
    for p in m.instances:
        assert abs(p.rss_bytes - first[p.pid]) <= 2 << 20, (p, first[p.pid])
    assert m.instances_rss_bytes == sum(p.rss_bytes for p in m.instances)
    assert abs(m.instances_rss_bytes - sum(first.values())) <= 6 << 20
    # a fresh reading at rest equals /proc exactly
    assert m_pids == first
    every = {p.pid for p in m.processes}
    assert server.pid in every
    assert set(first) <= every
    assert m.total_rss_bytes > m.instances_rss_bytes


def test_analyze_resumes_from_its_checkpoint_after_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the analyzer's process group, as a terminal sends it) keeps the
    points measured so far; the same command then measures only the rest."""
    import signal
    import time

    repo = copy_models(tmp_path / "repo", "add_sub")
    out = tmp_path / "out"
    args = [
        "--model", "add_sub", "--model-repository", str(repo), "--output", str(out),
        "--instance-counts", "1,2", "--max-batch-sizes", "8", "--max-queue-delays-us", "0",
        "--dynamic-batching", "on", "--concurrency", "1,2", "--measurement-interval-ms", "250",
    ]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")) if p
    )
    first = subprocess.Popen(
        [sys.executable, "-m", "triton_mp", "analyze", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True, preexec_fn=default_sigint,
    )  # fmt: skip
    ckpt = out / "checkpoint.json"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and first.poll() is None:
            if ckpt.exists() and len(json.loads(ckpt.read_text())["results"]) >= 2:
                break
            time.sleep(0.2)
        os.killpg(first.pid, signal.SIGINT)
        log, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == 130, log
    assert "run again to resume" in log
    assert not (out / "summary.json").exists()
    assert not _leftover(str(repo)), "the interrupted analyzer left its server running"
    kept = json.loads(ckpt.read_text())["results"]
    assert 2 <= len(kept) < 6

    second = _analyze(*args)
    assert second.returncode == 0, second.stdout + second.stderr
    results = _summary(out)["results"]
    assert [_point_key(r["point"]) for r in results] == [
        "shipped@c1", "shipped@c2", "i1_b8_dyn0@c1", "i1_b8_dyn0@c2",
        "i2_b8_dyn0@c1", "i2_b8_dyn0@c2",
    ]  # fmt: skip
    assert all(r["measurement"]["error"] is None for r in results)
    assert results[: len(kept)] == kept  # replayed from the checkpoint, not measured again


def test_quick_search_with_the_builtin_load_generator(tmp_path: Path) -> None:
    """``--search quick`` climbs from the smallest values; ``--load-generator builtin`` (no
    perf_analyzer) measures; ``--min-throughput`` and ``--max-memory`` are respected."""
    repo = copy_models(tmp_path / "repo", "add_sub")
    out = tmp_path / "out"
    proc = _analyze(
        "--model", "add_sub", "--model-repository", str(repo), "--output", str(out),
        "--search", "quick", "--max-points", "4", "--load-generator", "builtin",
        "--instance-counts", "1,2", "--max-batch-sizes", "1,8", "--max-queue-delays-us", "0",
        "--concurrency", "1,2", "--measurement-interval-ms", "250",
        "--min-throughput", "20", "--max-memory", "2GiB",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = _summary(out)
    assert s["load_generator"] == "triton-mp builtin (HTTP/REST closed loop)"
    keys = [_point_key(r["point"]) for r in s["results"]]
    # the shipped config at each concurrency, then the climb: its start, then neighbours
    assert keys[:3] == ["shipped@c1", "shipped@c2", "i1_b1_dyn0@c1"]
    assert len(keys) == 2 + 4
    assert set(keys[3:]) <= {"i2_b1_dyn0@c1", "i1_b8_dyn0@c1", "i1_b1_dyn0@c2"}
    for rec in s["recommendations"]:
        m = next(r for r in s["results"] if _point_key(r["point"]) == rec["point"])["measurement"]
        assert m["throughput_per_s"] >= 20
        assert sum(p["rss_bytes"] for p in m["processes"]) <= 2 << 30
    assert s["recommendations"]
