"""Soak: 64 clients against one triton-mp server for N minutes, a worker and a frontend
killed along the way, every process's memory and /dev/shm watched.

Not a CI test (30 minutes by default). It starts ``triton-mp start`` (this checkout) with
two frontends on the soak's repository (``bench/soak_load.py``: onnxruntime, python, an
ensemble, a sequence model), runs ``--clients`` threads over gRPC and HTTP (some through
system shared memory) that check every answer, kills ``-9`` one worker at a sixth of the
run and one frontend at a third, samples the resident memory of every server process
(named by their titles; the supervisor is the root) and the server's /dev/shm objects every
``--sample-s`` seconds, and stops the server at the end (no process and no /dev/shm entry
may be left).

It judges: no wrong answer; every failed request failed because of a kill (within
``KILL_WINDOW_S`` of it: the killed worker's requests name it and its exit code, the killed
frontend's clients saw their connection drop); every process's RSS and /dev/shm flat within
``FLAT`` from the end of the warm-up to the end. The warm-up is ``--warmup-min`` after the
last kill (the dead frontend's clients reconnect to the other one, which then carries more
connections) and after the process started (a restarted process has its own). Prints a
table, writes every sample to ``--json`` and draws RSS and /dev/shm over time into
``--png``::

    python bench/soak.py                 # 30 minutes
    python bench/soak.py --minutes 2 --warmup-min 0.5     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from common import ROOT, TritonMP
from soak_load import MODELS, Clients, Failure, write_repository

MIB = 1 << 20
FLAT = 0.05
"""How far a process's RSS (or /dev/shm) may move from the end of its warm-up to the end."""
KILL_WINDOW_S = 20.0
"""Failures this long after a kill are that kill's."""
WORKER = "worker add_sub_py_0_0"
FRONTEND = "frontend 1"


def server_processes(root_pid: int) -> dict[str, psutil.Process]:
    """Title -> process for the server tree (the root is the supervisor)."""
    out = {"supervisor": psutil.Process(root_pid)}
    for p in out["supervisor"].children(recursive=True):
        try:
            title = " ".join(p.cmdline()).strip()
        except psutil.Error:
            continue
        if title.startswith("triton-mp: "):
            out[title.removeprefix("triton-mp: ")] = p
        elif "resource_tracker" in title:
            out["resource tracker"] = p
    return out


