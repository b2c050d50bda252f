"""One server of an exported commit under a perf_analyzer window, and the rounds around it:
what the phase tools share (``worker_phases.py``, ``sched_phases.py`` and the tools built on
it, ``sched_formwords.py`` and ``sched_passkinds.py``).

Each tool patches an exported commit's src/ (``exports``), then per round starts each
commit's server in turn (the order alternates, ``alternating``), drives ``--model`` with
perf_analyzer (``--concurrency-range C``, gRPC) and samples the server after ``--warmup`` and
again ``--seconds`` later (``perf_window``); ``window_parser`` is their common command line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from common import BENCH, TritonMP

T = TypeVar("T")

PA_MARGIN_S = 8.0
"""perf_analyzer's one window outlasts ``warmup + seconds`` by this much: it is killed once
the second sample is taken, never ending (and going quiet) inside the window."""


def window_parser(description: str, model_help: str | None = None) -> argparse.ArgumentParser:
    """The phase tools' flags: ``--commits`` (revs), ``--model`` (default ``add_sub_py``),
    ``-c`` (concurrency, 16), ``--rounds`` (2), ``--seconds`` (the window, 10) and
    ``--warmup`` (3, seconds before the first sample)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--commits", nargs="+", required=True, help="revs, e.g. main HEAD")
    ap.add_argument("--model", default="add_sub_py", help=model_help)
    ap.add_argument("-c", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    return ap


def alternating(items: dict[str, T], rounds: int) -> Iterator[tuple[int, str, T]]:
    """``(round from 1, key, value)`` for each item per round, in the dict's order in odd
    rounds and reversed in even ones (so neither commit always runs first)."""
    for r in range(rounds):
        order: Iterable[tuple[str, T]] = items.items() if r % 2 == 0 else reversed(items.items())
        for key, value in order:
            yield r + 1, key, value


@contextmanager
def perf_window(
    src: Path, log: Path, args: argparse.Namespace, peers: dict[str, str]
) -> Iterator[TritonMP]:
    """``src``'s server (its log at ``log``) serving ``args.model`` of bench/model_repository
    under perf_analyzer (``peers["PERF_ANALYZER"]``, gRPC, ``args.c`` concurrent requests);
    yields it ``args.warmup`` seconds in, for the caller to sample, sleep ``args.seconds`` and
    sample again. Kills perf_analyzer and stops the server when the block ends."""
    server = TritonMP(BENCH / "model_repository", log, src=src)
    server.start([args.model])
    pa = [peers["PERF_ANALYZER"], "-i", "grpc", "-u", server.url, "-m", args.model]
    pa += ["--concurrency-range", str(args.c)]
    pa += ["-p", str(int((args.warmup + args.seconds + PA_MARGIN_S) * 1000)), "--max-trials", "1"]
    proc = subprocess.Popen(
        pa, env={**os.environ, **peers}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(args.warmup)
        yield server
    finally:
        proc.kill()
        proc.wait()
        server.stop()
