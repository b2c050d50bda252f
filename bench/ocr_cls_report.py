"""bench_ocr_cls.py's tables and summary: raw onnxruntime per batch size, the servers per
scheduler variant and concurrency, and the ratios to raw onnxruntime's best (medians over
rounds, per-round figures kept).
"""

from __future__ import annotations

import statistics
from typing import Any

from common import fmt, med

SCHEDULERS = {
    "dynamic": "dynamic batching (the repository's ocr_cls)",
    "none": "no dynamic batching (default scheduler)",
}
"""Scheduler variant -> what the tables call it."""


def ort_table(rows: list[dict[str, Any]]) -> str:
    sessions = list(dict.fromkeys(r["session"] for r in rows))
    batches = list(dict.fromkeys(r["batch"] for r in rows))
    by = {(r["session"], r["batch"]): r for r in rows}
    head = f"{'batch':>5} | " + " | ".join(f"{s:>32}" for s in sessions)
    lines = [head, "-" * len(head)]
    for b in batches:
        cells = []
        for s in sessions:
            r = by.get((s, b))
            cells.append(
                "-".rjust(32)
                if r is None
                else f"{r['infer_per_s']:>9.1f} img/s {r['batch_ms_p50']:>7.2f} ms "
                f"{r['cores']:>4.2f}c"
            )
        lines.append(f"{b:>5} | " + " | ".join(cells))
    noisy = [
        f"{r['session']} b={r['batch']}: {r['other_cores']:.1f}"
        for r in rows
        if r.get("other_cores", 0) > 0.3
    ]
    if noisy:
        lines.append(
            "WARNING: other processes used CPU meanwhile (cores): "
            + "; ".join(noisy)
            + " - these figures are low; rerun on a quiet machine"
        )
    return "\n".join(lines)


def server_table(summary: list[dict[str, Any]], rounds: int) -> str:
    head = (
        f"{'conc':>4} {'infer/s':>9} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'client c':>8} {'server c':>8} {'busy c':>6} {'queue us':>8} {'compute us':>10} "
        f"{'batch':>5}"
    )
    lines = [head, "-" * len(head)]
    for s in summary:
        ratio = fmt(s["ratio"], "6.3f")
        if rounds > 1 and s["ratios"]:
            ratio += f"  (rounds: {', '.join(format(r, '.3f') for r in s['ratios'])})"
        lines.append(
            f"{s['concurrency']:>4} {fmt(s['throughput'], '9.1f')} {ratio:>6} "
            f"{fmt(s['p50_ms'], '7.2f')} {fmt(s['p99_ms'], '7.2f')} "
            f"{fmt(s['client_cores'], '8.2f')} {fmt(s['server_cores'], '8.2f')} "
            f"{fmt(s['machine_cores_busy'], '6.2f')} {fmt(s['server_queue_us'], '8d')} "
            f"{fmt(s['server_compute_us'], '10d')} {fmt(s['avg_batch'], '5.2f')}"
            + (f"  ERROR: {s['error']}" if s.get("error") else "")
        )
    noisy = [
        f"c={s['concurrency']}: {others:.1f}"
        for s in summary
        if s["machine_cores_busy"] is not None
        and (others := s["machine_cores_busy"] - s["client_cores"] - s["server_cores"]) > 0.3
    ]
    if noisy:
        lines.append("WARNING: other processes used CPU meanwhile (cores): " + "; ".join(noisy))
    return "\n".join(lines)


def summarise(
    rounds: list[dict[str, Any]], concs: list[int], schedulers: list[str]
) -> dict[str, Any]:
    """Medians over rounds per scheduler variant and concurrency, and the per-round ratios
    dynamic / none where both ran in the same round."""
    best = [r["ort_best"]["infer_per_s"] for r in rounds if r.get("ort_best")]
    out: dict[str, Any] = {
        "ort_best_infer_per_s": med(best),
        "per_scheduler": {},
        "dynamic_vs_none": [],
    }
    for sched in schedulers:
        per_c = []
        for c in concs:
            recs = [
                rec
                for r in rounds
                for rec in r.get("triton_mp", [])
                if rec["concurrency"] == c and rec["scheduler"] == sched
            ]
            ok = [rec for rec in recs if rec.get("throughput") is not None]
            errors = [rec.get("error", "failed") for rec in recs if rec.get("throughput") is None]
            row: dict[str, Any] = {
                "concurrency": c,
                "rounds_ok": len(ok),
                "ratios": [rec["ratio"] for rec in ok],
            }
            row["ratio"] = round(statistics.median(row["ratios"]), 3) if ok else None
            row["throughput"] = med([rec["throughput"] for rec in ok])
            for k in (
                "client_cores",
                "server_cores",
                "machine_cores_busy",
                "server_queue_us",
                "server_compute_us",
                "avg_batch",
            ):
                row[k] = med([rec.get(k) for rec in ok])
            row["p50_ms"] = None if not ok else med([rec["p50_us"] for rec in ok]) / 1000
            row["p99_ms"] = None if not ok else med([rec["p99_us"] for rec in ok]) / 1000
            if errors:
                row["error"] = errors[-1].splitlines()[-1][-200:] if errors[-1] else "failed"
            per_c.append(row)
        out["per_scheduler"][sched] = per_c
    for c in concs:
        per_round = []
        for r in rounds:
            got = {
                rec["scheduler"]: rec["throughput"]
                for rec in r.get("triton_mp", [])
                if rec["concurrency"] == c and rec.get("throughput")
            }
            if "dynamic" in got and "none" in got:
                per_round.append(round(got["dynamic"] / got["none"], 3))
        out["dynamic_vs_none"].append(
            {
                "concurrency": c,
                "ratios": per_round,
                "ratio": round(statistics.median(per_round), 3) if per_round else None,
            }
        )
    return out


def comparison_table(summary: dict[str, Any], schedulers: list[str]) -> str:
    """One line per concurrency: each variant's infer/s and ratio to raw ORT best, and the
    ratio dynamic / none (medians over rounds, per-round figures in brackets)."""
    cols = [s for s in ("dynamic", "none") if s in schedulers]
    label = {"dynamic": "dynamic batching", "none": "no dynamic batching"}
    head = f"{'conc':>4} | " + " | ".join(f"{label[s]:>24}" for s in cols)
    if len(cols) == 2:
        head += " | dynamic/none"
    lines = [head, "-" * len(head)]
    rows = {s: {r["concurrency"]: r for r in summary["per_scheduler"][s]} for s in cols}
    for d in summary["dynamic_vs_none"]:
        c = d["concurrency"]
        cells = []
        for s in cols:
            r = rows[s][c]
            cells.append(
                f"{fmt(r['throughput'], '9.1f')} infer/s {fmt(r['ratio'], '5.3f')}x".rjust(24)
            )
        line = f"{c:>4} | " + " | ".join(cells)
        if len(cols) == 2:
            line += f" | {fmt(d['ratio'], '5.2f')}x"
            if len(d["ratios"]) > 1:
                line += f" ({', '.join(format(x, '.2f') for x in d['ratios'])})"
        lines.append(line)
    return "\n".join(lines)
