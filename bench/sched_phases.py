#!/usr/bin/env python3
"""The scheduler's thread CPU per phase of its loop, in a running server under load.

    python bench/sched_phases.py --commits e62a9682 HEAD --rounds 2 --seconds 10 -c 16

Whole-process CPU per inference (``ab_interleaved.py``) moves +-20% from one window to the
next on this shared 2-vCPU machine; a change of a few µs in one phase of the scheduler's loop
disappears in it. This splits the scheduler's own CPU by phase instead: each commit's src/ is
exported (``exports.export_commit``) and its ``scheduler/main.py`` patched so that ``_serve``
adds ``time.thread_time_ns`` deltas per phase (``pre``: the pre-wait words, core and router;
``wait``: the spin and sleep; ``duewait``: the notices and the poll before a deadline;
``drain``: the rings read and decoded; ``handle``: the messages handled and sent;
``dispatch``: batches formed and sent; ``flush``: the wake-up posts) and logs them at the stop.
Each round starts each commit's server in turn (the order alternates), drives ``--model``
with perf_analyzer (``--concurrency-range C``, gRPC) for ``--seconds`` after a warm-up and
prints, per commit and round: the process CPU per inference over the window, then each
phase's µs per batch and per pass over the server's whole life (warm-up included), and
µs per drained message for ``drain`` and ``handle``. The timer costs ~0.7 µs per call (7 per
pass), which every commit pays alike. The patch matches ``_serve``'s text as of 2026-12-06
and fails loudly where a commit's loop differs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ab_interleaved import counts
from common import BENCH, load_peers_env
from exports import export_commit, patch_source
from pa_window import alternating, perf_window, window_parser
from profile_roles import role_pids

PHASES = ("pre", "wait", "duewait", "drain", "handle", "dispatch", "flush")
_PATCHES = (
    (
        "    passes = 0\n    lead = lead or WakeLead()\n    while True:\n        passes += 1\n",
        "    passes = 0\n    lead = lead or WakeLead()\n    import time as _t\n"
        "    _T = _t.thread_time_ns\n    acc = [0] * 7\n    cnt = [0] * 3\n"
        "    while True:\n        passes += 1\n        t0 = _T()\n",
    ),
    (
        "        now = clock.now_ns()\n        sleep_s, poll_s = wait_plan(",
        "        t1 = _T()\n        acc[0] += t1 - t0\n"
        "        now = clock.now_ns()\n        sleep_s, poll_s = wait_plan(",
    ),
    (
        "        msgs = done_first(inbox.drain())\n        now = clock.now_ns()\n"
        "        deliver(core, core.handle_all(msgs, now), router.send, now)\n",
        "        t2 = _T()\n        acc[1 if not due else 2] += t2 - t1\n"
        "        msgs = done_first(inbox.drain())\n        t3 = _T()\n        acc[3] += t3 - t2\n"
        "        cnt[0] += len(msgs)\n        cnt[1] += not msgs\n        cnt[2] += due\n"
        "        now = clock.now_ns()\n"
        "        deliver(core, core.handle_all(msgs, now), router.send, now)\n"
        "        acc[4] += _T() - t3\n",
    ),
    (
        "        if core.stopping:\n            router.flush()\n            return passes\n",
        "        if core.stopping:\n            router.flush()\n"
        '            log.info("sched_phases %s", " ".join(map(str, [*acc, *cnt, passes])))\n'
        "            return passes\n        t5 = _T()\n",
    ),
    (
        "        deliver(core, core.dispatch(now), router.send, now)\n"
        "        # NOTE: every post of the pass, last (Router.flush).\n        router.flush()\n",
        "        deliver(core, core.dispatch(now), router.send, now)\n        t6 = _T()\n"
        "        acc[5] += t6 - t5\n"
        "        # NOTE: every post of the pass, last (Router.flush).\n        router.flush()\n"
        "        acc[6] += _T() - t6\n",
    ),
)


def patch_serve(src: Path, patches: tuple[tuple[str, str], ...], tool: str) -> None:
    """Replace each ``(old, new)`` of ``patches`` in ``src``'s ``scheduler/main.py``; exit
    naming ``tool`` when a commit's loop does not hold an ``old`` exactly once."""
    patch_source(src / "triton_mp" / "scheduler" / "main.py", patches, tool)


def instrument(src: Path) -> None:
    """Patch ``src``'s ``scheduler/main.py`` (module docstring)."""
    patch_serve(src, _PATCHES, "sched_phases")


Report = Callable[[str, str], str]
"""``report(label, log text)``: a tool's lines from one server's log (``sched_formwords``,
``sched_passkinds``), in place of the phases."""


def one_run(
    src: Path, label: str, args: argparse.Namespace, peers: dict[str, str], report: Report | None
) -> str:
    """One server of ``src`` under perf_analyzer; its line of figures (``report``'s lines
    instead, where given)."""
    log = Path(f"/tmp/sched_phases_{os.getpid()}.log")
    with perf_window(src, log, args, peers) as server:
        pid = role_pids(server.pid or 0)["scheduler"][0]
        tick = 1e6 / os.sysconf("SC_CLK_TCK")

        def cpu() -> int:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])

        c0, n0 = cpu(), counts(server, args.model)
        time.sleep(args.seconds)
        c1, n1 = cpu(), counts(server, args.model)
    log_text = log.read_text()
    log.unlink(missing_ok=True)
    if report is not None:
        return report(label, log_text)
    found = re.findall(r"sched_phases (\S+(?: \S+)*)", log_text)
    if not found:
        return f"{label}: no phases logged"
    *acc, msgs, empty, due, passes = (int(v) for v in found[-1].split()[: len(PHASES) + 4])
    inf, ex = n1[0] - n0[0], max(n1[1] - n0[1], 1)
    batches = max(
        msgs * ex / max(inf + ex, 1), 1
    )  # NOTE: a drained message is a request or a BatchDone
    head = f"{label}: {inf / args.seconds:,.0f} infer/s, batch {inf / ex:.2f}, "
    head += f"scheduler {(c1 - c0) * tick / max(inf, 1):.1f} CPU µs/inference, load "
    head += f"{os.getloadavg()[0]:.1f}; {passes} passes ({passes / batches:.2f} per batch, "
    head += f"{empty} empty, {due} due)"
    rows = [
        f"    {p:8s} {a / 1000 / batches:7.1f} µs/batch {a / 1000 / max(passes, 1):6.1f} µs/pass"
        + (f" {a / 1000 / max(msgs, 1):5.2f} µs/msg" if p in ("drain", "handle") else "")
        for p, a in zip(PHASES, acc, strict=True)
    ]
    return "\n".join([head, *rows])


def main(
    patch: Callable[[Path], None] = instrument, report: Report | None = None, doc: str = __doc__
) -> int:
    """Run a tool (``doc``: its module docstring): ``patch`` each commit's exported src/, then
    the rounds (the lines of ``report`` per server, where given, else the phases)."""
    args = window_parser(doc.split("\n\n")[0]).parse_args()
    peers = load_peers_env(BENCH.parent / ".peers" / "peers.env")
    trees = {rev: export_commit(rev) for rev in args.commits}
    for src in trees.values():
        patch(src)
    for r, rev, src in alternating(trees, args.rounds):
        print(one_run(src, f"round {r} {rev}", args, peers, report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
