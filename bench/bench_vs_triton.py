#!/usr/bin/env python3
"""triton-mp side by side with the real NVIDIA Triton 2.51, driven by the same perf_analyzer runs.

The servers ("sides"): the real Triton, triton-mp (one frontend process), and, for the
add_sub_py gRPC workloads (the python-backend issue's bench, concurrency 1, 4 and 16), also
triton-mp with ``--frontend-processes 2``, triton-mp with ``--grpc-frontend python``, the
Python floor (``bench/floor_server.py``: one grpc.aio process computing add_sub inline, what
a single Python gRPC process reaches here) and the native floor (``bench/native_floor.py``:
the same in C++ on libgrpc++, what a native gRPC frontend costs per call before any work of
its own; after the CPU table, each triton-mp side's frontend CPU per inference is printed
over the native floor's, per round and median).

One invocation:

1. installs the peers when they are missing (``bench/peers/install-peers.sh .peers``);
2. per round (``--rounds``, default 3), starts every side the chosen workloads need fresh on
   free ports, on the same model repository: the real Triton through
   ``bench/peers/run-triton.sh``, ``triton-mp start`` (twice: one and two frontend
   processes) and the floor, each in its own session;
3. for each workload, runs the same perf_analyzer command (gRPC or HTTP/REST as the workload
   says, 3 s windows, through ``bench/pa_run.py``) against each of its sides, back to
   back; the order alternates from round to round (odd rounds Triton, triton-mp, fp2, floor;
   even rounds the reverse), so each round's ratios compare runs taken seconds apart;
4. stops them all by PID (SIGINT, then SIGKILL) and checks that none of their processes and none of
   their ``/dev/shm`` entries is left behind.

It prints one table: per workload and protocol (``-i grpc`` or ``-i http``), a line per server
with its infer/s, p50 and p99 latency (medians over rounds), the cores used by the server, by
perf_analyzer and by everything else on the machine, its throughput over Triton's and over the
floor's, and (triton-mp) its p50 over Triton's (medians of the per-round ratios, which are
listed too). It writes a PNG of throughput and
p99 latency (``--png``; by default beside ``--json``, with its stem) and, with ``--json``,
every record. It refuses to start when a triton-mp side that serves gRPC natively would run
without its native frontend (``native_check``: a stale or missing build).

Exit status 0 when every measurement ran and every stop was clean; 1 otherwise (for instance
while triton-mp cannot load python models): the table still shows what was measured, and the
error in place of what was not. See bench/README.md.
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
import vs_triton_args
from common import (
    ROOT,
    BenchError,
    Floor,
    ManagedServer,
    Triton,
    TritonMP,
)
from exports import export_commit
from native_check import require_native
from native_floor import NativeFloor
from vs_triton_chart import write_chart
from vs_triton_ort import instance_waits, raw_ort_record
from vs_triton_pinned import (
    CLIENT_CPUS,
    PINNED_ORT_CONFIGS,
    PINNED_SIDES,
    core_shares,
    cpu_ticks,
    off_pin,
    pinned,
    set_autogroup_nice,
    thread_affinities,
)
from vs_triton_report import print_report, summarise
from vs_triton_rerun import rerun_line, rerun_round, unstable_sides
from vs_triton_workloads import (
    FLOOR_IDENTITY,
    MAX_RESTARTS,
    PRIVATE_SHM_ENV,
    SERVERLESS,
    SIDE_ARGS,
    SIDES,
    Workload,
    prepare_repositories,
)


def run_pa(
    w: Workload,
    pa_run: Path,
    peers_env: dict[str, str],
    server: ManagedServer,
    label: str,
    pa_args: list[str],
    window_ms: int,
    attempts: int,
    jsonl: Path,
) -> dict[str, Any]:
    """One perf_analyzer measurement over the workload's protocol; common.run_pa's record."""
    return common.run_pa(
        pa_run, peers_env, server, label, pa_args, window_ms, attempts, jsonl, w.protocol
    )


# --------------------------------------------------------------------------- one round


def start_server(
    side: str, args: argparse.Namespace, log_dir: Path, i: int, models: list[str], restart: int = 0
) -> tuple[ManagedServer, dict[str, str], str | None]:
    """Start one side; returns (server, {model: why not ready}, start error or None)."""
    server: ManagedServer
    suffix = f"-restart{restart}" if restart else ""
    log = log_dir / f"{side.replace(' ', '-')}-round{i}{suffix}.log"
    if side == "Triton":
        server = Triton(args.repository, log, args.peers_env, args.start_timeout, args.stop_timeout)
    elif side == "floor":
        server = Floor(log, args.start_timeout, args.stop_timeout)
    elif side == "identity floor":
        server = Floor(log, args.start_timeout, args.stop_timeout, FLOOR_IDENTITY)
    elif side == "native floor":
        try:
            server = NativeFloor(log, args.start_timeout, args.stop_timeout)
        except BenchError as e:
            print(f"  {side}: ERROR: {e}", flush=True)
            return Floor(log), {}, str(e)
    else:
        server = TritonMP(
            args.mp_repository,
            log,
            args.server_cmd,
            args.start_timeout,
            args.stop_timeout,
            args.base_src if side == "triton-mp base" else args.mp_src,
            SIDE_ARGS.get(side),
        )
    cpus = PINNED_SIDES.get(side)
    print(
        f"  {side}: {server.info['cmd']}"
        + (f" (pinned to cpus {sorted(cpus)}, nice {args.pinned_nice})" if cpus else ""),
        flush=True,
    )
    try:
        if cpus is None:
            failed = server.start(models)
        else:
            # the server's processes and threads inherit the pin and the nice value
            with pinned(cpus, args.pinned_nice):
                failed = server.start(models)
            check_pin(server, cpus)
            if args.pinned_nice is not None and server.pid is not None:
                # the server runs in a session of its own: its autogroup starts at nice 0
                set_autogroup_nice(server.pid, args.pinned_nice)
    except BenchError as e:
        print(f"  {side}: ERROR: {e}", flush=True)
        return server, {}, str(e)
    print(
        f"  {side}: up after {server.info['ready_s']} s, "
        f"{server.info['processes_when_ready']} processes"
        + "".join(f"\n  {side}: model {m} NOT READY: {why}" for m, why in failed.items()),
        flush=True,
    )
    return server, failed, None


def check_pin(server: ManagedServer, cpus: frozenset[int]) -> None:
    """Raise BenchError when a thread of the started server's tree may run outside ``cpus``
    (the supervisor, frontends, scheduler and workers inherit the pin at their start; a host
    policy or a library that sets its own affinity would escape it)."""
    assert server.pid is not None
    affinities = thread_affinities(server.pid)
    bad = off_pin(affinities, cpus)
    server.info["pinned_cpus"] = sorted(cpus)
    server.info["pinned_threads"] = len(affinities)
    if bad:
        raise BenchError(
            f"{len(bad)} of {len(affinities)} threads not on cpus {sorted(cpus)}: "
            + "; ".join(bad[:5])
        )
    print(
        f"  checked: all {len(affinities)} threads of the server's tree on cpus {sorted(cpus)}",
        flush=True,
    )


class _Round:
    """One round's servers and records (``run_round``).

    Args:
        skip: sides whose start failed in an earlier round -> that error (not retried).
    """

    def __init__(
        self,
        i: int,
        args: argparse.Namespace,
        peers_env: dict[str, str],
        log_dir: Path,
        skip: dict[str, str],
    ) -> None:
        self.i, self.args, self.peers_env, self.log_dir = i, args, peers_env, log_dir
        used = [
            side
            for side in SIDES
            if any(side in w.sides for w in args.workloads) and side not in SERVERLESS
        ]
        self.used = used
        self.order = used if i % 2 == 1 else list(reversed(used))
        self.rnd: dict[str, Any] = {
            "round": i,
            "order": self.order,
            "servers": {},
            "runs": [],
            "restarts": [],
        }
        self.models_of = {
            side: sorted({w.model_for(side) for w in args.workloads if side in w.sides})
            for side in used
        }
        self.servers: dict[str, ManagedServer] = {}
        self.model_errors: dict[str, dict[str, str]] = {}
        self.start_errors: dict[str, str] = dict(skip)
        self.ok = True
        self.jsonl = log_dir / "pa_runs.jsonl"

    def start(self, side: str, restart: int = 0) -> None:
        """Start ``side`` and record its server, its models' errors and its start error."""
        server, failed, err = start_server(
            side, self.args, self.log_dir, self.i, self.models_of[side], restart
        )
        self.servers[side] = server
        self.rnd["servers"][side] = server.info
        self.model_errors[side] = failed
        if err is not None:
            self.start_errors[side] = err

    def start_all(self) -> None:
        """Start every side this round uses and measure each one's idle cores."""
        for side in self.used:
            if side not in self.start_errors:
                self.start(side)
        up = [s for s in self.used if s in self.servers and s not in self.start_errors]
        for side in up:
            self.servers[side].info["idle_cores"] = self.servers[side].idle_cores(1.0)
        self.rnd["start_errors"] = self.start_errors
        print(
            "  idle cores: "
            + ", ".join(f"{s} {self.servers[s].info.get('idle_cores')}" for s in up),
            flush=True,
        )

    def restart_if_dead(self, side: str, w: Workload) -> None:
        """A server that died under us (on this shared machine, e.g. killed by someone
        else's clean-up): record it, collect what it left, and start a fresh one."""
        if (
            side in self.start_errors
            or self.servers[side].running()
            or len(self.rnd["restarts"]) >= MAX_RESTARTS
        ):
            return
        dead = self.servers[side]
        info = dead.stop()
        self.ok = False
        print(
            f"  {side} DIED during the round (before {w.label}); "
            f"{dead.stop_line()}; starting a new one",
            flush=True,
        )
        self.rnd["restarts"].append({"side": side, "before": w.key, "server": info})
        self.start(side, len(self.rnd["restarts"]))

    def measure(self, w: Workload, side: str) -> dict[str, Any]:
        """One side's record for one workload: a perf_analyzer run, raw onnxruntime, or the
        error that kept it from running. A pinned side (``vs_triton_pinned``) runs raw
        onnxruntime in this thread on its core, or pa_run.py and perf_analyzer on
        ``CLIENT_CPUS``; its record gets ``core_shares``, each CPU's busy / idle / steal
        share while it ran."""
        args = self.args
        if side not in PINNED_SIDES:
            if side in SERVERLESS:
                return raw_ort_record(args, args.window_ms / 2000)
            return self.run_server(w, side)
        ticks, cpu0, t0 = cpu_ticks(), time.process_time(), time.monotonic()
        if side in SERVERLESS:
            with pinned(PINNED_SIDES[side], args.pinned_nice):
                # NOTE: a window per batch size as long as perf_analyzer's: one configuration
                # and a shared core, so short windows swing with the background.
                rec = raw_ort_record(args, args.window_ms / 1000, PINNED_ORT_CONFIGS)
            rec["own_cores"] = round((time.process_time() - cpu0) / (time.monotonic() - t0), 3)
        else:
            with pinned(CLIENT_CPUS, args.pinned_nice):
                rec = self.run_server(w, side)
        rec["core_shares"] = core_shares(ticks, cpu_ticks())
        return rec

    def run_server(self, w: Workload, side: str) -> dict[str, Any]:
        """One perf_analyzer run of ``w`` against ``side``'s server (started again first if
        it died), with its instances' wait shares on an ocr_cls workload."""
        args = self.args
        self.restart_if_dead(side, w)
        if side in self.start_errors:
            return {"error": f"{side} did not start: {common.last_line(self.start_errors[side])}"}
        m = w.model_for(side)
        if m in self.model_errors.get(side, {}):
            return {"error": f"{m} not ready: {self.model_errors[side][m]}"}
        extra = [] if args.stability_percentage is None else ["-s", str(args.stability_percentage)]
        server = self.servers[side]
        waits = None
        if any(s in SERVERLESS for s in w.sides) and server.pid is not None:
            waits = instance_waits(server.pid, m)
        rec = run_pa(
            w,
            args.pa_run,
            self.peers_env,
            server,
            f"{side} {w.label} {w.protocol} round {self.i}",
            w.args(side) + extra,
            args.window_ms,
            args.attempts,
            self.jsonl,
        )
        if waits is not None:
            rec["instance_shares"] = waits()
        return rec

    def record(self, w: Workload, side: str, rec: dict[str, Any]) -> None:
        """Keep and print one record."""
        rec.update(round=self.i, side=side, workload=w.key)
        self.rnd["runs"].append(rec)
        if rec.get("throughput") is None:
            self.ok = False
            print(
                f"  {w.label:28} {w.protocol:4} {side:13}: FAILED: "
                f"{common.last_line(rec['error'])}",
                flush=True,
            )
            return
        print(
            f"  {w.label:28} {w.protocol:4} {side:13}: {rec['throughput']:9.1f} "
            f"infer/s, p50 "
            f"{rec['p50_us'] / 1000:7.2f} ms, p99 {rec['p99_us'] / 1000:7.2f} ms; "
            f"cores: server {rec['server_cores']:.2f}, perf_analyzer "
            f"{rec['client_cores']:.2f}, others {common.other_cores(rec):.2f}"
            + "".join(
                f"; instance {pid} sleeps {v['sleep']:.2f} (runs {v['run']:.2f}, "
                f"runqueue {v['runqueue']:.2f})"
                for pid, v in sorted(rec.get("instance_shares", {}).items())
            ),
            flush=True,
        )

    def stop_all(self) -> None:
        """Stop every server by PID and check what each left behind."""
        servers = self.servers
        # NOTE: the sides share one /dev/shm; what another side holds is not this one's leftover.
        for server in servers.values():
            server.snapshot()
        for server in servers.values():
            for other in servers.values():
                if other is not server:
                    server.shm_before |= other.shm_seen
        for side, server in servers.items():
            info = server.stop()
            print(f"  {server.stop_line()}", flush=True)
            if not info.get("clean"):
                self.ok = False
                if side not in self.start_errors:
                    print(server.log_tail(), flush=True)


