#!/usr/bin/env python3
"""py-spy profiles of the scheduler and one worker of triton-mp under perf_analyzer load.

    python bench/profile_roles.py --commit HEAD -c 16 --seconds 12
    python bench/profile_roles.py --commit f326293 -c 16 --out /tmp/before

Starts ``triton-mp start`` (the commit's src/, exported with git archive, or this checkout's
working tree without ``--commit``) on bench/model_repository, drives ``add_sub_py`` (or
``--model``, with ``--pa-args`` for perf_analyzer) with perf_analyzer
(``--concurrency-range C``, gRPC) in the background, and after a warm-up records the
scheduler and the first worker of the model with ``py-spy record --format raw`` (collapsed
stacks, ``--nonblocking`` so the target is not paused, ``--gil``: only the thread holding
the GIL, so a thread blocked in ``sem_timedwait`` is not sampled, which py-spy's own idle
detection misses) for ``--seconds``. Prints the CPU µs per inference of each role over that
window (``/proc`` ticks of all its processes: both workers together, as #34's goal counts
them) and the average batch, then, per profiled process, the functions with the most samples
(self, then inclusive), as shares of that process's samples, and writes the raw stacks under
``--out``. A spin (``sched_yield`` keeps the GIL) counts as CPU, as it is.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ab_interleaved import ROLES, TICK_US, counts, role_ticks
from bench_vs_triton import export_commit  # bench/ is on sys.path when this runs as a script
from common import BENCH, TritonMP, descendants, load_peers_env


def cpu_line(
    c1: dict[str, int], c0: dict[str, int], n1: tuple[float, float], n0: tuple[float, float]
) -> str:
    """CPU µs per inference per role (/proc ticks, every process of the role: both workers)
    and the average batch over one window, from the ticks and the (inferences, executions)
    counts at its two ends."""
    inferences, executions = n1[0] - n0[0], n1[1] - n0[1]
    parts = [f"{inferences:.0f} inferences, batch {inferences / max(executions, 1):.2f}"]
    for role in ROLES:
        parts.append(f"{role} {(c1[role] - c0[role]) * TICK_US / max(inferences, 1):.1f}")
    return "; ".join(parts) + " CPU µs per inference (py-spy sampling included)"


def role_pids(root: int) -> dict[str, list[int]]:
    """role -> pids of the server's processes (their titles name the role)."""
    out: dict[str, list[int]] = collections.defaultdict(list)
    for pid, _start in descendants(root):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if title.startswith("triton-mp: "):
            out[title.split()[1]].append(pid)
    return out


def model_worker(roles: dict[str, list[int]], model: str) -> int:
    """The first worker process (lowest pid) of ``model`` (its title names the instance,
    ``<model>_<group>_<index>``); the repository's other models run workers too."""
    for pid in sorted(roles["worker"]):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        words = title.split()
        if len(words) > 2 and words[2].rsplit("_", 2)[0] == model:
            return pid
    return sorted(roles["worker"])[0]


def summarize(raw: Path, top: int) -> str:
    """The top functions by self and inclusive samples of one py-spy raw file."""
    self_n: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")"
            if " (" in f
            else f
            for f in stack.split(";")
        ]
        self_n[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    lines = [f"  {total} samples"]
    lines.append("  self:")
    lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in self_n.most_common(top)]
    lines.append("  inclusive:")
    lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", help="serve src/ as committed at this rev (default: worktree)")
    ap.add_argument("-c", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", type=Path, default=Path("/tmp/profile_roles"))
    ap.add_argument("--model", default="add_sub_py", help="a model of bench/model_repository")
    ap.add_argument(
        "--pa-args",
        action="append",
        default=[],
        help="one more perf_analyzer argument (repeat), e.g. --pa-args=--shape=INPUT0:262144",
    )
    args = ap.parse_args()
    peers = load_peers_env(BENCH.parent / ".peers" / "peers.env")
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        print("py-spy not found: pip install py-spy", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    src = export_commit(args.commit) if args.commit else BENCH.parent / "src"
    server = TritonMP(BENCH / "model_repository", args.out / "server.log", src=src)
    server.start([args.model])
    assert server.pid is not None
    pa = subprocess.Popen(
        [
            peers["PERF_ANALYZER"],
            "-i",
            "grpc",
            "-u",
            server.url,
            "-m",
            args.model,
            "--concurrency-range",
            str(args.c),
            *args.pa_args,
            "-p",
            str(int((args.seconds + args.warmup + 4) * 1000)),
            "--max-trials",
            "1",
        ],
        env={**os.environ, **peers},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(args.warmup)
        roles = role_pids(server.pid)
        targets = {"scheduler": roles["scheduler"][0], "worker": model_worker(roles, args.model)}
        spies = {
            role: subprocess.Popen(
                [
                    pyspy,
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    str(int(args.seconds)),
                    "--rate",
                    str(args.rate),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--gil",
                    "-o",
                    str(args.out / f"{role}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for role, pid in targets.items()
        }
        pids = [p for p, _ in descendants(server.pid)]
        c0, n0 = role_ticks(pids), counts(server, args.model)
        for role, p in spies.items():
            _, err = p.communicate(timeout=args.seconds + 60)
            if p.returncode != 0:
                print(f"py-spy {role}: {err.decode()[-400:]}", file=sys.stderr)
        c1, n1 = role_ticks(pids), counts(server, args.model)
        cpu = cpu_line(c1, c0, n1, n0)
    finally:
        pa.kill()
        pa.wait()
        server.stop()
    print(f"over the profiled window ({args.commit or 'worktree'}, c={args.c}): {cpu}")
    for role in ("scheduler", "worker"):
        raw = args.out / f"{role}.txt"
        if raw.exists():
            print(f"{role} ({args.commit or 'worktree'}, c={args.c}):")
            print(summarize(raw, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
