#!/usr/bin/env python3
"""A worker's thread CPU per phase of its batch path, in a running server under load.

    python bench/worker_phases.py --commits main HEAD --rounds 2 --seconds 10 -c 16

The worker's CPU per inference (``ab_interleaved.py``) moves +-20% from one window to the
next on this shared 2-vCPU machine; the in-process figure (``worker_batch_ab.py``) is hot and
leaves out the loop, the wake-ups and the cold caches, which make the live batch ~3-4x its
hot cost. This splits the live worker's own thread CPU by phase instead: each commit's src/
is exported (``exports.export_commit``) and patched so that the worker's loop
(``workers.main.serve``), ``Worker.run_batch`` / ``_execute`` and the python backend's
``execute`` add ``time.thread_time_ns`` deltas per phase, in batch order:

- ``wait``: the end of the last batch to the wait's return: the loop's look at the inbox, the
  sleep on its semaphore and the wake-up (a stale post or a message that is no batch, such
  as a ``BatchDue``, counts here too: ``sleeps`` says how many waits a batch took);
- ``drain``: the inbox drained and decoded (the ``BatchAssign``), ordered, ``DueBatch``;
- ``decode``: the batch's REQUEST records decoded (``BatchRequests.decoded``);
- ``start``: the early wake at the batch's start, traces, the execution watch;
- ``gather``: the requests' input views and ``BackendRequest`` s (``backend_requests``);
- ``pb_requests``: the model's ``pb_utils.InferenceRequest`` s;
- ``execute``: the model's own ``execute`` (``pb_utils`` calls it makes included);
- ``results``: its responses read back into results (``_returned_results``);
- ``prewake``: the early wake after ``execute`` (``workers.prewake``);
- ``answer``: answers written, encoded, pushed and posted (``Answers.answer``);
- ``done``: the lease re-offered and the ``BatchDone`` pushed;
- ``release``: ``run_batch``'s return (the batch's objects freed).

Each mark costs one ``thread_time_ns`` (a system call, ~0.5-1.5 µs on this VM; 12 per batch,
which every commit pays alike). The worker writes its sums when it stops; the first mark is
taken when its loop starts, so loading and warm-up are not counted. Each round starts each
commit's server in turn (the order alternates), drives ``--model`` with perf_analyzer
(``--concurrency-range C``, gRPC) for ``--seconds`` after a warm-up and prints, per commit
and round: infer/s, the batch, the workers' CPU per inference (``/proc``, both instances)
and the load, then per phase µs per batch and per request of the first instance (warm-up
included). The patches match the text of 2026-12-07 and fail loudly where a commit differs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ab_interleaved import TICK_US, counts, role_ticks
from common import BENCH, descendants, load_peers_env
from exports import export_commit, patch_source
from pa_window import alternating, perf_window, window_parser

PHASES = (
    "wait",
    "drain",
    "decode",
    "start",
    "gather",
    "pb_requests",
    "execute",
    "results",
    "prewake",
    "answer",
    "done",
    "release",
)

_MODULE = '''"""worker_phases' accumulator (bench/worker_phases.py), added to an exported tree."""
import os
import time

_T = time.thread_time_ns
PHASES = {phases!r}
acc = [0] * len(PHASES)
last = [0]
counts = [0, 0, 0]  # batches, requests, waits


def start():
    last[0] = _T()


def mark(k):
    t = _T()
    acc[k] += t - last[0]
    last[0] = t


def write():
    with open(os.path.join({out!r}, f"phases_{{os.getpid()}}.txt"), "w") as f:
        f.write(" ".join(map(str, [*counts, *acc])) + "\\n")