def _status_bytes(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def sample(root_pid: int) -> dict[str, Any]:
    """Every process's pid, RSS, RssAnon and RssShmem (bytes) and the server's /dev/shm."""
    procs: dict[str, Any] = {}
    for name, p in server_processes(root_pid).items():
        try:
            rss = p.memory_info().rss
        except psutil.Error:
            continue
        procs[name] = {
            "pid": p.pid,
            "rss": rss,
            "anon": _status_bytes(p.pid, "RssAnon"),
            "shmem": _status_bytes(p.pid, "RssShmem"),
        }
    marker = f"triton_mp_{root_pid}_"
    entries = [e for e in os.scandir("/dev/shm") if marker in e.name]
    total = 0
    for e in entries:
        try:
            total += e.stat().st_blocks * 512
        except OSError:
            continue
    return {"procs": procs, "shm_bytes": total, "shm_objects": len(entries)}


def kill(root_pid: int, title: str) -> int:
    """SIGKILL the server's process titled ``title``; returns its pid."""
    pid = server_processes(root_pid)[title].pid
    os.kill(pid, signal.SIGKILL)
    return pid


def flatness(samples: list[dict[str, Any]], warm_from_s: float) -> list[dict[str, Any]]:
    """Per process title (alive at the end): RSS at its start, at the end of its warm-up
    (the first sample from ``warm_from_s`` on, and from ``warm_from_s`` after its pid first
    showed up) and at the end, in MiB, and the change from warm-up to end."""
    rows = []
    last = samples[-1]
    for name, end in last["procs"].items():
        mine = [s for s in samples if s["procs"].get(name, {}).get("pid") == end["pid"]]
        born = mine[0]["t_s"]
        base = next((s for s in mine if s["t_s"] >= max(born, warm_from_s)), mine[-1])
        b, e = base["procs"][name], end
        rows.append(
            {
                "process": name,
                "pid": end["pid"],
                "since_s": born,
                "rss_start_mib": round(mine[0]["procs"][name]["rss"] / MIB, 1),
                "rss_warm_mib": round(b["rss"] / MIB, 1),
                "rss_end_mib": round(e["rss"] / MIB, 1),
                "anon_warm_mib": round((b["anon"] or 0) / MIB, 1),
                "anon_end_mib": round((e["anon"] or 0) / MIB, 1),
                "rss_change": round(e["rss"] / b["rss"] - 1, 4),
            }
        )
    return rows


def judge_failures(
    failures: list[Failure], kills: list[dict[str, Any]]
) -> tuple[dict[str, int], list[Failure]]:
    """Failures by the kill they belong to, and those no kill explains."""
    counts = {k["what"]: 0 for k in kills}
    unexplained = []
    for f in failures:
        owner = next(
            (k for k in kills if k["t_s"] <= f.t_s <= k["t_s"] + KILL_WINDOW_S and _caused(f, k)),
            None,
        )
        if owner is None:
            unexplained.append(f)
        else:
            counts[owner["what"]] += 1
    return counts, unexplained


def _caused(f: Failure, k: dict[str, Any]) -> bool:
    if k["what"] == WORKER:
        return "add_sub_py_0_0" in f.message and "-9" in f.message
    # NOTE: the connection dropped (gRPC: UNAVAILABLE; HTTP: the socket closed or reset).
    words = ("UNAVAILABLE", "Connection", "RemoteDisconnected", "BrokenPipe", "reset")
    return any(w in f.message for w in words)


def plot(samples: list[dict[str, Any]], kills: list[dict[str, Any]], path: Path) -> None:
    """RSS per process and /dev/shm over time, the kills marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 8), sharex=True, height_ratios=[3, 1])
    names = sorted({n for s in samples for n in s["procs"]})
    for n in names:
        pts = [(s["t_s"] / 60, s["procs"][n]["rss"] / MIB) for s in samples if n in s["procs"]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=n, linewidth=1)
    ax2.plot([s["t_s"] / 60 for s in samples], [s["shm_bytes"] / MIB for s in samples], "k-")
    for i, k in enumerate(kills):
        for a in (ax, ax2):
            a.axvline(k["t_s"] / 60, color="red", linestyle="--", linewidth=0.8)
        y = ax.get_ylim()[1] * (0.97 - 0.05 * i)
        ax.text(k["t_s"] / 60, y, f" kill -9 {k['what']}", color="red")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title("triton-mp soak: resident memory per process")
    ax.legend(fontsize=7, ncol=3, loc="lower right")
    ax2.set_ylabel("/dev/shm (MiB)")
    ax2.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples")
    ap.add_argument(
        "--warmup-min", type=float, default=5.0, help="minutes after the last kill before judging"
    )
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    ap.add_argument("--png", type=Path, default=ROOT / "bench" / "results" / "soak_rss.png")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-arg", action="append", default=[], help="extra start flag")
    return ap.parse_args()


def _run(
    args: argparse.Namespace, server: TritonMP, samples: list[dict[str, Any]]
) -> tuple[Clients, list[dict[str, Any]], float, int]:
    """Load, kill, sample until the end; returns the clients, the kills, the seconds the
    load ran and the hung clients."""
    assert server.pid is not None
    http_url = f"127.0.0.1:{server.http}"
    clients = Clients(server.url, http_url, args.clients, args.seed, f"/soak_{os.getpid()}_")
    end = clients.t0 + args.minutes * 60
    plan = [(args.minutes * 60 / 6, WORKER), (args.minutes * 60 / 3, FRONTEND)]
    kills: list[dict[str, Any]] = []
    while True:
        now = time.monotonic()
        t = round(now - clients.t0, 1)
        while plan and t >= plan[0][0]:
            _, what = plan.pop(0)
            kills.append({"t_s": t, "what": what, "pid": kill(server.pid, what)})
            print(f"t={t:7.1f}s kill -9 {what} (pid {kills[-1]['pid']})", flush=True)
        s = sample(server.pid)
        s.update(t_s=t, ok=clients.ok, failed=len(clients.failures), wrong=len(clients.wrong))
        samples.append(s)
        print(
            f"t={t:7.1f}s ok={s['ok']:8d} failed={s['failed']:4d} wrong={s['wrong']} "
            f"shm={s['shm_bytes'] / MIB:.1f}MiB/{s['shm_objects']} "
            + " ".join(f"{n}={v['rss'] / MIB:.0f}" for n, v in s["procs"].items()),
            flush=True,
        )
        if now >= end:
            break
        step = min(args.sample_s, max(0.0, end - now))
        if plan:
            step = min(step, max(0.0, clients.t0 + plan[0][0] - now))
        time.sleep(step)
    elapsed = time.monotonic() - clients.t0
    return clients, kills, elapsed, clients.stop()


def _verdict(
    args: argparse.Namespace,
    clients: Clients,
    kills: list[dict[str, Any]],
    samples: list[dict[str, Any]],
) -> dict[str, Any]:
    warm_s = args.warmup_min * 60 + max((k["t_s"] for k in kills), default=0.0)
    rows = flatness(samples, warm_s)
    counts, unexplained = judge_failures(clients.failures, kills)
    base = next((s for s in samples if s["t_s"] >= warm_s), samples[-1])
    shm_change = samples[-1]["shm_bytes"] / max(1, base["shm_bytes"]) - 1
    return {
        "requests_ok": clients.ok,
        "by_model": clients.by_model,
        "failed": len(clients.failures),
        "failed_by_kill": counts,
        "failing_clients_by_kill": {
            k["what"]: len(
                {
                    f.client
                    for f in clients.failures
                    if k["t_s"] <= f.t_s <= k["t_s"] + KILL_WINDOW_S and _caused(f, k)
                }
            )
            for k in kills
        },
        "unexplained": [vars(f) for f in unexplained[:20]],
        "unexplained_count": len(unexplained),
        "wrong": clients.wrong[:20],
        "wrong_count": len(clients.wrong),
        "processes": rows,
        "not_flat": [r["process"] for r in rows if abs(r["rss_change"]) > FLAT],
        "shm_warm_mib": round(base["shm_bytes"] / MIB, 1),
        "shm_end_mib": round(samples[-1]["shm_bytes"] / MIB, 1),
        "shm_objects_warm": base["shm_objects"],
        "shm_objects_end": samples[-1]["shm_objects"],
        "shm_change": round(shm_change, 4),
        "warm_from_s": warm_s,
    }


def _print(v: dict[str, Any], elapsed: float, hung: int, args: argparse.Namespace) -> None:
    cols = ("rss_start_mib", "rss_warm_mib", "rss_end_mib", "anon_warm_mib", "anon_end_mib")
    print(f"\n{'process (MiB)':28}" + "".join(f"{c[:-4].replace('_', ' '):>11}" for c in cols)
          + f"{'change':>9}")  # fmt: skip
    for r in v["processes"]:
        print(
            f"{r['process']:28}"
            + "".join(f"{r[c]:>11.1f}" for c in cols)
            + f"{r['rss_change'] * 100:>8.1f}%"
        )
    print(
        f"\n{args.clients} clients, {elapsed / 60:.1f} min: {v['requests_ok']} requests answered "
        f"({v['requests_ok'] / elapsed:.0f}/s) {v['by_model']}; failed {v['failed']} "
        f"{v['failed_by_kill']} (clients {v['failing_clients_by_kill']}), unexplained "
        f"{v['unexplained_count']}, wrong {v['wrong_count']}, hung clients {hung}"
    )
    print(
        f"/dev/shm {v['shm_warm_mib']} -> {v['shm_end_mib']} MiB ({v['shm_change'] * 100:+.1f}%), "
        f"objects {v['shm_objects_warm']} -> {v['shm_objects_end']}; not flat: {v['not_flat']}"
    )
    for f in v["unexplained"][:5]:
        print("  unexplained:", f)
    for w in v["wrong"][:5]:
        print("  wrong:", w)
    print(f"processes that refused a free (a second or late free of a block): "
          f"{v.get('stray_frees_logged', 0)}")  # fmt: skip


def main() -> int:
    args = _args()
    work = Path(tempfile.mkdtemp(prefix="triton_mp_soak_"))
    write_repository(ROOT, work / "repo")
    extra = ["--frontend-processes", "2", *args.server_arg]
    server = TritonMP(work / "repo", work / "server.log", extra_args=extra)
    samples: list[dict[str, Any]] = []
    clients = None
    try:
        failed = server.start(list(MODELS))
        if failed:
            print(f"models failed to load: {failed}", file=sys.stderr)
            return 1
        clients, kills, elapsed, hung = _run(args, server, samples)
    finally:
        if clients is not None:
            clients.stop(10)
        stop = server.stop()
    v = _verdict(args, clients, kills, samples)
    # NOTE: a free the arenas refused (ipc.tensor_pool.free_block): a holder's count is wrong.
    log_text = (work / "server.log").read_text(errors="replace")
    v["stray_frees_logged"] = log_text.count("refused to free block")
    _print(v, elapsed, hung, args)
    print(server.stop_line())
    args.json.parent.mkdir(parents=True, exist_ok=True)
    record = {"minutes": args.minutes, "clients": args.clients, "kills": kills, **v}
    args.json.write_text(json.dumps({**record, "server": stop, "samples": samples}, indent=1))
    plot(samples, kills, args.png)
    print(f"samples: {args.json}; plot: {args.png}; server log: {work / 'server.log'}")
    clean = bool(stop.get("clean"))
    ok = not (
        v["unexplained_count"] or v["wrong_count"] or v["not_flat"] or hung
        or v["stray_frees_logged"]
    )  # fmt: skip
    return 0 if ok and clean and abs(v["shm_change"]) <= FLAT else 1


if __name__ == "__main__":
    sys.exit(main())
