"""bench_vs_triton.py's rule for rerunning a workload's round: pure functions of its records.

A round's ratio for a workload compares its sides' perf_analyzer runs taken seconds apart. When
perf_analyzer finds no stable measurement for one side (after ``pa_run.py``'s own attempts),
that side has no figure in the round and the round drops out of the workload's ratios. Instead,
the workload's round is measured again, every side back to back in the same order (so the
ratio still compares neighbours), up to ``--round-tries`` times in all; the records of the
tries that were rerun are kept in the round's ``reruns`` and the output says so. Any other
failure (a model not ready, a server that did not start, a timeout) is not rerun: it would
fail the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

UNSTABLE = "stable measurement"
"""What perf_analyzer prints when it gives up on stability ("Failed to obtain stable
measurement within 10 measurement windows ..."); ``pa_run.py`` retries on the same words."""

DEFAULT_ROUND_TRIES = 2
"""A workload's round is measured at most this often (the first try and one rerun)."""


def unstable_sides(records: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The sides (in ``records``' order) whose run has no figure because perf_analyzer found
    no stable measurement."""
    return [
        side
        for side, rec in records.items()
        if rec.get("throughput") is None and UNSTABLE in str(rec.get("error", ""))
    ]


def rerun_round(records: Mapping[str, Mapping[str, Any]], tries: int, max_tries: int) -> bool:
    """Whether to measure the workload's round again: a side was unstable (``unstable_sides``)
    and the round has had fewer than ``max_tries`` tries (``tries`` so far, counting this one)."""
    return tries < max_tries and bool(unstable_sides(records))


def rerun_line(
    label: str, round_no: int, records: Mapping[str, Mapping[str, Any]], tries: int, max_tries: int
) -> str:
    """The line that says a workload's round is rerun, and why."""
    return (
        f"  {label}: perf_analyzer found no stable measurement for "
        f"{', '.join(unstable_sides(records))}; rerunning round {round_no} of this workload "
        f"(try {tries + 1} of {max_tries})"
    )


def rerun_summary(rounds: list[dict[str, Any]]) -> list[str]:
    """One line per workload round that was rerun, for the report below the tables."""
    lines = []
    for r in rounds:
        for rerun in r.get("reruns", []):
            lines.append(
                f"round {r['round']}: {rerun['workload']} rerun after try {rerun['try']} "
                f"(no stable measurement for {', '.join(rerun['unstable'])})"
            )
    return lines
