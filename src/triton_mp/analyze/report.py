"""The analysis' outputs: a terminal table, ready config files, JSON, and an HTML page.

Written into the output folder:
- ``configs/<rank>_<variant>/config.pbtxt``: each recommended config, the effective config
  the server served while it was measured (text format), headed by its figures;
- ``summary.json``: every measured point, the Pareto front and the recommendations;
- ``report.html``: the summary table and charts (matplotlib PNGs embedded as data URIs, and
  written beside it as ``CHART_FILES``):
  throughput against p99 latency per variant with the Pareto front and the latency budget,
  resident memory per variant (instance processes and the rest of the server) and server
  CPU per inference by role. Without matplotlib the page has the tables only.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from triton_mp.analyze.sweep.checkpoint import Checkpoint
from triton_mp.analyze.sweep.pareto import Recommendation, pareto_front, recommend
from triton_mp.analyze.sweep.results import Result

if TYPE_CHECKING:
    from triton_mp.analyze.sweep.settings import Settings

MIB = 1 << 20
CHART_FILES = ("throughput_vs_latency.png", "memory_and_cpu.png")
"""The charts, also written as files beside report.html (for a README or a wiki)."""
NO_BATCHER_NOTE = (
    "measured without a dynamic batcher: serve it with --disable-auto-complete-config, or\n"
    "auto-complete turns dynamic batching on for a model that can batch (as Triton's does)"
)
COLUMNS = (
    "rank", "config", "conc", "infer/s", "p50 ms", "p95 ms", "p99 ms", "avg batch",
    "CPU ms/inf", "instances MiB", "server MiB",
)  # fmt: skip


def row(rank: str, r: Result) -> list[str]:
    """One table row of ``COLUMNS`` for result ``r``."""
    m = r.measurement
    if not m.ok:
        return [rank, r.point.variant.describe(), str(r.point.concurrency), "failed", m.error or ""]
    cpu = f"{m.cpu_ms_per_inference:.2f}" if m.cpu_ms_per_inference is not None else "-"
    return [
        rank,
        r.point.variant.describe(),
        str(r.point.concurrency),
        f"{m.throughput_per_s:.1f}",
        f"{m.p50_us / 1000:.2f}",
        f"{m.p95_us / 1000:.2f}",
        f"{m.p99_us / 1000:.2f}",
        f"{m.server.avg_batch:.2f}" if m.server else "-",
        cpu,
        f"{m.instances_rss_bytes / MIB:.0f}",
        f"{m.total_rss_bytes / MIB:.0f}",
    ]


def best_shipped(results: Sequence[Result], settings: Settings) -> Result | None:
    """The shipped config's best point under the constraints (its highest throughput)."""
    ok = [
        r
        for r in results
        if r.point.variant.shipped and settings.constraints.feasible(r.measurement)
    ]
    return max(ok, key=lambda r: r.measurement.throughput_per_s, default=None)


def table_rows(recs: Sequence[Recommendation], shipped: Result | None) -> list[list[str]]:
    """The summary: the recommendations, then the shipped config's best feasible point."""
    rows = [row(str(i + 1), rec.result) for i, rec in enumerate(recs)]
    if shipped is not None:
        rows.append(row("shipped", shipped))
    return rows


