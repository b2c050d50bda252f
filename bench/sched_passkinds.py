#!/usr/bin/env python3
"""The scheduler's loop passes by kind, and each kind's thread CPU, in a running server.

    python bench/sched_passkinds.py --commits main HEAD --rounds 2 --seconds 8    # add_sub_py c=16

``sched_phases.py`` splits the scheduler's CPU by phase of its loop; this splits it by kind of
pass, so a change meant to save passes shows which passes went and what came instead (a
pass saved can come back as a wake-up: #34, session 15's ``Router.recheck``). Each commit's
src/ is exported and its ``scheduler/main.py`` patched so that ``_serve`` keys every pass by
(how it waited, ``BatchDone`` s drained up to 2, other messages drained up to 3, batches
formed) and adds its ``time.thread_time_ns`` (from the end of one pass's dispatch to the end
of the next one's: the flush, the words, the wait, the drain, the handling, the dispatch).
How it waited: ``due`` (the timed sleep to the lead before a deadline, or the poll within
it), ``woken`` (a sleep or spin that a post ended), ``early`` (a post ended the sleep before
the lead),
``recheck`` (no sleep: a word was cleared and a ring held a record, a deadline ahead) and
``zero`` (no sleep: the same without a deadline ahead, or a deadline already due), each
suffixed with the words that changed before it (D: a ``BatchDone`` quiet flag cleared, R: a
request bit cleared, F: the forming words). Prints, per commit and round, each kind per
batch with its CPU per pass and per batch (kinds under 0.01 per batch left out). The patch
matches ``_serve``'s text as of 2026-12-07 and fails loudly where a commit's loop differs.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import sched_phases
from sched_phases import main

_PATCHES = (
    (
        "    passes = 0\n    lead = lead or WakeLead()\n    while True:\n        passes += 1\n",
        "    passes = 0\n    lead = lead or WakeLead()\n    import collections as _co\n"
        "    import time as _t\n    _K = _co.Counter()\n    _C = _co.Counter()\n"
        "    _tp = _t.thread_time_ns()\n    while True:\n        passes += 1\n",
    ),
    (
        "        asked = router.quiet_done(quiet)\n"
        "        asked = router.quiet_requests(requests) or asked\n"
        "        asked = router.forming(forming) or asked\n",
        "        _a1 = router.quiet_done(quiet)\n        _a2 = router.quiet_requests(requests)\n"
        "        _a3 = router.forming(forming)\n        asked = _a1 or _a2 or _a3\n"
        "        _ab = ('D' if _a1 else '') + ('R' if _a2 else '') + ('F' if _a3 else '')\n",
    ),
    (
        "        due = False\n        if not poll_s:\n            inbox.wait(sleep_s)\n",
        "        due = False\n        _ahead = deadline is not None and deadline > now\n"
        "        if not poll_s:\n            _w = inbox.wait(sleep_s)\n"
        "            if sleep_s == 0.0:\n"
        "                _wk = ('recheck' if asked and _ahead else 'zero') + _ab\n"
        "            else:\n                _wk = 'woken' if _w else 'timeout'\n",
    ),
    (
        "        elif deadline is not None and not (sleep_s and inbox.wait(sleep_s)):\n"
        "            due = True\n",
        "        elif deadline is not None and not (sleep_s and inbox.wait(sleep_s)):\n"
        "            due = True\n            _wk = 'due'\n",
    ),
    (
        "        msgs = done_first(inbox.drain())\n",
        "        else:\n            _wk = 'early'\n        msgs = done_first(inbox.drain())\n"
        "        _nd = sum(1 for m in msgs if type(m) is BatchDone)\n"
        "        _nr = len(msgs) - _nd\n        _b0 = core._next_batch_id\n",
    ),
    (
        "        if core.stopping:\n            router.flush()\n            return passes\n",
        "        if core.stopping:\n            router.flush()\n"
        "            log.info('passkinds %r', dict(_K))\n"
        "            log.info('passcpu %r', dict(_C))\n            return passes\n",
    ),
    (
        "        deliver(core, core.dispatch(now), router.send, now)\n",
        "        deliver(core, core.dispatch(now), router.send, now)\n"
        "        _k = (_wk, min(_nd, 2), min(_nr, 3), core._next_batch_id - _b0)\n"
        "        _K[_k] += 1\n        _C[_k] += _t.thread_time_ns() - _tp\n"
        "        _tp = _t.thread_time_ns()\n",
    ),
)


def instrument(src: Path) -> None:
    """Patch ``src``'s ``scheduler/main.py`` (module docstring)."""
    sched_phases.patch_serve(src, _PATCHES, "sched_passkinds")


def report(label: str, log_text: str) -> str:
    """The kinds table of one server's log."""
    kinds = re.findall(r"passkinds (\{.*\})", log_text)
    cpu = re.findall(r"passcpu (\{.*\})", log_text)
    if not kinds or not cpu:
        return f"  {label}: no pass kinds logged"
    count: dict[tuple[str, int, int, int], int] = ast.literal_eval(kinds[-1])
    ns: dict[tuple[str, int, int, int], int] = ast.literal_eval(cpu[-1])
    passes = sum(count.values())
    batches = max(sum(k[3] * v for k, v in count.items()), 1)
    rows = [
        f"  {label}: {passes} passes, {batches} batches ({passes / batches:.2f} per batch), "
        f"{sum(ns.values()) / 1000 / batches:.1f} CPU µs per batch; "
        "(wait, BatchDones, other messages, batches formed): per batch, CPU µs per pass, per batch"
    ]
    for k, v in sorted(count.items(), key=lambda kv: -kv[1]):
        if v / batches >= 0.01:
            us = ns[k] / 1000
            rows.append(f"    {k!s:28s} {v / batches:6.3f} {us / v:7.1f} {us / batches:6.1f}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main(instrument, report, __doc__))
