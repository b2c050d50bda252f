"""Soak: 64 clients against one triton-mp server for N minutes, watching every process's RSS.

Not a CI test (30 minutes by default). It starts ``triton-mp start`` (this checkout) on a
copy of ``add_sub`` (onnxruntime, dynamic batching) and ``add_sub_py`` (python backend), runs
``--clients`` threads that each infer in a loop over gRPC with random batch sizes (1..8) and
check every answer, samples the resident memory of every server process every
``--sample-s`` seconds (processes named by their titles: ``triton-mp: worker add_sub_0_0``;
the supervisor is the root), and stops the server at the end, checking it stops cleanly
(no process and no /dev/shm entry left).

Prints a table (RSS at start and end, max, growth per process; requests and errors) and
writes every sample to ``--json``::

    python bench/soak.py                 # 30 minutes
    python bench/soak.py --minutes 1     # a smoke run
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tritonclient.grpc as grpcclient  # type: ignore[import-untyped]
from common import ROOT, TritonMP
from tritonclient.utils import InferenceServerException  # type: ignore[import-untyped]

MODELS = ("add_sub", "add_sub_py")
MIB = 1 << 20


def server_processes(root_pid: int) -> dict[str, psutil.Process]:
    """Role/instance title -> process for the server tree (the root is the supervisor)."""
    out = {"supervisor": psutil.Process(root_pid)}
    for p in out["supervisor"].children(recursive=True):
        try:
            title = " ".join(p.cmdline()).strip()
        except psutil.Error:
            continue
        if title.startswith("triton-mp: "):
            name = title.removeprefix("triton-mp: ")
        elif "resource_tracker" in title:
            name = "resource tracker"
        else:
            name = f"pid {p.pid}"
        out[name] = p
    return out


def _status_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def sample_rss(procs: dict[str, psutil.Process]) -> dict[str, dict[str, int | None]]:
    """Per process, in bytes: ``rss`` (all resident pages), ``anon`` (RssAnon: the
    process's own heap, where a leak shows) and ``shmem`` (RssShmem: pages of shared-memory
    rings and arenas it has touched, which grow until the rings and arenas have wrapped)."""
    out: dict[str, dict[str, int | None]] = {}
    for name, p in procs.items():
        try:
            rss: int | None = p.memory_info().rss
        except psutil.Error:
            rss = None
        out[name] = {
            "rss": rss,
            "anon": _status_kib(p.pid, "RssAnon"),
            "shmem": _status_kib(p.pid, "RssShmem"),
        }
    return out


class Clients:
    """``n`` threads, each with its own gRPC client, inferring until stopped."""

    def __init__(self, url: str, n: int, seed: int) -> None:
        self.ok = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.first_errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(url, seed + i), daemon=True) for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def _run(self, url: str, seed: int) -> None:
        rng = random.Random(seed)
        client = grpcclient.InferenceServerClient(url)
        try:
            while not self._stop.is_set():
                model = rng.choice(MODELS)
                b = rng.randint(1, 8)
                a = np.full((b, 16), rng.randint(0, 100), np.float32)
                inputs = []
                for name in ("INPUT0", "INPUT1"):
                    i = grpcclient.InferInput(name, [b, 16], "FP32")
                    i.set_data_from_numpy(a)
                    inputs.append(i)
                try:
                    res = client.infer(model, inputs, client_timeout=60)
                    if not np.array_equal(res.as_numpy("OUTPUT0"), a + a):
                        raise ValueError(f"{model}: wrong OUTPUT0")
                except (InferenceServerException, ValueError) as e:
                    key = e.status() if isinstance(e, InferenceServerException) else "wrong answer"
                    with self._lock:
                        self.errors[str(key)] += 1
                        if len(self.first_errors) < 5:
                            self.first_errors.append(str(e)[:300])
                    continue
                with self._lock:
                    self.ok += 1
        finally:
            client.close()

    def stop(self, timeout_s: float = 120) -> int:
        """Stop; returns how many threads did not finish in time (hung clients)."""
        self._stop.set()
        end = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        return sum(t.is_alive() for t in self._threads)


def mib(v: int | None) -> str:
    return "-" if v is None else f"{v / MIB:.1f}"


def report(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per process: RSS and RssAnon at the first and last sample, max RSS (MiB)."""
    names: list[str] = []
    for s in samples:
        names += [n for n in s["rss"] if n not in names]
    rows = []
    for n in names:
        seen = [s["rss"][n] for s in samples if n in s["rss"] and s["rss"][n]["rss"] is not None]
        if not seen:
            continue

        def m(v: int | None) -> float | None:
            return None if v is None else round(v / MIB, 1)

        rows.append(
            {
                "process": n,
                "rss_start_mib": m(seen[0]["rss"]),
                "rss_end_mib": m(seen[-1]["rss"]),
                "rss_max_mib": m(max(x["rss"] for x in seen)),
                "anon_start_mib": m(seen[0]["anon"]),
                "anon_end_mib": m(seen[-1]["anon"]),
                "shmem_end_mib": m(seen[-1]["shmem"]),
            }
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between RSS samples")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="load before the first sample")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-arg", action="append", default=[], help="extra start flag")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="triton_mp_soak_"))
    repo = work / "repo"
    for m in MODELS:
        shutil.copytree(ROOT / "model_repository" / m, repo / m)
    server = TritonMP(repo, work / "server.log", extra_args=args.server_arg)
    samples: list[dict[str, Any]] = []
    hung = 0
    clients: Clients | None = None
    try:
        failed = server.start(list(MODELS))
        if failed:
            print(f"models failed to load: {failed}", file=sys.stderr)
            return 1
        assert server.pid is not None
        clients = Clients(server.url, args.clients, args.seed)
        time.sleep(args.warmup_s)
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        ok0 = clients.ok
        while True:
            now = time.monotonic()
            procs = server_processes(server.pid)
            samples.append(
                {
                    "t_s": round(now - t0, 1),
                    "ok": clients.ok - ok0,
                    "errors": sum(clients.errors.values()),
                    "rss": sample_rss(procs),
                }
            )
            last = samples[-1]
            print(
                f"t={last['t_s']:7.1f}s ok={last['ok']:8d} errors={last['errors']:5d} "
                + " ".join(f"{n}={mib(v['rss'])}" for n, v in last["rss"].items()),
                flush=True,
            )
            if now >= end:
                break
            time.sleep(min(args.sample_s, max(0.0, end - now)))
        hung = clients.stop()
        ok = clients.ok - ok0
        elapsed = time.monotonic() - t0
    finally:
        if clients is not None:
            clients.stop(10)
        stop = server.stop()
    rows = report(samples)
    print()
    cols = ("rss_start_mib", "rss_end_mib", "rss_max_mib", "anon_start_mib", "anon_end_mib",
            "shmem_end_mib")  # fmt: skip
    print(
        f"{'process (MiB)':28}"
        + "".join(f"{c.removesuffix('_mib').replace('_', ' '):>11}" for c in cols)
    )
    for r in rows:
        print(
            f"{r['process']:28}"
            + "".join(f"{'-' if r[c] is None else format(r[c], '.1f'):>11}" for c in cols)
        )
    total_err = sum(clients.errors.values()) if clients else 0
    print(
        f"\n{args.clients} clients, {elapsed / 60:.1f} min: {ok} requests answered "
        f"({ok / elapsed:.0f}/s), {total_err} errors {dict(clients.errors) if clients else {}}, "
        f"{hung} hung clients"
    )
    for e in clients.first_errors if clients else []:
        print("  error:", e)
    print(server.stop_line())
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "minutes": args.minutes,
                "clients": args.clients,
                "requests_ok": ok,
                "errors": dict(clients.errors) if clients else {},
                "hung_clients": hung,
                "processes": rows,
                "samples": samples,
                "server": stop,
            },
            indent=1,
        )
    )
    print(f"samples: {args.json}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if total_err == 0 and hung == 0 and stop.get("clean") else 1


if __name__ == "__main__":
    sys.exit(main())
