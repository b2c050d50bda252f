#!/usr/bin/env python3
"""Why the scheduler's forming words change, and what each recheck they cause reads.

    python bench/sched_formwords.py --commits main HEAD --rounds 2 --seconds 8    # add_sub_py c=16

A pass that changes the forming words (``Router.forming``: a new epoch, a fence) rechecks the
rings before it sleeps, and when one holds a record it makes another pass at once
(``sched_passkinds.py``'s ``recheckF`` / ``zeroF``). This tool says which change it was and
what that recheck found. Each commit's src/ is exported and patched (as ``sched_phases.py``
does) so that ``Router.forming`` names each change: ``start`` (no batch formed, one does now),
``end`` (none forms now), ``mask`` (other buckets), ``floor`` (another oldest request),
``rows`` (only the allowance: the scheduler read rows of the forming batch); and ``_serve``
counts, per pass that rechecked and found a record, (the words changed: these names, D a
``BatchDone`` quiet flag cleared, R a request bit cleared; the ``BatchDone`` s read, up to 1;
the other messages, up to 2), and per ``BatchDone`` such a recheck read, whether it ends the
batch the scheduler sent last and whether its instance's flag let it come quietly. Prints each
count per batch (counts under 0.01 per batch left out). The patch matches ``Router.forming``
and ``_serve`` as of 2026-12-07 and fails loudly where a commit's differ.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import sched_phases
from sched_phases import main

_PATCHES = (
    ("import logging\n", "import collections\nimport logging\n"),
    (
        "        if forming == self._forming:\n            return False\n",
        "        if forming == self._forming:\n            return False\n"
        "        was = self._forming\n"
        "        if not was.mask:\n            self._why = 'start'\n"
        "        elif not forming.mask:\n            self._why = 'end'\n"
        "        elif forming.mask != was.mask:\n            self._why = 'mask'\n"
        "        elif forming.floor_ns != was.floor_ns:\n            self._why = 'floor'\n"
        "        else:\n            self._why = 'rows'\n"
        "        _FW[self._why] += 1\n",
    ),
    (
        "    passes = 0\n    lead = lead or WakeLead()\n",
        "    passes = 0\n    lead = lead or WakeLead()\n    _last = -1\n",
    ),
    (
        "        asked = router.quiet_done(quiet)\n"
        "        asked = router.quiet_requests(requests) or asked\n"
        "        asked = router.forming(forming) or asked\n",
        "        _was_quiet = router._quiet\n        router._why = ''\n"
        "        _a1 = router.quiet_done(quiet)\n        _a2 = router.quiet_requests(requests)\n"
        "        _a3 = router.forming(forming)\n        asked = _a1 or _a2 or _a3\n"
        "        _rk = None\n",
    ),
    (
        "            sleep_s, poll_s = 0.0, 0.0\n",
        "            sleep_s, poll_s = 0.0, 0.0\n"
        "            _rk = router._why + ('D' if _a1 else '') + ('R' if _a2 else '')\n",
    ),
    (
        "        msgs = done_first(inbox.drain())\n",
        "        msgs = done_first(inbox.drain())\n"
        "        if _rk is not None:\n"
        "            _nd = sum(1 for m in msgs if type(m) is BatchDone)\n"
        "            _FW[('recheck', _rk, min(_nd, 1), min(len(msgs) - _nd, 2))] += 1\n"
        "            for m in msgs:\n"
        "                if type(m) is BatchDone:\n"
        "                    _b = 'last batch' if m.batch_id == _last else 'other'\n"
        "                    _q = 'quiet' if m.instance_id in _was_quiet else 'loud'\n"
        "                    _FW[('done read', _b, _q)] += 1\n",
    ),
    (
        "        if core.stopping:\n            router.flush()\n            return passes\n",
        "        if core.stopping:\n            router.flush()\n"
        "            log.info('formwords %r batches %d', dict(_FW), core._next_batch_id)\n"
        "            return passes\n",
    ),
    (
        "        deliver(core, core.dispatch(now), router.send, now)\n",
        "        _out = core.dispatch(now)\n"
        "        for _o in _out:\n"
        "            if isinstance(_o, ToInstance) and type(_o.msg) is BatchAssign:\n"
        "                _last = _o.msg.batch_id\n"
        "        deliver(core, _out, router.send, now)\n",
    ),
    ("\n_DISPATCH_NS = ", "\n_FW: collections.Counter = collections.Counter()\n_DISPATCH_NS = "),
)


def instrument(src: Path) -> None:
    """Patch ``src``'s ``scheduler/main.py`` (module docstring)."""
    sched_phases.patch_serve(src, _PATCHES, "sched_formwords")


def report(label: str, log_text: str) -> str:
    """The counts of one server's log, per batch."""
    found = re.findall(r"formwords (\{.*\}) batches (\d+)", log_text)
    if not found:
        return f"  {label}: no counts logged"
    counts: dict[object, int] = ast.literal_eval(found[-1][0])
    batches = max(int(found[-1][1]), 1)
    rows = [f"  {label}: {batches} batches; per batch:"]
    for k, v in sorted(counts.items(), key=lambda kv: (str(type(kv[0])), -kv[1])):
        if v / batches >= 0.01:
            rows.append(f"    {k!s:52s} {v / batches:6.3f}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main(instrument, report, __doc__))
