"""An idle server costs nothing: after traffic stops, its whole process tree uses less than
1% of a core. Whatever polls or spins on the request path (the frontend's ring polling and
its poll after a worker's early wake, the scheduler's and workers' bounded spins before
sleeping) must stop when the work does.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BENCH_REPOSITORY = Path(__file__).resolve().parents[2] / "bench" / "model_repository"
TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int) -> float:
    """user+system CPU seconds of ``root`` and its live descendants."""
    parent, ticks = {}, {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(d)] = int(fields[1])
            ticks[int(d)] = int(fields[11]) + int(fields[12])
    total, todo, seen = 0, [root], 0
    while todo:
        pid = todo.pop()
        if pid in ticks:
            seen += 1
            total += ticks[pid]
            todo += [p for p, pp in parent.items() if pp == pid]
    assert seen >= 4, "the server's process tree was not found"
    return total / TICK


def _infer(client: grpcclient.InferenceServerClient, n: int, model: str = "add_sub_py") -> None:
    a = np.ones((1, 16), np.float32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [1, 16], "FP32")
        i.set_data_from_numpy(a)
        inputs.append(i)
    for _ in range(n):
        out = client.infer(model, inputs).as_numpy("OUTPUT0")
        assert out is not None
        assert float(out[0, 0]) == 2.0


def test_an_idle_server_uses_under_one_percent_of_a_core(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(BENCH_REPOSITORY, repo)
    # NOTE: and without a batching delay: its requests are handed straight to the worker,
    # and the frontend polls for the answer (``linger.AnswerDue``).
    nodelay = repo / "add_sub_py_nodelay"
    shutil.copytree(repo / "add_sub_py", nodelay)
    cfg = nodelay / "config.pbtxt"
    text = re.sub(r"dynamic_batching\s*\{[^}]*\}", "dynamic_batching { }", cfg.read_text())
    cfg.write_text(text.replace('name: "add_sub_py"', 'name: "add_sub_py_nodelay"'))
    assert "dynamic_batching { }" in cfg.read_text()
    assert "add_sub_py_nodelay" in cfg.read_text()
    server = start_server(repo)
    clients = [server.client() for _ in range(8)]
    try:
        deadline = time.monotonic() + 120
        while not all(clients[0].is_model_ready(m) for m in ("add_sub_py", "add_sub_py_nodelay")):
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
        # Traffic first, from 8 threads at once: the spins and polls adapt to a busy server
        # and must still stop once it is idle.
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda c: _infer(c, 200), clients))
        # Then one at a time: each short batch wakes the frontend early, and the frontend
        # polls for its answer (workers.prewake); that poll too must end with the work.
        _infer(clients[0], 200)
        _infer(clients[0], 300, "add_sub_py_nodelay")
        time.sleep(1.0)
        c0, t0 = _tree_cpu_s(server.pid), time.monotonic()
        time.sleep(5.0)
        c1, t1 = _tree_cpu_s(server.pid), time.monotonic()
    finally:
        for c in clients:
            c.close()
    cores = (c1 - c0) / (t1 - t0)
    assert cores < 0.01, f"idle server used {cores:.3f} cores over {t1 - t0:.1f} s"