def run_round(
    i: int, args: argparse.Namespace, peers_env: dict[str, str], log_dir: Path, skip: dict[str, str]
) -> tuple[dict[str, Any], bool]:
    """Start every side, run every workload on its sides (back to back, the order
    alternating by round), stop them all. `skip`: sides whose start failed in an earlier
    round -> that error (not retried)."""
    r = _Round(i, args, peers_env, log_dir, skip)
    print(f"round {i}/{args.rounds}: order {' then '.join(r.order)}", flush=True)
    try:
        r.start_all()
        for w in args.workloads:
            measure_workload(r, w, args.round_tries)
    finally:
        r.stop_all()
    return r.rnd, r.ok


def measure_workload(r: _Round, w: Workload, max_tries: int) -> None:
    """Run ``w`` on each of its sides, back to back; measure them all again while a side had no
    stable measurement, up to ``max_tries`` tries (``vs_triton_rerun``). The last try's
    records are the round's; the earlier tries' go to the round's ``reruns``."""
    sides = [s for s in [*r.order, *SERVERLESS] if s in w.sides]
    tries = 0
    while True:
        tries += 1
        recs = {side: r.measure(w, side) for side in sides}
        if not rerun_round(recs, tries, max_tries):
            break
        for side, rec in recs.items():
            got = rec.get("throughput")
            what = (
                f"{got:9.1f} infer/s"
                if got is not None
                else "FAILED: " + common.last_line(str(rec.get("error", "")))
            )
            print(f"  {w.label:28} {w.protocol:4} {side:13}: try {tries}: {what}", flush=True)
        r.rnd.setdefault("reruns", []).append(
            {"workload": w.key, "try": tries, "unstable": unstable_sides(recs), "runs": recs}
        )
        print(rerun_line(w.label, r.i, recs, tries, max_tries), flush=True)
    for side, rec in recs.items():
        rec["tries"] = tries
        r.record(w, side, rec)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The resolved command line (``vs_triton_args``)."""
    return vs_triton_args.parse_args(argv, __doc__.split("\n\n")[0])


def triton_mp_version(args: argparse.Namespace) -> str:
    """Which triton-mp runs: the commit (exported with --mp-commit, or the checkout's HEAD and
    whether src/ has local changes), or the --server-cmd."""
    if args.server_cmd:
        return f"--server-cmd {args.server_cmd!r}"

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


def private_shm_command(argv: list[str]) -> list[str] | None:
    """The command that reruns this benchmark in a mount namespace of its own with a fresh
    tmpfs on /dev/shm, or None when that is not possible here (no unshare, no privilege).

    perf_analyzer names its system shared memory regions after the tensors (/INPUT0_0_0,
    /OUTPUT0_0_0, ...), the same in every perf_analyzer process: two shm runs on one machine
    (ours and another engineer's test) truncate each other's regions under the servers, which
    then die of SIGBUS. In a private /dev/shm, the servers and perf_analyzer see only ours."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    ns = [
        unshare,
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"',
        "sh",
    ]
    probe = subprocess.run([*ns, "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return None
    return [*ns, sys.executable, str(Path(__file__).resolve()), *argv]


def _enter_private_shm(args: argparse.Namespace, argv: list[str]) -> None:
    """Re-execute this run in its own mount namespace with a fresh /dev/shm (see the
    README), or warn that it cannot; returns only when it goes on in this process."""
    if not args.private_shm or os.environ.get(PRIVATE_SHM_ENV):
        return
    cmd = private_shm_command(argv)
    if cmd is not None:
        sys.stdout.flush()
        os.execve(cmd[0], cmd, dict(os.environ, **{PRIVATE_SHM_ENV: "1"}))
    print(
        "WARNING: cannot give this run a private /dev/shm (needs unshare and mount "
        "privileges): perf_analyzer shm runs may collide with others' on this machine",
        flush=True,
    )


def _result_header(args: argparse.Namespace, started: datetime.datetime) -> dict[str, Any]:
    """The JSON record's fields known before the first round: host, method, options."""
    return {
        "benchmark": "triton-mp vs Triton 2.51, same perf_analyzer runs",
        "started": started.isoformat(timespec="seconds"),
        "host": {
            "node": platform.node(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg(),
        },
        "method": "servers started fresh each round, all up during the round; per workload "
        "its sides' runs are back to back, in the order Triton, triton-mp, "
        "triton-mp fp2 (--frontend-processes 2), floor in odd rounds and the "
        "reverse in even rounds; ratio = median over rounds of the round's ratio",
        "options": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k != "workloads"
        },
        "workloads": [
            {"key": w.key, "label": w.label, "args": w.args(), "sides": list(w.sides)}
            for w in args.workloads
        ],
        "private_dev_shm": bool(os.environ.get(PRIVATE_SHM_ENV)),
        "rounds": [],
    }


def native_sources(args: argparse.Namespace) -> dict[str, Path]:
    """Per side, the ``src/`` whose native gRPC frontend the chosen workloads measure:
    this triton-mp's for "triton-mp" and "triton-mp fp2" (none with ``--server-cmd``, a
    build of its own), the ``--baseline``'s for "triton-mp base"; "triton-mp python" (its
    gRPC frontend is Python's) needs none (``native_check``)."""
    sides = {s for w in args.workloads for s in w.sides}
    out = {}
    for side in ("triton-mp", "triton-mp fp2"):
        if side in sides and not args.server_cmd:
            out[side] = args.mp_src
    if "triton-mp base" in sides and args.base_src is not None:
        out["triton-mp base"] = args.base_src
    return out


def _run_rounds(args: argparse.Namespace, result: dict[str, Any], stand_in: bool) -> bool:
    """Every round, each appended to ``result["rounds"]``; whether all ran cleanly. The
    temporary repositories and exported commits are removed at the end."""
    ok = True
    skip: dict[str, str] = {}
    repo_tmp: Path | None = None
    try:
        repo_tmp = prepare_repositories(args)
        result["repositories"] = {"triton": str(args.repository), "mp": str(args.mp_repository)}
        result["triton_mp"] = mp_version = triton_mp_version(args)
        if args.mp_commit:
            args.mp_src = export_commit(args.mp_commit)
        if args.baseline:
            args.base_src = export_commit(args.baseline)
            result["triton_mp_base"] = f"commit {args.baseline}"
        for side, src in native_sources(args).items():
            require_native(src, side)
        common.ensure_peers(args.peers_env)
        peers_env = common.load_peers_env(args.peers_env)
        if not args.pa_run.is_file():
            raise BenchError(f"{args.pa_run} not found (--pa-run)")
        log_dir = Path(tempfile.mkdtemp(prefix="bench_vs_triton."))
        result["log_dir"] = str(log_dir)
        print(
            f"Triton on {args.repository}; triton-mp ({mp_version}) on {args.mp_repository}"
            + (" (STAND-IN)" if stand_in else "")
            + f"; {result['host']['cpus_usable']} CPUs; logs in {log_dir}"
            + ("; private /dev/shm (own mount namespace)" if result["private_dev_shm"] else ""),
            flush=True,
        )
        for i in range(1, args.rounds + 1):
            rnd, round_ok = run_round(i, args, peers_env, log_dir, skip)
            result["rounds"].append(rnd)
            ok = ok and round_ok
            for side, err in rnd.get("start_errors", {}).items():
                skip.setdefault(side, err)  # a server that did not start will not next round
    except BenchError as e:
        ok = False
        result["error"] = str(e)
        print(f"ERROR: {e}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        ok = False
        result["error"] = "interrupted"
        print("interrupted: the table shows the rounds finished so far", flush=True)
    if args.mp_commit and args.mp_src != ROOT / "src":
        shutil.rmtree(args.mp_src.parent, ignore_errors=True)
    if args.base_src is not None:
        shutil.rmtree(args.base_src.parent, ignore_errors=True)
    if repo_tmp is not None:
        shutil.rmtree(repo_tmp, ignore_errors=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    _enter_private_shm(args, argv)
    stand_in = args.mp_repository != args.repository
    mp_name = "triton-mp (stand-in repo)" if stand_in else "triton-mp"
    started = datetime.datetime.now(datetime.timezone.utc)
    result = _result_header(args, started)
    ok = _run_rounds(args, result, stand_in)
    rows = summarise(result["rounds"], args.workloads, result["host"]["cpus_usable"])
    result["summary"] = rows
    result["ok"] = ok
    result["host"]["loadavg_at_end"] = os.getloadavg()
    if result["rounds"]:
        print_report(result, rows, args, mp_name, stand_in)
        if not args.no_png:
            write_chart(result, rows, args, started, mp_name, stand_in)
            print(f"\nwrote {args.png}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
