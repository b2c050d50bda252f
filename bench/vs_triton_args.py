"""``bench_vs_triton.py``'s command line: what is measured and where the results go, which
servers run and how, and the options resolved into workloads and sides (not a script).

Split from ``bench_vs_triton.py`` (one concept per module); ``bench_vs_triton.parse_args``
is the entry point its tests call.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from common import DEFAULT_PA_RUN, DEFAULT_PEERS_ENV, ROOT
from vs_triton_rerun import DEFAULT_ROUND_TRIES
from vs_triton_workloads import (
    DEFAULT_PNG,
    DEFAULT_REPOSITORY,
    OCR_1CORE_BATCH,
    SIDES,
    WORKLOADS,
)


def _add_run_options(ap: argparse.ArgumentParser) -> None:
    """What is measured and where the results go: repositories, rounds, windows, workloads."""
    ap.add_argument(
        "--repository",
        type=Path,
        default=DEFAULT_REPOSITORY,
        help="model repository served by both servers (default: %(default)s)",
    )
    ap.add_argument(
        "--mp-repository",
        type=Path,
        help="serve triton-mp from this repository instead (a stand-in with the same "
        "model names and I/O, e.g. ONNX models; the table says so)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        help="alternating rounds; the ratio is the median over rounds (default 3, 1 with --quick)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: -p 1000, one attempt per run, one round (unless --rounds)",
    )
    ap.add_argument(
        "-p",
        "--window-ms",
        type=int,
        help="perf_analyzer measurement window (default 3000, 1000 with --quick)",
    )
    ap.add_argument(
        "-s",
        "--stability-percentage",
        type=int,
        help="perf_analyzer's -s, the same for both servers (default: "
        "perf_analyzer's 10; 50 with --quick)",
    )
    ap.add_argument(
        "--core0-batch",
        type=int,
        default=OCR_1CORE_BATCH,
        help="the 1-core ocr_cls config's max_batch_size and preferred batch size "
        "(default %(default)s: ocr_1core_config)",
    )
    ap.add_argument(
        "--pinned-nice",
        type=int,
        default=None,
        help="the nice value of the pinned ocr_cls sides (the server and raw onnxruntime on "
        "cpu 0, perf_analyzer on cpu 1; e.g. -10 on a machine others load: the three then "
        "take their cores from the background alike); default: this process's",
    )
    ap.add_argument(
        "--round-tries",
        type=int,
        default=DEFAULT_ROUND_TRIES,
        help="measure a workload's round at most this often while perf_analyzer finds no "
        "stable measurement for one of its sides (default %(default)s: one rerun)",
    )
    ap.add_argument(
        "--workloads",
        default=",".join(w.key for w in WORKLOADS),
        help="comma-separated subset of: %(default)s",
    )
    ap.add_argument("--json", type=Path, help="write every record and the summary here")
    ap.add_argument(
        "--png",
        type=Path,
        help="chart of throughput and p99 latency (default: beside --json, with its stem "
        f"and .png; without --json {DEFAULT_PNG})",
    )
    ap.add_argument("--no-png", action="store_true", help="do not write the chart")


def _add_server_options(ap: argparse.ArgumentParser) -> None:
    """Which servers run and how: commits, sides, peers, /dev/shm, timeouts."""
    ap.add_argument(
        "--peers-env",
        type=Path,
        default=DEFAULT_PEERS_ENV,
        help="env file written by install-peers.sh; installed there when missing "
        "(default: %(default)s)",
    )
    ap.add_argument(
        "--server-cmd",
        help="command that starts triton-mp, before --model-repository etc. "
        "(default: this checkout's, 'python -m triton_mp start' with src/ "
        "first on PYTHONPATH)",
    )
    ap.add_argument(
        "--mp-commit",
        metavar="REV",
        help="run triton-mp as committed at REV (its src/ exported with git archive "
        "to a temporary folder), not the working tree that others may be "
        "editing; e.g. HEAD",
    )
    ap.add_argument(
        "--baseline",
        metavar="REV",
        help="also run triton-mp as committed at REV ('triton-mp base') next to this one on "
        "every workload triton-mp runs: an A/B of two commits in the same rounds",
    )
    ap.add_argument(
        "--skip-sides",
        default="",
        help="comma-separated servers not to run, e.g. 'triton-mp fp2,identity floor'",
    )
    ap.add_argument(
        "--no-private-shm",
        dest="private_shm",
        action="store_false",
        help="run in the machine's /dev/shm, not in a private one (see README)",
    )
    ap.add_argument("--pa-run", type=Path, default=DEFAULT_PA_RUN, help="default: %(default)s")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--stop-timeout", type=float, default=30.0)


def _finish_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> argparse.Namespace:
    """Resolve the parsed options (``ap`` reports what is wrong): workloads and sides,
    defaults that depend on --quick."""
    keys = [k.strip() for k in a.workloads.split(",") if k.strip()]
    known = {w.key: w for w in WORKLOADS}
    unknown = [k for k in keys if k not in known]
    if unknown or not keys:
        ap.error(f"--workloads: unknown {unknown}; choose from {', '.join(known)}")
    skip = {x.strip() for x in a.skip_sides.split(",") if x.strip()}
    if skip - set(SIDES):
        ap.error(f"--skip-sides: unknown {sorted(skip - set(SIDES))}; choose from {SIDES}")
    a.workloads = []
    for k in keys:
        sides = [x for x in known[k].sides if x not in skip]
        if a.baseline and "triton-mp" in sides:
            sides.insert(sides.index("triton-mp") + 1, "triton-mp base")
        a.workloads.append(dataclasses.replace(known[k], sides=tuple(sides)))
    a.rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    a.window_ms = a.window_ms or (1000 if a.quick else 3000)
    a.attempts = 1 if a.quick else 3
    if a.stability_percentage is None and a.quick:
        a.stability_percentage = 50
    if a.png is None:
        a.png = a.json.with_suffix(".png") if a.json else DEFAULT_PNG
    a.repository = a.repository.resolve()
    a.mp_repository = (a.mp_repository or a.repository).resolve()
    a.peers_env = a.peers_env.resolve()
    a.mp_src = ROOT / "src"
    a.base_src = None
    a.ort_model = None
    if a.mp_commit and a.server_cmd:
        ap.error("--mp-commit and --server-cmd exclude each other")
    if a.round_tries < 1:
        ap.error("--round-tries: at least 1")
    return a


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """The resolved options of ``argv`` (``sys.argv[1:]`` when None); ``description`` heads
    ``--help``."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _add_run_options(ap)
    _add_server_options(ap)
    return _finish_args(ap, ap.parse_args(argv))