'''

_W = "workers/worker.py"
_B = "backends/python/backend.py"
_M = "workers/main.py"


def _m(phase: str, indent: int) -> str:
    return " " * indent + f"_wp.mark({PHASES.index(phase)})\n"


_PATCHES: tuple[tuple[str, str, str], ...] = (
    (
        _W,
        "log = logging.getLogger(__name__)\n",
        "from triton_mp import _wp\n\nlog = logging.getLogger(__name__)\n",
    ),
    (
        _W,
        "        reqs = self._gather.decoded(batch.requests)\n",
        "        reqs = self._gather.decoded(batch.requests)\n" + _m("decode", 8),
    ),
    (
        _W,
        "            results, t_input, t_infer = self._execute(batch, reqs)\n",
        _m("start", 12) + "            results, t_input, t_infer = self._execute(batch, reqs)\n",
    ),
    (
        _W,
        "        if self._cancelled and not self._decoupled:\n",
        _m("results", 8) + "        if self._cancelled and not self._decoupled:\n",
    ),
    (
        _W,
        "        t0 = time.perf_counter_ns()\n        try:\n",
        _m("prewake", 8) + "        t0 = time.perf_counter_ns()\n        try:\n",
    ),
    (
        # NOTE: ``failed = `` until Answers.answer also returned the rescheduled (s19wk),
        # ``failed, rescheduled = `` since.
        _W,
        " = self._answers.answer(reqs, results)\n",
        " = self._answers.answer(reqs, results)\n" + _m("answer", 12),
    ),
    (
        _W,
        "                    reoffered=reoffered,\n                )\n            )\n",
        "                    reoffered=reoffered,\n                )\n            )\n"
        + _m("done", 8)
        + "        _wp.counts[0] += 1\n        _wp.counts[1] += len(reqs)\n",
    ),
    (
        _W,
        "        runnable, backend_reqs = self._gather.backend_requests(reqs, results)\n",
        "        runnable, backend_reqs = self._gather.backend_requests(reqs, results)\n"
        + _m("gather", 8),
    ),
    (
        _B,
        "log = logging.getLogger(__name__)\n",
        "from triton_mp import _wp\n\nlog = logging.getLogger(__name__)\n",
    ),
    (
        _B,
        "            pb_requests = self._pb_requests(requests, sequence)\n",
        "            pb_requests = self._pb_requests(requests, sequence)\n" + _m("pb_requests", 12),
    ),
    (
        _B,
        "            responses = self._execute(pb_requests)\n",
        "            responses = self._execute(pb_requests)\n" + _m("execute", 12),
    ),
    (
        _M,
        "log = logging.getLogger(__name__)\n",
        "from triton_mp import _wp\n\nlog = logging.getLogger(__name__)\n",
    ),
    (
        _M,
        "    while True:\n        if watch is None:\n",
        "    _wp.start()\n    while True:\n        if watch is None:\n",
    ),
    (
        _M,
        "            if not msgs:\n                _wait(inbox, due)\n",
        "            if not msgs:\n                _wait(inbox, due)\n"
        "                _wp.counts[2] += 1\n" + _m("wait", 16),
    ),
    (
        _M,
        "                due.arrived(len(msg.requests))\n                worker.run_batch(msg)\n",
        "                due.arrived(len(msg.requests))\n"
        + _m("drain", 16)
        + "                worker.run_batch(msg)\n"
        + _m("release", 16),
    ),
    (
        _M,
        "        if stop is not None:\n            return stop.readers_s\n",
        "        if stop is not None:\n            _wp.write()\n"
        "            return stop.readers_s\n",
    ),
)


def instrument(src: Path, out: Path) -> None:
    """Patch ``src`` (an exported ``src/``) to write its phase sums under ``out``."""
    pkg = src / "triton_mp"
    (pkg / "_wp.py").write_text(_MODULE.format(phases=PHASES, out=str(out)))
    for rel, old, new in _PATCHES:
        patch_source(pkg / rel, [(old, new)], "worker_phases")


def one_run(
    src: Path, out: Path, label: str, args: argparse.Namespace, peers: dict[str, str]
) -> str:
    """One server of ``src`` under perf_analyzer; its lines of figures."""
    for old in out.glob("phases_*.txt"):
        old.unlink()
    with perf_window(src, out / "server.log", args, peers) as server:
        pids = [p for p, _ in descendants(server.pid or 0)]
        c0, n0 = role_ticks(pids), counts(server, args.model)
        time.sleep(args.seconds)
        c1, n1 = role_ticks(pids), counts(server, args.model)
    inf, ex = n1[0] - n0[0], max(n1[1] - n0[1], 1)
    head = f"{label}: {inf / args.seconds:,.0f} infer/s, batch {inf / ex:.2f}, workers "
    head += f"{(c1['worker'] - c0['worker']) * TICK_US / max(inf, 1):.1f} CPU µs/inference, "
    head += f"load {os.getloadavg()[0]:.1f}"
    files = sorted(out.glob("phases_*.txt"))
    if not files:
        return f"{head}; no phases written"
    batches, requests, waits, *acc = (int(v) for v in files[0].read_text().split())
    b, r = max(batches, 1), max(requests, 1)
    head += f"; first instance: {batches} batches of {requests / b:.2f}, {waits / b:.2f} sleeps"
    head += f" per batch, {sum(acc) / 1000 / b:.1f} µs/batch in all"
    rows = [
        f"    {p:12s} {a / 1000 / b:7.1f} µs/batch {a / 1000 / r:6.2f} µs/request"
        for p, a in zip(PHASES, acc, strict=True)
    ]
    return "\n".join([head, *rows])


def main() -> int:
    ap = window_parser(__doc__.split("\n\n")[0], "a python model (its backend is patched)")
    args = ap.parse_args()
    peers = load_peers_env(BENCH.parent / ".peers" / "peers.env")
    trees: dict[str, tuple[Path, Path]] = {}
    for rev in args.commits:
        src = export_commit(rev)
        out = src.parent / "worker_phases"
        out.mkdir(exist_ok=True)
        instrument(src, out)
        trees[rev] = (src, out)
    for rnd, rev, (src, out) in alternating(trees, args.rounds):
        print(one_run(src, out, f"round {rnd} {rev}", args, peers), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
