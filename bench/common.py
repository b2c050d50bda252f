"""What the benchmarks in bench/ share, under the one name they import: ``common``.

The scripts run as ``python bench/NAME.py`` (bench/ on ``sys.path``) and import ``common``; its
names come from three modules by concept, plus the perf_analyzer run and table helpers here:
- ``peers_env``: paths, ``BenchError``, ``ensure_peers`` / ``load_peers_env`` (the peers).
- ``procs``: the machine and its processes through /proc and /dev/shm (CPU seconds, process
  trees by PID and start time, shared-memory entries, free ports).
- ``servers``: ``ManagedServer`` and its ``TritonMP`` / ``Triton`` / ``Floor``.
- here: ``run_pa`` (one perf_analyzer measurement through ``bench/pa_run.py``), ``other_cores``,
  ``last_line``, and ``fmt`` / ``med`` (table cells and medians that tolerate missing values).

Standard library only at import time.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from peers_env import (
    BENCH,
    DEFAULT_PA_RUN,
    DEFAULT_PEERS_ENV,
    PEERS_SCRIPTS,
    ROOT,
    BenchError,
    ensure_peers,
    load_peers_env,
)
from procs import (
    TICK,
    alive,
    cmdline,
    descendants,
    free_ports,
    kill_tree_leftovers,
    machine_busy_seconds,
    proc_table,
    shm_in_use,
    shm_names,
    start_ticks,
    tree_cpu_seconds,
)
from servers import Floor, ManagedServer, Triton, TritonMP

__all__ = [
    "BENCH",
    "DEFAULT_PA_RUN",
    "DEFAULT_PEERS_ENV",
    "PEERS_SCRIPTS",
    "ROOT",
    "TICK",
    "BenchError",
    "Floor",
    "ManagedServer",
    "Triton",
    "TritonMP",
    "alive",
    "cmdline",
    "descendants",
    "ensure_peers",
    "fmt",
    "free_ports",
    "kill_tree_leftovers",
    "last_line",
    "load_peers_env",
    "machine_busy_seconds",
    "med",
    "other_cores",
    "proc_table",
    "run_pa",
    "shm_in_use",
    "shm_names",
    "start_ticks",
    "tree_cpu_seconds",
]


# --------------------------------------------------------------------------- perf_analyzer


def run_pa(
    pa_run: Path,
    peers_env: dict[str, str],
    server: ManagedServer,
    label: str,
    pa_args: list[str],
    window_ms: int,
    attempts: int,
    jsonl: Path,
    protocol: str = "grpc",
) -> dict[str, Any]:
    """One perf_analyzer measurement through pa_run.py, over gRPC (against server.url) or
    HTTP/REST (``protocol="http"``, against 127.0.0.1:server.http).

    pa_args: what follows ``perf_analyzer -i PROTOCOL -u URL -p WINDOW``. Returns pa_run's
    record (throughput, p50_us, p99_us, client/server/machine cores, server queue/compute us,
    ...), or {"error": ...} without throughput when perf_analyzer gave no result."""
    assert server.pid is not None
    url = server.url if protocol == "grpc" else f"127.0.0.1:{server.http}"
    pa = [
        peers_env["PERF_ANALYZER"],
        "-i",
        protocol,
        "-u",
        url,
        "-p",
        str(window_ms),
        *pa_args,
    ]
    cmd = [
        sys.executable,
        str(pa_run),
        "--label",
        label,
        "--server-pid",
        str(server.pid),
        "--out",
        str(jsonl),
        "--attempts",
        str(attempts),
        "--",
        *pa,
    ]
    # perf_analyzer needs 3 stable windows; allow it ten, per attempt, plus start-up.
    timeout = attempts * (10 * window_ms / 1000 + 60)
    p = subprocess.Popen(
        cmd, env=peers_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException as e:  # timeout, or Ctrl-C: end pa_run and its perf_analyzer by PID
        tree = descendants(p.pid)
        p.kill()
        kill_tree_leftovers(tree, grace=0)
        p.communicate()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        return {"label": label, "rc": None, "error": f"no result after {timeout:.0f} s"}
    server.snapshot()
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        return {
            "label": label,
            "rc": p.returncode,
            "error": (out + err).strip()[-600:] or "pa_run printed nothing",
        }
    rec: dict[str, Any] = json.loads(lines[-1])
    if rec.get("throughput") is None and not rec.get("error"):
        rec["error"] = "perf_analyzer failed"
    return rec


def other_cores(rec: dict[str, Any]) -> float | None:
    """Cores the rest of the machine used during a pa_run record: busy - client - server."""
    try:
        return round(
            max(
                0.0,
                float(rec["machine_cores_busy"])
                - float(rec["client_cores"])
                - float(rec["server_cores"]),
            ),
            2,
        )
    except (KeyError, TypeError):
        return None


def last_line(text: str | None, limit: int = 200) -> str:
    """The last non-empty line of an error text, cut to `limit` characters."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return (lines[-1] if lines else "failed")[-limit:]


# --------------------------------------------------------------------------- report


def fmt(v: Any, spec: str) -> str:
    """format(v, spec), or a dash as wide as the spec's width when v is None."""
    width = re.match(r"\d*", spec).group()  # type: ignore[union-attr]  # \d* always matches
    return ("-".rjust(int(width)) if width else "-") if v is None else format(v, spec)


def med(values: list[Any]) -> Any:
    """Median of the values that are not None (an int stays an int); None when there are none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    return type(vals[0])(m) if isinstance(vals[0], int) else m
