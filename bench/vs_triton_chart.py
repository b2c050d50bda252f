"""bench_vs_triton.py's PNG: throughput and p99 latency per workload and side."""

from __future__ import annotations

import argparse
import datetime
import platform
import textwrap
from pathlib import Path
from typing import Any

import common  # bench/common.py: bench/ is on sys.path when this runs as a script
from common import fmt, med
from vs_triton_workloads import SIDES

COLORS = {
    "Triton": "#76b900",
    "triton-mp": "#1f6fb4",
    "triton-mp base": "#b07aa1",
    "triton-mp fp2": "#7aa6d6",
    "triton-mp python": "#0b3d6b",
    "floor": "#999999",
    "native floor": "#555555",
    "identity floor": "#c8c8c8",
    "onnxruntime": "#e0a040",
    "triton-mp core0": "#4f9fd8",
    "onnxruntime core0": "#f0c070",
}
"""Each side's bar colour."""


def side_labels(mp_name: str) -> dict[str, str]:
    """Each side's legend entry (``mp_name``: how this checkout's triton-mp is named)."""
    return {
        "Triton": "Triton 2.51 (python backend)",
        "triton-mp": mp_name,
        "triton-mp base": "triton-mp base (--baseline)",
        "triton-mp fp2": mp_name + " --frontend-processes 2",
        "triton-mp python": mp_name + " --grpc-frontend python",
        "floor": "Python floor (floor_server.py)",
        "native floor": "native floor (peers/native_floor, C++ libgrpc++)",
        "identity floor": "identity floor (floor_identity.py)",
        "onnxruntime": "raw onnxruntime, best batched (ocr_cls; p99 per batch)",
        "triton-mp core0": mp_name + " on core 0 (perf_analyzer on core 1)",
        "onnxruntime core0": "raw onnxruntime on core 0, one thread, best batch",
    }


def _bars(
    ax: Any,
    here: list[tuple[float, dict[str, Any]]],
    key: str,
    per_round: str,
    width: float,
    color: str,
    label: str,
) -> None:
    """One side's bars on one axis: the median ``key`` at each x of ``here``, whiskers from
    the rounds' ``per_round`` min to max, the value written above ("not measured" at 0)."""
    xs = [xv for xv, _ in here]
    vals = [s[key] for _, s in here]
    lows = [
        v - min(s[per_round]) if v is not None else 0 for v, (_, s) in zip(vals, here, strict=True)
    ]
    highs = [
        max(s[per_round]) - v if v is not None else 0 for v, (_, s) in zip(vals, here, strict=True)
    ]
    ax.bar(
        xs,
        [v or 0 for v in vals],
        width,
        color=color,
        label=label,
        yerr=[lows, highs],
        capsize=3,
        error_kw={"elinewidth": 1, "alpha": 0.7},
    )
    for xv, v, hi in zip(xs, vals, highs, strict=True):
        if v is None:
            ax.text(
                xv,
                0.02,
                "not\nmeasured",
                ha="center",
                va="bottom",
                fontsize=7,
                color=color,
                transform=ax.get_xaxis_transform(),
            )
        else:
            text = f"{v:.3g}" if v < 1000 else f"{v:.0f}"
            ax.text(xv, (v + hi) * 1.04, text, ha="center", va="bottom", fontsize=7)


def _log_axes(ax_t: Any, ax_l: Any, rows: list[dict[str, Any]], title: str) -> None:
    """Log scales with plain tick labels, room for the labels, titles and the x labels."""
    import matplotlib.ticker

    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for ax, per_round in ((ax_t, "throughputs"), (ax_l, "p99s_ms")):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        seen = [v for r in rows for side in r["sides"] for v in r[side][per_round]]
        if seen:  # room below the smallest bar and above the tallest for the labels
            ax.set_ylim(min(seen) / 3, max(seen) * 2.5)
        ax.grid(axis="y", which="both", alpha=0.25)
    ax_t.set_ylabel("throughput, infer/s (log)")
    ax_t.set_title(title, pad=22, fontsize=11)
    ax_t.legend(loc="upper right", fontsize=8)
    ax_l.set_ylabel("p99 latency, ms (log)")
    ax_l.set_xticks(
        list(range(len(rows))),
        [
            (r["label"] + ("" if r["protocol"] == "grpc" else " HTTP")).replace(" c=", "\nc=")
            for r in rows
        ],
        fontsize=8,
    )


def chart(rows: list[dict[str, Any]], path: Path, title: str, note: str, mp_name: str) -> None:
    """The PNG at ``path``: per workload (x), each side's median throughput (top) and p99
    latency (bottom) with min-max whiskers over rounds, and triton-mp/Triton's ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = side_labels(mp_name)
    present = [side for side in SIDES if any(side in r["sides"] for r in rows)]
    x = list(range(len(rows)))
    width = 0.8 / len(present)
    fig, (ax_t, ax_l) = plt.subplots(2, 1, figsize=(12, 8.5), sharex=True)
    for k, side in enumerate(present):
        here = [
            (xv + (k - (len(present) - 1) / 2) * width, r[side])
            for xv, r in zip(x, rows, strict=True)
            if side in r
        ]
        for ax, key, per_round in (
            (ax_t, "throughput", "throughputs"),
            (ax_l, "p99_ms", "p99s_ms"),
        ):
            _bars(ax, here, key, per_round, width, COLORS[side], labels[side])
    for xv, r in zip(x, rows, strict=True):
        if r["ratio"] is not None:
            ax_t.text(
                xv,
                1.0,
                f"{r['ratio']:.2f}x",
                ha="center",
                va="bottom",
                fontsize=9,
                fontweight="bold",
                transform=ax_t.get_xaxis_transform(),
            )
    _log_axes(ax_t, ax_l, rows, title)
    fig.text(0.01, 0.005, "\n".join(textwrap.wrap(note, 190)), fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_chart(
    result: dict[str, Any],
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    started: datetime.datetime,
    mp_name: str,
    stand_in: bool,
) -> None:
    """The run's PNG at ``args.png``, its note naming the run (time, host, commit, rounds,
    background load); records the path in ``result["png"]``."""
    cpus = result["host"]["cpus_usable"]
    bg = med(
        [
            common.other_cores(rec)
            for r in result["rounds"]
            for rec in r["runs"]
            if rec.get("throughput") is not None
        ]
    )
    note = (
        f"{started:%Y-%m-%d %H:%M} UTC, {platform.node()}, {cpus} CPUs shared by "
        f"server and perf_analyzer; triton-mp {result.get('triton_mp', '?')}; "
        f"perf_analyzer -i grpc (HTTP: -i http) -p {args.window_ms}; "
        f"{len(result['rounds'])} alternating round(s): "
        f"bars = median, whiskers = min-max; label = median ratio "
        f"triton-mp/Triton; background load (other processes) during the runs: "
        f"median {fmt(bg, '.2f')} cores"
    )
    if stand_in:
        note += f"; triton-mp served a STAND-IN repository ({args.mp_repository.name})"
    title = f"triton-mp vs Triton 2.51: the same perf_analyzer runs on the same {cpus} CPUs"
    chart(rows, args.png, title, note, mp_name)
    result["png"] = str(args.png)
