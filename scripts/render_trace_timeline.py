#!/usr/bin/env python3
"""Draw a ``triton-mp trace timeline`` document as a PNG (the README's timeline picture).

Usage: render_trace_timeline.py TIMELINE.json OUT.png [--title TEXT]

One band per process track (frontend, scheduler, each model's worker), one row per trace in
each band, a bar per complete event coloured by its name, a tick per instant event
(INFER_RESPONSE_COMPLETE). It reads only the Chrome trace-event JSON, so the picture shows
exactly what Perfetto would. Needs matplotlib (the ``test`` extra has it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLOURS = {
    "read": "#8da0cb",
    "send": "#66c2a5",
    "queue": "#fc8d62",
    "input": "#e78ac3",
    "infer": "#a6d854",
    "output": "#ffd92f",
}
REQUEST = "#d9d9d9"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--title", default="triton-mp trace timeline")
    args = parser.parse_args()
    events = json.loads(args.timeline.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    rows: dict[tuple[int, int], int] = {}
    for pid in sorted(names):
        for tid in sorted({e["tid"] for e in events if e.get("pid") == pid and "tid" in e}):
            rows[(pid, tid)] = len(rows)
    fig, ax = plt.subplots(figsize=(12, 0.28 * len(rows) + 1.6))
    for e in events:
        if e["ph"] not in ("X", "i"):
            continue
        y = rows[(e["pid"], e["tid"])]
        if e["ph"] == "i":
            ax.plot([e["ts"], e["ts"]], [y - 0.4, y + 0.4], color="black", linewidth=1)
            continue
        colour = COLOURS.get(e["name"], REQUEST)
        height = 0.35 if colour == REQUEST else 0.7
        ax.barh(y, e["dur"], left=e["ts"], height=height, color=colour, edgecolor="none")
    ticks, labels = [], []
    for pid, name in sorted(names.items()):
        ys = [y for (p, _), y in rows.items() if p == pid]
        if not ys:
            continue
        ticks.append(sum(ys) / len(ys))
        labels.append(name)
        ax.axhline(max(ys) + 0.5, color="#999999", linewidth=0.5)
    ax.set_yticks(ticks, labels)
    ax.invert_yaxis()
    ax.set_xlabel("µs since the first timestamp (one CLOCK_MONOTONIC for every process)")
    ax.set_title(args.title)
    handles = [Patch(color=c, label=n) for n, c in COLOURS.items()]
    handles.append(Patch(color=REQUEST, label="request (REQUEST_START..END)"))
    ax.legend(handles=handles, loc="lower right", fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"{args.out}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
