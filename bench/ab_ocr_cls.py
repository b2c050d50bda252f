#!/usr/bin/env python3
"""Two or more triton-mp commits on ocr_cls, measured side by side in one run.

    python bench/ab_ocr_cls.py before=f5d440e after=HEAD --rounds 5
    python bench/ab_ocr_cls.py before=f5d440e after=HEAD --scheduler none --concurrency 1

Each variant NAME=REV is src/ as committed at REV (git archive). Every variant's server is
started at once, each on free ports; idle, they use no CPU (checked and printed). Then, per
round, perf_analyzer (through bench/pa_run.py) runs against each server in turn, the
order reversed every other round, so load from other users of the machine falls on every
variant alike. Per round the throughput of each variant is divided by the first variant's;
the table gives the median of those ratios, the medians of the absolute figures, and the cores
each role used (frontend, scheduler, worker, perf_analyzer) per run.

``--scheduler none`` serves ocr_cls without its dynamic_batching block, as bench_ocr_cls.py's
"none" variant does. Exit status 0 when every run measured and every server stopped clean.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/common.py: bench/ is on sys.path when this runs as a script
from bench_ocr_cls import export_commit, unbatched_repository
from common import ROOT, BenchError, TritonMP, descendants
from ocr_cls_ort import INPUT_NAME, INPUT_SHAPE, MODEL, locate_model
from procs import main_thread_ns, sleep_shares
from vs_triton_workloads import OCR_2CORE_MODEL, ocr_2core_config

TICK = os.sysconf("SC_CLK_TCK")


def role_cpu_seconds(pids: list[int]) -> dict[int, tuple[str, float]]:
    """pid -> (role, user+system CPU seconds) for the server's processes."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
        except OSError:
            continue
        role = (
            cmd.removeprefix("triton-mp: ").split()[0]
            if cmd.startswith("triton-mp: ")
            else "supervisor"
        )
        out[pid] = (role, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def run_with_roles(
    server: TritonMP,
    model: str,
    label: str,
    concurrency: int,
    pa_run: Path,
    peers_env: dict[str, str],
    window_ms: int,
    attempts: int,
    jsonl: Path,
    extra: tuple[str, ...] = (),
) -> tuple[dict[str, Any], dict[int, tuple[str, float]]]:
    """One perf_analyzer run of ``model`` (ocr_cls or its 2-core twin) against ``server``
    (through pa_run.py, ``extra`` appended to its arguments); returns its record and, per
    process of the server's tree alive at both ends, (role, cores it used over the run).
    The record's ``instance_shares`` gives each worker's main thread's shares of the run's
    wall time: ``run`` (on a CPU), ``runqueue`` (runnable, waiting for a CPU) and ``sleep``
    (the rest: waiting for a batch), as fractions."""
    assert server.pid is not None
    pids = [server.pid] + [p for p, _ in descendants(server.pid)]
    c0, t0 = role_cpu_seconds(pids), time.monotonic()
    s0 = main_thread_ns(pids)
    pa_args = [
        "-m",
        model,
        "--concurrency-range",
        str(concurrency),
        "--shape",
        f"{INPUT_NAME}:{','.join(map(str, INPUT_SHAPE))}",
        *extra,
    ]
    rec = common.run_pa(pa_run, peers_env, server, label, pa_args, window_ms, attempts, jsonl)
    c1, s1, dt = role_cpu_seconds(pids), main_thread_ns(pids), time.monotonic() - t0
    cores = {pid: (role, (cpu - c0[pid][1]) / dt) for pid, (role, cpu) in c1.items() if pid in c0}
    workers = [pid for pid, (role, _) in c1.items() if role == "worker"]
    rec["instance_shares"] = sleep_shares(
        {p: s0[p] for p in workers if p in s0}, {p: s1[p] for p in workers if p in s1}, dt
    )
    return rec, cores


def per_image_line(rec: dict[str, Any]) -> str:
    """``; CPU us/image: role N ...`` from a run's role cores and throughput (images/s), or
    "" when the run measured no throughput."""
    rate = rec.get("throughput")
    if not rate:
        return ""
    cores = dict(sorted(rec["role_cores"].items()))
    cores["perf_analyzer"] = rec.get("client_cores") or 0.0
    return "; CPU us/image: " + " ".join(f"{k} {v / rate * 1e6:.0f}" for k, v in cores.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", metavar="NAME=REV")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--scheduler", choices=("dynamic", "none"), default="dynamic")
    ap.add_argument(
        "--config",
        choices=("shipped", "2core"),
        default="shipped",
        help="2core: ocr_cls as vs_triton_workloads.ocr_2core_config rewrites it (served as "
        "ocr_cls_2core, issue 33's goal); shipped: the repository's config as it is",
    )
    ap.add_argument("--window-ms", type=int, default=2000, help="perf_analyzer -p")
    ap.add_argument(
        "--repository",
        type=Path,
        default=ROOT / "model_repository",
        help="where ocr_cls is taken from; served alone (default: %(default)s)",
    )
    ap.add_argument("--peers-env", type=Path, default=ROOT / ".peers" / "peers.env")
    ap.add_argument("--pa-run", type=Path, default=common.DEFAULT_PA_RUN)
    ap.add_argument("--json", type=Path, help="write every record here")
    args = ap.parse_args(argv)
    variants = [v.split("=", 1) for v in args.variants]
    if any(len(v) != 2 for v in variants) or len({n for n, _ in variants}) != len(variants):
        ap.error("variants are NAME=REV with distinct names")

    if args.config == "2core" and args.scheduler == "none":
        ap.error("--config 2core keeps the dynamic batcher: it cannot go with --scheduler none")
    model = OCR_2CORE_MODEL if args.config == "2core" else MODEL
    peers_env = common.load_peers_env(args.peers_env)
    temp: list[Path] = []
    servers: dict[str, TritonMP] = {}
    records: list[dict[str, Any]] = []
    ok = True
    try:
        onnx, _ = locate_model(args.repository.resolve(), None)
        repo = Path(tempfile.mkdtemp(prefix="ab_ocr_cls_repo."))
        temp.append(repo)
        if args.scheduler == "none":
            src_repo = unbatched_repository(args.repository, onnx)
            temp.append(src_repo)
            shutil.copytree(src_repo / MODEL, repo / MODEL)
        else:
            (repo / model / "1").mkdir(parents=True)
            text = (args.repository / MODEL / "config.pbtxt").read_text()
            if args.config == "2core":
                text = ocr_2core_config(text)
            (repo / model / "config.pbtxt").write_text(text)
            shutil.copyfile(onnx, repo / model / "1" / "model.onnx")
        extra = ["--disable-auto-complete-config"] if args.scheduler == "none" else []
        log_dir = Path(tempfile.mkdtemp(prefix="ab_ocr_cls."))
        for name, rev in variants:
            src = export_commit(rev)
            temp.append(src.parent)
            server = TritonMP(
                repo, log_dir / f"{name}.log", None, 120.0, 30.0, src=src, extra_args=extra
            )
            servers[name] = server
            failed = server.start([model])
            if failed:
                raise BenchError(f"{name}: {model} not ready: {failed[model]}")
        print(
            "idle cores per server:", {n: s.idle_cores(1.0) for n, s in servers.items()}, flush=True
        )
        names = [n for n, _ in variants]
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                rec, cores = run_with_roles(
                    servers[name],
                    model,
                    name,
                    args.concurrency,
                    args.pa_run,
                    peers_env,
                    args.window_ms,
                    2,
                    log_dir / "pa_runs.jsonl",
                )
                roles: dict[str, float] = {}
                for role, used in cores.values():
                    roles[role] = roles.get(role, 0.0) + used
                rec.update(
                    variant=name,
                    round=r + 1,
                    role_cores={k: round(v, 2) for k, v in roles.items() if v >= 0.005},
                )
                records.append(rec)
                ok = ok and rec.get("throughput") is not None
                print(
                    f"round {r + 1} {name:>12}: {common.fmt(rec.get('throughput'), '7.1f')} "
                    f"infer/s, p50 {common.fmt((rec.get('p50_us') or 0) / 1000, '6.2f')} ms, "
                    f"batch {common.fmt(rec.get('avg_batch'), '5.2f')}, cores: "
                    + " ".join(f"{k} {v:.2f}" for k, v in sorted(rec["role_cores"].items()))
                    + f" perf_analyzer {rec.get('client_cores')} other "
                    f"{common.other_cores(rec)}" + per_image_line(rec),
                    flush=True,
                )
    except BenchError as e:
        ok = False
        print(f"ERROR: {e}", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            info = server.stop()
            if not info.get("clean"):
                ok = False
                print(server.stop_line(), flush=True)
        for d in temp:
            shutil.rmtree(d, ignore_errors=True)

    first = variants[0][0]
    print(
        f"\n{model} ({args.scheduler} scheduler), perf_analyzer c={args.concurrency}, "
        f"{args.rounds} rounds; rel = infer/s / {first}'s in the same round (median)"
    )
    summary = []
    for name, rev in variants:
        mine = {r["round"]: r for r in records if r["variant"] == name and r.get("throughput")}
        base = {r["round"]: r for r in records if r["variant"] == first and r.get("throughput")}
        rel = [mine[k]["throughput"] / base[k]["throughput"] for k in sorted(mine) if k in base]
        row = {
            "variant": name,
            "rev": rev,
            "rounds_ok": len(mine),
            "throughput": common.med([r["throughput"] for r in mine.values()]),
            "p50_ms": common.med([r["p50_us"] / 1000 for r in mine.values()]),
            "server_cores": common.med([r.get("server_cores") for r in mine.values()]),
            "rel": round(statistics.median(rel), 3) if rel else None,
            "rel_per_round": [round(x, 3) for x in rel],
        }
        summary.append(row)
        print(
            f"  {name:>12} ({rev}): {common.fmt(row['throughput'], '7.1f')} infer/s, p50 "
            f"{common.fmt(row['p50_ms'], '6.2f')} ms, server {row['server_cores']} cores, "
            f"rel {common.fmt(row['rel'], '5.3f')} {row['rel_per_round']}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "options": {k: str(v) for k, v in vars(args).items()},
                    "records": records,
                    "summary": summary,
                    "ok": ok,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
