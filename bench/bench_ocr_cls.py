#!/usr/bin/env python3
"""triton-mp's throughput on the OCR classifier, with and without dynamic batching, as a ratio
of raw onnxruntime's.

One invocation does, per round (``--rounds``, default 1):

1. raw onnxruntime, in this process, on ``ocr_cls/1/model.onnx``: one InferenceSession with
   default CPU settings and one with ``intra_op_num_threads=1``, batch sizes 1..32, images/s;
   the best of all of them is "raw ORT best batched throughput" (nothing else runs meanwhile);
2. for each scheduler variant (``--schedulers``, default both; their order alternates between
   rounds):

   - ``dynamic``: ``triton-mp start`` on the repository as it is (ocr_cls has
     ``dynamic_batching``);
   - ``none``: ``triton-mp start --disable-auto-complete-config`` on a temporary repository
     holding only ocr_cls, with the same config minus its ``dynamic_batching`` block
     (``max_batch_size`` kept, so clients send the same requests): Triton's default scheduler,
     one request per execution. Auto-complete is off because it would add
     ``dynamic_batching`` back (Triton's onnxruntime backend does so for a model with
     ``max_batch_size`` > 1 and no scheduler); the effective config is checked over gRPC;

   on free ports, ready when the gRPC server and the model report ready, then perf_analyzer
   (gRPC, through ``bench/pa_run.py``) at concurrency 1, 8 and 32, 3 s windows; then the
   server is stopped (SIGINT, then SIGKILL after ``--stop-timeout``) and checked for leftover
   processes and ``/dev/shm`` entries named ``triton_mp*``.

It prints the tables, the ratio triton-mp / raw-ORT-best per variant and concurrency and the
ratio dynamic / none (medians over rounds), and writes everything to ``--json``. Exit status:
0 when every measurement ran and every server left nothing behind, 1 otherwise (the tables
still print what was measured). See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/common.py: bench/ is on sys.path when this runs as a script
from common import DEFAULT_PA_RUN, ROOT, BenchError, TritonMP, fmt, machine_busy_seconds
from exports import export_commit
from ocr_cls_ort import INPUT_NAME, INPUT_SHAPE, MODEL, locate_model, measure_ort, sha256
from ocr_cls_report import SCHEDULERS, comparison_table, ort_table, server_table, summarise

# --------------------------------------------------------------------------- servers


def unbatched_repository(repo: Path, onnx: Path) -> Path:
    """A new temporary repository holding only ocr_cls: the repository's config without its
    ``dynamic_batching`` block (everything else, max_batch_size included, unchanged) and a
    copy of the ONNX file. The caller removes it."""
    from google.protobuf import text_format

    from triton_mp._proto import model_config_pb2

    config = model_config_pb2.ModelConfig()
    text_format.Parse((repo / MODEL / "config.pbtxt").read_text(), config)
    if not config.HasField("dynamic_batching"):
        raise BenchError(f"{repo / MODEL / 'config.pbtxt'} has no dynamic_batching to remove")
    config.ClearField("dynamic_batching")
    dest = Path(tempfile.mkdtemp(prefix="bench_ocr_cls_repo."))
    (dest / MODEL / "1").mkdir(parents=True)
    (dest / MODEL / "config.pbtxt").write_text(
        "# bench_ocr_cls.py: the repository's ocr_cls without dynamic_batching\n"
        + text_format.MessageToString(config)
    )
    shutil.copyfile(onnx, dest / MODEL / "1" / "model.onnx")
    return dest


def effective_scheduling(server: TritonMP) -> str:
    """Which scheduler the running server reports in ocr_cls's effective config
    (ModelConfig RPC): "dynamic", "sequence", "ensemble" or "none"."""
    import tritonclient.grpc as grpcclient  # type: ignore[import-untyped]

    client = grpcclient.InferenceServerClient(server.url)
    try:
        cfg = client.get_model_config(MODEL, as_json=True, client_timeout=5)["config"]
    finally:
        client.close()
    for key, name in (
        ("dynamic_batching", "dynamic"),
        ("sequence_batching", "sequence"),
        ("ensemble_scheduling", "ensemble"),
    ):
        if key in cfg:
            return name
    return "none"


def triton_mp_version(args: argparse.Namespace) -> str:
    """Which triton-mp runs: a commit, a src/ folder, the checkout (and whether its src/ has
    uncommitted changes), or the --server-cmd."""
    if args.server_cmd:
        return f"--server-cmd {args.server_cmd!r}"
    if args.mp_src is not None and args.mp_commit is None:
        return f"src/ at {args.mp_src}"

    def git(*a: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *a], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        if args.mp_commit:
            return f"commit {git('rev-parse', '--short', args.mp_commit + '^{commit}')}"
        dirty = git("status", "--porcelain", "--", "src")
        return f"checkout at {git('rev-parse', '--short', 'HEAD')}" + (
            " + uncommitted changes in src/" if dirty else ""
        )
    except (OSError, subprocess.CalledProcessError):
        return "checkout (no git)"


# --------------------------------------------------------------------------- perf_analyzer


def wait_quiet(args: argparse.Namespace) -> float | None:
    """With --quiet-cores Q: wait (up to --quiet-wait seconds) until the whole machine uses
    less than Q cores over 2 s, so a measurement does not start while someone else's tests or
    benchmarks run. Returns the waited seconds, or None when the machine stayed busy (the
    measurement then runs anyway and its 'other' cores tell)."""
    if args.quiet_cores is None:
        return 0.0
    t0 = time.monotonic()
    while True:
        b0 = machine_busy_seconds()
        time.sleep(2.0)
        if (machine_busy_seconds() - b0) / 2.0 < args.quiet_cores:
            return round(time.monotonic() - t0, 1)
        if time.monotonic() - t0 > args.quiet_wait:
            print(
                f"  machine still busy after {args.quiet_wait:.0f} s; measuring anyway", flush=True
            )
            return None


def run_pa(
    args: argparse.Namespace,
    peers_env: dict[str, str],
    server: TritonMP,
    conc: int,
    jsonl: Path,
    scheduler: str,
) -> dict[str, Any]:
    rec = common.run_pa(
        args.pa_run,
        peers_env,
        server,
        f"triton-mp ocr_cls {scheduler} c={conc}",
        [
            "-m",
            MODEL,
            "--concurrency-range",
            str(conc),
            "--shape",
            f"{INPUT_NAME}:{','.join(map(str, INPUT_SHAPE))}",
        ],
        args.window_ms,
        args.attempts,
        jsonl,
    )
    rec["concurrency"] = conc
    rec["scheduler"] = scheduler
    return rec


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--repository",
        type=Path,
        default=ROOT / "model_repository",
        help="model repository served by triton-mp (default: %(default)s)",
    )
    ap.add_argument(
        "--peers-env",
        type=Path,
        default=ROOT / ".peers" / "peers.env",
        help="env file written by install-peers.sh (default: %(default)s)",
    )
    ap.add_argument("--json", type=Path, help="write all results here as JSON")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="short windows (ORT 0.5 s per point, perf_analyzer -p 1000, 1 attempt):"
        " a smoke test, not a measurement",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="alternate raw ORT and triton-mp this many times; the ratio reported is "
        "the median over rounds (default: %(default)s; use 3+ for a figure that "
        "holds on a noisy machine)",
    )
    ap.add_argument("--concurrency", default="1,8,32", help="default: %(default)s")
    ap.add_argument(
        "--schedulers",
        default="dynamic,none",
        help="which triton-mp variants to measure: dynamic (the repository's "
        "ocr_cls), none (the same without dynamic_batching); "
        "default: %(default)s",
    )
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="raw ORT; default: %(default)s")
    ap.add_argument("--ort-only", action="store_true", help="measure raw onnxruntime only")
    ap.add_argument(
        "--onnx",
        type=Path,
        help="ONNX file for raw ORT (default: the repository's ocr_cls/1/model.onnx, "
        "else the rapidocr-onnxruntime wheel's copy)",
    )
    ap.add_argument(
        "--server-cmd",
        help="command that starts the server, before --model-repository etc. "
        "(default: this checkout's, 'python -m triton_mp start' with src/ "
        "first on PYTHONPATH)",
    )
    ap.add_argument(
        "--mp-commit",
        metavar="REV",
        help="run triton-mp as committed at REV (its src/ exported with git archive "
        "to a temporary folder), not the working tree",
    )
    ap.add_argument(
        "--mp-src",
        type=Path,
        metavar="DIR",
        help="run triton-mp from this src/ folder instead of the checkout's",
    )
    ap.add_argument(
        "--quiet-cores",
        type=float,
        metavar="Q",
        help="before each raw ORT series and each perf_analyzer run, wait until "
        "the whole machine uses less than Q cores (e.g. 0.15): on a shared "
        "machine, others' tests otherwise take a changing share of the cores",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=600.0,
        help="with --quiet-cores: wait at most this many seconds, then measure "
        "anyway (default: %(default)s)",
    )
    ap.add_argument("--pa-run", type=Path, default=DEFAULT_PA_RUN, help="default: %(default)s")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--stop-timeout", type=float, default=30.0)
    a = ap.parse_args(argv)
    a.concurrency = [int(x) for x in a.concurrency.split(",")]
    a.batch_sizes = [int(x) for x in a.batch_sizes.split(",")]
    a.schedulers = [x for x in a.schedulers.split(",") if x]
    unknown = set(a.schedulers) - set(SCHEDULERS)
    if unknown or not a.schedulers:
        ap.error(f"--schedulers: expected some of {', '.join(SCHEDULERS)}, got {a.schedulers}")
    if sum(x is not None for x in (a.server_cmd, a.mp_commit, a.mp_src)) > 1:
        ap.error("--server-cmd, --mp-commit and --mp-src exclude each other")
    a.repository = a.repository.resolve()
    if a.mp_src is not None:
        a.mp_src = a.mp_src.resolve()
    a.window_ms = 1000 if a.quick else 3000
    a.attempts = 1 if a.quick else 3
    a.ort_seconds, a.ort_warmup = (0.5, 0.2) if a.quick else (3.0, 0.5)
    return a


def measure_server(
    args: argparse.Namespace,
    peers_env: dict[str, str],
    rnd: dict[str, Any],
    scheduler: str,
    repository: Path,
    log_dir: Path,
    jsonl: Path,
) -> bool:
    """Start one triton-mp variant, run perf_analyzer at every concurrency, stop it.
    Appends the records to rnd["triton_mp"] and the server's info to rnd["servers"];
    returns False when something failed (rnd["errors"][scheduler] says what, when the server
    could not serve at all)."""
    i = rnd["round"]
    extra = ["--disable-auto-complete-config"] if scheduler == "none" else []
    kw: dict[str, Any] = {} if args.mp_src is None else {"src": args.mp_src}
    server = TritonMP(
        repository,
        log_dir / f"triton-mp-{scheduler}-round{i}.log",
        args.server_cmd,
        args.start_timeout,
        args.stop_timeout,
        extra_args=extra,
        **kw,
    )
    rnd["servers"][scheduler] = server.info
    print(f"round {i}/{args.rounds}, {SCHEDULERS[scheduler]}: {server.info['cmd']}", flush=True)
    ok = True
    try:
        failed = server.start([MODEL])
        if failed:
            raise BenchError(f"{MODEL} not ready: {failed[MODEL]}\n{server.log_tail()}")
        sched = effective_scheduling(server)
        server.info["effective_scheduling"] = sched
        if sched != scheduler:
            raise BenchError(
                f"{MODEL}'s effective config has scheduler {sched!r}, expected {scheduler!r}"
            )
        print(
            f"  ready after {server.info['ready_s']} s, "
            f"{server.info['processes_when_ready']} processes",
            flush=True,
        )
        for c in args.concurrency:
            waited = wait_quiet(args)
            rec = run_pa(args, peers_env, server, c, jsonl, scheduler)
            rec["waited_for_quiet_s"] = waited
            if rec.get("throughput") is not None:
                rec["ratio"] = round(rec["throughput"] / rnd["ort_best"]["infer_per_s"], 3)
                print(
                    f"  c={c}: {rec['throughput']:.1f} infer/s, ratio {rec['ratio']:.3f}"
                    f", p50 {rec['p50_us'] / 1000:.2f} ms, batch "
                    f"{fmt(rec.get('avg_batch'), '.2f')}",
                    flush=True,
                )
            else:
                ok = False
                print(f"  c={c}: FAILED: {rec.get('error', '')[-300:]}", flush=True)
            rnd["triton_mp"].append(rec)
    except BenchError as e:
        ok = False
        rnd.setdefault("errors", {})[scheduler] = str(e)
        print(f"  ERROR: {e}", flush=True)
    finally:
        info = server.stop()
        print(f"  {server.stop_line()}", flush=True)
        ok = ok and bool(info.get("clean"))
        if not info.get("clean"):
            print(server.log_tail(), flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy
    import onnxruntime

    cpus = len(os.sched_getaffinity(0))
    result: dict[str, Any] = {
        "benchmark": "ocr_cls: triton-mp with and without dynamic batching vs raw onnxruntime",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {
            "node": platform.node(),
            "cpus_usable": cpus,
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__,
            "numpy": numpy.__version__,
        },
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "rounds": [],
    }
    ok = True
    temp_dirs: list[Path] = []
    schedulers = list(args.schedulers)
    try:
        onnx, source = locate_model(args.repository, args.onnx)
        result["model"] = {"path": str(onnx), "source": source, "sha256": sha256(onnx)}
        print(
            f"raw onnxruntime {onnxruntime.__version__} on {onnx} ({source}), {cpus} CPUs",
            flush=True,
        )
        peers_env = None if args.ort_only else common.load_peers_env(args.peers_env)
        if not args.ort_only:
            if not args.pa_run.is_file():
                raise BenchError(f"{args.pa_run} not found (--pa-run)")
            result["triton_mp"] = triton_mp_version(args)
            if args.mp_commit:
                args.mp_src = export_commit(args.mp_commit)
                temp_dirs.append(args.mp_src.parent)
            print(f"triton-mp: {result['triton_mp']}", flush=True)
        repositories = {"dynamic": args.repository}
        if "none" in schedulers and not args.ort_only:
            repositories["none"] = unbatched_repository(args.repository, onnx)
            temp_dirs.append(repositories["none"])
        result["repositories"] = {k: str(v) for k, v in repositories.items()}
        log_dir = Path(tempfile.mkdtemp(prefix="bench_ocr_cls."))
        result["log_dir"] = str(log_dir)
        jsonl = log_dir / "pa_runs.jsonl"
        for i in range(1, args.rounds + 1):
            rnd: dict[str, Any] = {"round": i}
            result["rounds"].append(rnd)
            print(f"round {i}/{args.rounds}: raw onnxruntime", flush=True)
            rows = []
            rnd["ort_waited_for_quiet_s"] = wait_quiet(args)
            for threads in (None, 1):
                r, sig = measure_ort(
                    onnx, threads, args.batch_sizes, args.ort_seconds, args.ort_warmup
                )
                rows += r
            result["model"]["signature"] = sig
            rnd["ort"] = rows
            rnd["ort_best"] = max(rows, key=lambda r: r["infer_per_s"])
            if args.ort_only:
                continue
            assert peers_env is not None
            rnd["servers"] = {}
            rnd["triton_mp"] = []
            # NOTE: the variants take turns going first, so neither always runs on the
            # machine as the other left it.
            order = schedulers if i % 2 else schedulers[::-1]
            rnd["order"] = order
            for sched in order:
                ok = (
                    measure_server(args, peers_env, rnd, sched, repositories[sched], log_dir, jsonl)
                    and ok
                )
            for sched in list(rnd.get("errors", {})):
                schedulers.remove(sched)  # a server that did not start will not next round
            if not schedulers:
                break
    except BenchError as e:
        ok = False
        result["error"] = str(e)
        print(f"ERROR: {e}", file=sys.stderr, flush=True)
    finally:
        for d in temp_dirs:
            shutil.rmtree(d, ignore_errors=True)

    result["summary"] = summarise(result["rounds"], args.concurrency, args.schedulers)
    result["ok"] = ok
    last = result["rounds"][-1] if result["rounds"] else None
    if last and last.get("ort"):
        print(
            f"\nraw onnxruntime, ocr_cls [N,3,48,192] float32, {cpus} CPUs "
            f"(round {last['round']}; img/s, median ms per batch, cores used)"
        )
        print(ort_table(last["ort"]))
        b = last["ort_best"]
        print(
            f"raw ORT best batched: {b['infer_per_s']:.1f} img/s ({b['session']}, batch "
            f"{b['batch']})"
            + (
                f"; median over {len(result['rounds'])} rounds: "
                f"{result['summary']['ort_best_infer_per_s']:.1f}"
                if len(result["rounds"]) > 1
                else ""
            )
        )
    if not args.ort_only and result["rounds"]:
        n = len(result["rounds"])
        for sched in args.schedulers:
            print(
                f"\ntriton-mp ({result.get('triton_mp')}), {SCHEDULERS[sched]}, perf_analyzer "
                f"-i grpc -p {args.window_ms} (medians over {n} round(s)); ratio = infer/s / "
                f"raw ORT best batched; cores: client = perf_analyzer, server = triton-mp's "
                f"process tree, busy = whole machine"
            )
            print(server_table(result["summary"]["per_scheduler"][sched], n))
        print(
            f"\nsummary (medians over {n} round(s); ratio = infer/s / raw ORT best batched "
            f"of the same round)"
        )
        print(comparison_table(result["summary"], args.schedulers))
        for r in result["rounds"]:
            for sched, err in r.get("errors", {}).items():
                print(
                    f"round {r['round']}, {sched}: {err.splitlines()[0]} "
                    f"(log: {r['servers'][sched]['log']})"
                )
            for sched, srv in r.get("servers", {}).items():
                if "clean" in srv and not srv["clean"] and "pid" in srv and "ready_s" in srv:
                    print(
                        f"round {r['round']}, {sched}: server stop NOT clean: {srv['stop']}, "
                        f"exit {srv['exit_code']}, leftover processes "
                        f"{[p['cmdline'][:60] for p in srv['leftover_processes']]}, "
                        f"/dev/shm left {srv['shm_left']}"
                    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