def print_table(rows: list[list[str]], title: str) -> None:
    """The summary as a rich table on the terminal."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in COLUMNS:
        table.add_column(c, justify="left" if c == "config" else "right")
    for r in rows:
        table.add_row(*r)
    Console(width=180).print(table)


def config_text(config: dict[str, Any], header: str) -> str:
    """``config`` (Triton's JSON form) as config.pbtxt text, headed by ``#`` comments."""
    from google.protobuf import json_format, text_format

    from triton_mp._proto import model_config_pb2

    msg = json_format.ParseDict(config, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    lines = "".join(f"# {line}\n" for line in header.splitlines())
    return lines + text_format.MessageToString(msg)


def write_configs(recs: Sequence[Recommendation], ckpt: Checkpoint, out: Path) -> list[Path]:
    """Each recommended variant's served config as ``configs/<rank>_<key>/config.pbtxt``."""
    paths = []
    for i, rec in enumerate(recs):
        v, m = rec.result.point.variant, rec.result.measurement
        header = (
            f"triton-mp analyze recommendation {i + 1}: {v.describe()}\n"
            f"measured at concurrency {rec.result.point.concurrency} ({m.load_generator}): "
            f"{m.throughput_per_s:.1f} infer/s, p99 {m.p99_us / 1000:.2f} ms, "
            f"server {m.total_rss_bytes / MIB:.0f} MiB resident"
        )
        if not v.dynamic_batching and v.max_batch_size > 0:
            header += "\n" + NO_BATCHER_NOTE
        path = out / "configs" / f"{i + 1}_{v.key()}" / "config.pbtxt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_text(ckpt.configs[v.key()], header))
        paths.append(path)
    return paths


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return buf.getvalue()


def charts(
    results: Sequence[Result], front: Sequence[Result], budget_ms: float | None
) -> list[bytes]:
    """The report's PNGs (``CHART_FILES``); empty when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    ok = [r for r in results if r.measurement.ok]
    by_variant: dict[str, list[Result]] = {}
    for r in ok:
        by_variant.setdefault(r.point.variant.describe(), []).append(r)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name, rs in by_variant.items():
        rs = sorted(rs, key=lambda r: r.point.concurrency)
        style: dict[str, Any] = (
            {"color": "black", "linewidth": 2.5} if rs[0].point.variant.shipped else {}
        )
        ax.plot(
            [r.measurement.p99_us / 1000 for r in rs],
            [r.measurement.throughput_per_s for r in rs],
            "o-",
            label=name,
            **style,
        )
    ax.scatter(
        [r.measurement.p99_us / 1000 for r in front],
        [r.measurement.throughput_per_s for r in front],
        s=160,
        facecolors="none",
        edgecolors="red",
        label="Pareto front (throughput, p99, memory)",
    )
    if budget_ms is not None:
        ax.axvline(budget_ms, color="red", linestyle="--", label=f"p99 budget {budget_ms:g} ms")
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (infer/s)")
    ax.set_title("Throughput vs p99 latency (one line per config, points = concurrency)")
    ax.legend(fontsize=7, loc="best")
    pngs = [_png(fig)]
    plt.close(fig)
    best = [max(rs, key=lambda r: r.measurement.throughput_per_s) for rs in by_variant.values()]
    names = [r.point.variant.key() for r in best]
    fig, (mem, cpu) = plt.subplots(1, 2, figsize=(12, 4.5))
    inst = [r.measurement.instances_rss_bytes / MIB for r in best]
    rest = [(r.measurement.total_rss_bytes - r.measurement.instances_rss_bytes) / MIB for r in best]
    mem.bar(names, inst, label="instance processes")
    mem.bar(names, rest, bottom=inst, label="rest of the server")
    mem.set_ylabel("resident memory (MiB)")
    mem.set_title("Server memory (at each config's best point)")
    mem.legend(fontsize=8)
    roles = sorted({k for r in best for k in r.measurement.cpu_ms_by_role})
    bottom = [0.0] * len(best)
    for role in roles:
        vals = [r.measurement.cpu_ms_by_role.get(role, 0.0) for r in best]
        cpu.bar(names, vals, bottom=bottom, label=role)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    cpu.set_ylabel("server CPU ms per inference")
    cpu.set_title("Server CPU per inference, by process role")
    cpu.legend(fontsize=8)
    for a in (mem, cpu):
        a.tick_params(axis="x", rotation=60, labelsize=7)
    pngs.append(_png(fig))
    plt.close(fig)
    return pngs


def html_page(
    title: str,
    notes: list[str],
    rows: list[list[str]],
    all_rows: list[list[str]],
    pngs: list[bytes],
) -> str:
    """The HTML report."""

    def table(rs: list[list[str]]) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rs
        )
        return f"<table><tr>{head}</tr>{body}</table>"

    imgs = "".join(
        f'<p><img src="data:image/png;base64,{base64.b64encode(p).decode()}"></p>' for p in pngs
    )
    notes_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1><ul>{notes_html}</ul>"
        f"<h2>Recommended configs</h2>{table(rows)}{imgs}"
        f"<h2>Every measured point</h2>{table(all_rows)}</body></html>"
    )


def gpu_note(results: Sequence[Result]) -> str:
    """GPU memory and utilisation per device, the highest over the points (NVML)."""
    peak: dict[tuple[int, str], tuple[int, int]] = {}
    for r in results:
        for g in r.measurement.gpus:
            used, util = peak.get((g.index, g.name), (0, 0))
            peak[(g.index, g.name)] = (max(used, g.used_bytes), max(util, g.utilization_percent))
    if not peak:
        return "GPU: none visible through NVML"
    return "GPU (highest over the points): " + "; ".join(
        f"{i} {name}: {used / MIB:.0f} MiB used, {util}% busy"
        for (i, name), (used, util) in sorted(peak.items())
    )


def write(settings: Settings, ckpt: Checkpoint, out: Path) -> list[Recommendation]:
    """Every output of the analysis (see the module docstring); returns the recommendations."""
    results = ckpt.results
    recs = recommend(results, settings.constraints, settings.objectives, settings.top)
    front = pareto_front(results)
    shipped = best_shipped(results, settings)
    rows = table_rows(recs, shipped)
    generator = next(
        (r.measurement.load_generator for r in results if r.measurement.load_generator), ""
    )
    c = settings.constraints
    notes = [
        f"model {settings.model}; {settings.search} search, "
        f"{len(results)} points measured by {generator}",
        f"constraints: p99 <= {c.latency_budget_ms} ms, throughput >= {c.min_throughput_per_s}/s, "
        f"server memory <= {c.max_memory_bytes} bytes (None: no limit)",
        f"objectives: {settings.objectives}",
        "memory: resident set (VmRSS) of each process of the server; "
        "'instances' sums the model's worker processes",
    ]
    notes.append(gpu_note(results))
    if not recs:
        notes.append("no measured config meets the constraints")
    title = f"triton-mp analyze: {settings.model}"
    print_table(rows, title)
    paths = write_configs(recs, ckpt, out)
    all_rows = [row("", r) for r in results]
    pngs = charts(results, front, c.latency_budget_ms)
    for name, png in zip(CHART_FILES, pngs, strict=False):
        (out / name).write_bytes(png)
    (out / "report.html").write_text(html_page(title, notes, rows, all_rows, pngs))
    summary = {
        "model": settings.model,
        "load_generator": generator,
        "results": msgspec.to_builtins(results),
        "pareto_front": [r.point.key() for r in front],
        "recommendations": [
            {"rank": i + 1, "point": rec.result.point.key(), "score": rec.score, "config": str(p)}
            for i, (rec, p) in enumerate(zip(recs, paths, strict=True))
        ],
        "shipped_best": shipped.point.key() if shipped else None,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return recs
