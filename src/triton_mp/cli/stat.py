"""``triton-mp stat``: the scheduler's queues as a table, a live ``top``-like view, or JSON.

Imported by ``triton_mp.cli.main`` (lazily, only for ``stat``); runs in the user's shell, never in
a server process. It renders ``ModelQueueStatus`` structs (``ipc.protocol.messages``) and knows
nothing of gRPC: ``triton_mp.cli.admin_client.fetch_queue_snapshot`` fetches them (with the
supervisor's frontend restart counts), and every function here also takes hand-made structs,
which is how the unit tests drive it.

What a screen shows, per model: its batching settings; per priority level the queue depth,
delayed requests, the oldest request's age, rejected and timed-out requests; per instance
whether it is live and the batch it is running; the histogram of formed batch sizes, why
batches closed, and the most recent batches.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import IO, TYPE_CHECKING

import msgspec

from triton_mp.common.close_reason import CloseReason
from triton_mp.common.errors import TritonMPError
from triton_mp.ipc.protocol.reports import ModelQueueStatus

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
    from rich.table import Table

NON_TTY_WIDTH = 160
"""Columns of a table printed to a file or pipe (rich would wrap at 80)."""
HISTOGRAM_ROWS = 10
"""At most this many histogram rows; more distinct sizes are grouped in power-of-two ranges."""

BAR_WIDTH = 12
"""Characters of the longest histogram bar."""

RECENT_ROWS = 8
"""Recent batches shown per model (``--json`` has all the scheduler sent)."""

Snapshot = tuple[tuple[ModelQueueStatus, ...], dict[int, int]]
"""``(models, frontend_restarts)``: the scheduler's queues, and per frontend id how many times
the supervisor restarted that frontend (the admin ``QueueStatusResponse.frontend_restarts``)."""

Fetch = Callable[[str, str], Snapshot]
"""``fetch(url, model)``: one snapshot; raises ``TritonMPError`` with a one-line message."""


# ------------------------------------------------------------------------------------ JSON
def _builtin(value: object) -> object:
    """Structs as dicts keyed by field name (recursively), tuples as lists."""
    if isinstance(value, msgspec.Struct):
        return {k: _builtin(v) for k, v in msgspec.structs.asdict(value).items()}
    if isinstance(value, tuple | list):
        return [_builtin(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _builtin(v) for k, v in value.items()}
    return value


def snapshot_json(
    models: Sequence[ModelQueueStatus],
    url: str,
    frontend_restarts: Mapping[int, int] | None = None,
) -> dict[str, object]:
    """One snapshot as JSON-ready builtins, with stable keys for scripts.

    ``{"url": ..., "frontend_restarts": {...}, "models": [...]}``; ``frontend_restarts`` maps
    each frontend id (a decimal string, ascending) to the supervisor's restarts of it; each
    model has every ``ModelQueueStatus`` field under its own name (ages in ``_us``);
    ``batch_sizes`` keys are decimal strings in ascending order; ``close_reasons`` always
    has every ``CloseReason`` (0 when none closed so), in its order, then any other reason
    the server sent.
    """
    out: list[object] = []
    for m in models:
        d = _builtin(m)
        assert isinstance(d, dict)
        d["batch_sizes"] = {str(k): v for k, v in sorted(m.batch_sizes.items())}
        reasons = {r.value: m.close_reasons.get(r.value, 0) for r in CloseReason}
        reasons.update({r: n for r, n in sorted(m.close_reasons.items()) if r not in reasons})
        d["close_reasons"] = reasons
        out.append(d)
    restarts = {str(k): v for k, v in sorted((frontend_restarts or {}).items())}
    return {"url": url, "frontend_restarts": restarts, "models": out}


def restarts_text(frontend_restarts: Mapping[int, int]) -> str:
    """The header's restart count: ``frontend restarts 0``, or the total and, per frontend
    that was restarted, its id and count (``frontend restarts 3 (#0: 1, #2: 2)``)."""
    total = sum(frontend_restarts.values())
    text = f"frontend restarts {total}"
    if total:
        text += " (" + ", ".join(f"#{k}: {v}" for k, v in sorted(frontend_restarts.items()) if v)
        text += ")"
    return text


# ------------------------------------------------------------------------------ formatting
def format_age_us(age_us: int, zero: str = "-") -> str:
    """A duration in microseconds for humans: ``zero`` (0), ``850 µs``, ``12.3 ms``, ``1.25 s``."""
    if age_us <= 0:
        return zero
    if age_us < 1_000:
        return f"{age_us} µs"
    if age_us < 1_000_000:
        ms = age_us / 1_000
        return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"
    s = age_us / 1_000_000
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


def histogram_rows(
    batch_sizes: dict[int, int], max_rows: int = HISTOGRAM_ROWS
) -> list[tuple[str, int]]:
    """``(label, batches)`` rows of the batch-size histogram, smallest size first.

    Each size has its own row while there are at most ``max_rows`` of them; beyond that
    sizes are grouped in ranges ``1``, ``2``, ``3-4``, ``5-8``, ``9-16`` ... (empty ranges
    omitted).
    """
    sizes = sorted(s for s, n in batch_sizes.items() if n > 0)
    if len(sizes) <= max_rows:
        return [(str(s), batch_sizes[s]) for s in sizes]
    groups: dict[tuple[int, int], int] = {}
    for s in sizes:
        hi = 1
        while hi < s:
            hi *= 2
        lo = hi // 2 + 1 if hi > 1 else 1
        groups[(lo, hi)] = groups.get((lo, hi), 0) + batch_sizes[s]
    return [(str(lo) if lo == hi else f"{lo}-{hi}", n) for (lo, hi), n in sorted(groups.items())]


def _bar(n: int, biggest: int) -> str:
    if n <= 0 or biggest <= 0:
        return ""
    eighths = max(1, round(n * BAR_WIDTH * 8 / biggest))
    full, rest = divmod(eighths, 8)
    return "█" * full + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[rest]


def _settings(m: ModelQueueStatus) -> list[str]:
    """The parts of a model's settings line (joined by `` · ``)."""
    parts = [f"{m.model} v{m.version}"]
    if m.scheduler == "dynamic":
        parts.append("dynamic batcher")
        parts.append(f"max batch {m.max_batch_size}")
        if m.preferred_batch_sizes:
            parts.append("preferred " + ", ".join(str(s) for s in m.preferred_batch_sizes))
        parts.append(f"max delay {format_age_us(m.max_queue_delay_us, zero='0 µs')}")
    else:
        parts.append(f"{m.scheduler} scheduler")
        if m.max_batch_size:
            parts.append(f"max batch {m.max_batch_size}")
    return parts


def _in_flight(requests: int, batch_size: int, batches: int) -> str:
    if batches <= 0:
        return "-"
    what = f"{batch_size}" if batches == 1 else f"{batches} batches, {batch_size}"
    return f"{what} ({requests} req)"


# ------------------------------------------------------------------------------- rendering
def _table(*columns: str, title: str | None = None) -> Table:
    from rich.table import Table

    # NOTE: no box: a column gap of two spaces keeps a model's block within ~100 columns.
    table = Table(
        *columns,
        title=title,
        title_justify="left",
        title_style="bold",
        header_style="underline",
        box=None,
        pad_edge=False,
    )
    for col in table.columns[1:]:
        col.justify = "right"
    for col in table.columns:
        col.no_wrap = True
    return table


class _Folded:
    """Parts joined by ``SEP`` on as few lines as the width allows, broken only between
    parts (continuation lines indented), so a long settings line never wraps mid-part."""

    SEP = " · "
    INDENT = "  "

    def __init__(self, parts: Sequence[str], style: str) -> None:
        self.parts = parts
        self.style = style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.text import Text

        lines: list[str] = []
        for part in self.parts:
            if lines and len(lines[-1]) + len(self.SEP) + len(part) <= options.max_width:
                lines[-1] += self.SEP + part
            else:
                lines.append((self.INDENT if lines else "") + part)
        for line in lines:
            yield Text(line, style=self.style, no_wrap=True, overflow="ellipsis")


class _SideBySide:
    """Tables side by side, as many to a row as the terminal's width allows (so an
    80-column terminal gets whole tables, some under others, rather than squeezed ones)."""

    GAP = 3

    def __init__(self, *parts: RenderableType) -> None:
        self.parts = parts

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.measure import Measurement
        from rich.table import Table
        from rich.text import Text

        rows: list[list[RenderableType]] = []
        used = 0
        for part in self.parts:
            width = Measurement.get(console, options, part).maximum
            if rows and used + self.GAP + width <= options.max_width:
                rows[-1].append(part)
                used += self.GAP + width
            else:
                rows.append([part])
                used = width
        for i, row in enumerate(rows):
            if i:
                yield Text("")
            grid = Table.grid(padding=(0, self.GAP))
            grid.add_row(*row)
            yield grid


def _queues(m: ModelQueueStatus) -> Table:
    table = _table("level", "depth", "delayed", "oldest", "rejected", "timed out", title="queue")
    levels = m.levels or ()
    for lv in levels:
        table.add_row(
            str(lv.level) if lv.level else "-",
            str(lv.depth),
            str(lv.delayed),
            format_age_us(lv.oldest_age_us, zero="0 µs" if lv.depth else "-"),
            str(lv.rejected),
            str(lv.timed_out),
            style="bold" if lv.depth else None,
        )
    if not levels:
        table.add_row("-", "0", "0", "-", "0", "0")
    return table


def _instances(m: ModelQueueStatus) -> Table:
    """Per instance: live, the batch it runs, and the batches it was given: those it ran
    (``executions``) and the one it runs, as the batch-size caption counts every batch
    formed (a running batch is in both)."""
    table = _table("instance", "live", "running", "batches", title="instances")
    table.columns[2].justify = "left"
    for inst in m.instances:
        table.add_row(
            inst.name,
            "yes" if inst.live else "[red]no[/red]",
            _in_flight(inst.requests_in_flight, inst.batch_size_in_flight, inst.batches_in_flight),
            str(inst.executions + inst.batches_in_flight),
        )
    return table


def _steps(m: ModelQueueStatus) -> Table:
    table = _table("step", "model", "in flight", "waiting", title="ensemble steps")
    table.columns[1].justify = "left"
    for i, step in enumerate(m.steps):
        table.add_row(str(i), step.model, str(step.in_flight), str(step.waiting))
    return table


def _histogram(m: ModelQueueStatus) -> Table:
    rows = histogram_rows(m.batch_sizes)
    total = sum(m.batch_sizes.values())
    requests = sum(s * n for s, n in m.batch_sizes.items())
    table = _table("size", "count", "", title="batch sizes")
    table.columns[2].justify = "left"
    if total:
        table.caption = f"{total} batches, mean {requests / total:.1f}"
        table.caption_justify = "left"
    biggest = max((n for _, n in rows), default=0)
    for label, n in rows:
        table.add_row(label, str(n), f"[cyan]{_bar(n, biggest)}[/cyan]")
    return table


def _reasons(m: ModelQueueStatus) -> Table:
    table = _table("reason", "count", "share", title="close reasons")
    total = sum(m.close_reasons.values())
    known = [r.value for r in CloseReason]
    names = known + sorted(set(m.close_reasons) - set(known))
    for reason in names:
        n = m.close_reasons.get(reason, 0)
        share = f"{100 * n / total:.0f}%" if total else "-"
        table.add_row(reason, str(n), share, style=None if n else "dim")
    return table


def _recent(m: ModelQueueStatus, limit: int) -> Table:
    table = _table("age", "size", "req", "reason", "instance", title="recent batches")
    table.columns[3].justify = "left"
    table.columns[4].justify = "left"
    for b in m.recent_batches[:limit]:
        table.add_row(
            format_age_us(b.age_us, zero="0 µs"),
            str(b.batch_size),
            str(b.requests),
            b.reason,
            b.instance,
        )
    return table


def render_model(m: ModelQueueStatus, recent_limit: int = RECENT_ROWS) -> RenderableType:
    """One model's block: settings line, queue and instance tables, then the histogram,
    close reasons and recent batches side by side."""
    from rich.console import Group
    from rich.text import Text

    if m.steps:
        # NOTE: an ensemble has no queue, no instances and forms no batches: its steps.
        return Group(_Folded(_settings(m), "bold magenta"), _steps(m), Text(""))
    top = _SideBySide(_queues(m), _instances(m))
    bottom: RenderableType
    if sum(m.batch_sizes.values()):
        bottom = _SideBySide(_histogram(m), _reasons(m), _recent(m, recent_limit))
    else:
        bottom = Text("no batches formed yet", style="dim")
    return Group(_Folded(_settings(m), "bold magenta"), top, Text(""), bottom, Text(""))


def render(
    models: Sequence[ModelQueueStatus],
    url: str,
    *,
    taken_at: str = "",
    footer: str = "",
    error: str = "",
    recent_limit: int = RECENT_ROWS,
    frontend_restarts: Mapping[int, int] | None = None,
) -> RenderableType:
    """The whole screen: a header line, every model's block, then ``footer``.

    Args:
        models: the snapshot to show (models in the order given).
        url: the server's address, shown in the header.
        taken_at: when the snapshot was taken (free text, e.g. ``14:02:31``).
        footer: a dim last line (e.g. how to quit ``--watch``).
        error: shown in red under the header, on one line cut to the width (``--watch``
            keeps the last snapshot on screen while the server cannot be reached).
        recent_limit: recent batches shown per model.
        frontend_restarts: per frontend id, the supervisor's restarts of it (the header
            shows ``restarts_text``; ``None``: the server did not say, nothing shown).
    """
    from rich.console import Group
    from rich.text import Text

    header = Text.assemble(("triton-mp stat", "bold"), f"  {url}")
    if taken_at:
        header.append(f"  {taken_at}")
    if frontend_restarts is not None:
        style = "bold yellow" if any(frontend_restarts.values()) else ""
        header.append(f"  {restarts_text(frontend_restarts)}", style=style)
    parts: list[RenderableType] = [header]
    if error:
        # NOTE: one line, cut to the width: --watch redraws in place, so the screen's
        # layout must not move while the server cannot be reached.
        parts.append(Text(error, style="bold red", no_wrap=True, overflow="ellipsis"))
    parts.append(Text(""))
    if not models:
        parts.append(Text("no models", style="dim"))
    parts.extend(render_model(m, recent_limit) for m in models)
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)


# ------------------------------------------------------------------------------ command
def _default_fetch(url: str, model: str) -> Snapshot:
    from triton_mp.cli.admin_client import fetch_queue_snapshot

    return fetch_queue_snapshot(url, model)


def _now() -> str:
    return datetime.now().strftime("%H:%M:%S")


def run_stat(
    url: str,
    model: str = "",
    *,
    as_json: bool = False,
    watch: bool = False,
    interval_s: float = 1.0,
    fetch: Fetch | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int:
    """``triton-mp stat``: print one snapshot (table or JSON), or refresh one until Ctrl-C.

    Args:
        url: the server's gRPC address (``host:port``).
        model: one model, or empty for every model.
        as_json: print one JSON snapshot (``snapshot_json``) instead of a table.
        watch: redraw the table every ``interval_s`` seconds until Ctrl-C (SIGINT).
        interval_s: seconds between refreshes of ``--watch``.
        fetch: where snapshots come from (default: the server's Admin/QueueStatus RPC).
        out: where the table or JSON goes (default: stdout).
        err: where the one-line error goes (default: stderr).

    Returns:
        0, or 1 when the first snapshot cannot be had (server unreachable, unknown model,
        no answer in time); later failures under ``--watch`` are shown on screen while it
        keeps retrying.
    """
    fetch = fetch or _default_fetch
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        models, restarts = fetch(url, model)
    except TritonMPError as e:
        print(f"triton-mp stat: {e.message}", file=err)
        return 1
    except KeyboardInterrupt:
        return 130
    try:
        if as_json:
            print(json.dumps(snapshot_json(models, url, restarts), indent=2), file=out)
            out.flush()
            return 0
        from rich.console import Console

        # NOTE: not a terminal (a file, a pipe): wide enough that no line wraps.
        console = Console(file=out, width=None if out.isatty() else NON_TTY_WIDTH)
        if not watch:
            console.print(render(models, url, taken_at=_now(), frontend_restarts=restarts))
            out.flush()
            return 0
        return _watch(url, model, (models, restarts), fetch, console, interval_s)
    except BrokenPipeError:
        # NOTE: the reader went away (`| head`); Python would report it again at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _watch(
    url: str,
    model: str,
    snapshot: Snapshot,
    fetch: Fetch,
    console: Console,
    interval_s: float,
) -> int:
    from rich.live import Live

    models, restarts = snapshot
    footer = f"every {interval_s:g} s · Ctrl-C to quit"
    error = ""
    taken_at = _now()

    def screen() -> RenderableType:
        return render(
            models,
            url,
            taken_at=taken_at,
            footer=footer,
            error=error,
            frontend_restarts=restarts,
        )

    # NOTE: SIGTERM (timeout, a supervisor) ends the watch like Ctrl-C: the last frame stays.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    # NOTE: auto_refresh off: the screen changes only when a snapshot arrives, so the
    # refresh thread would redraw the same frame for nothing.
    with Live(screen(), console=console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval_s)
                try:
                    models, restarts = fetch(url, model)
                    error = ""
                except TritonMPError as e:
                    error = f"{e.message} (showing the snapshot of {taken_at}; retrying)"
                else:
                    taken_at = _now()
                live.update(screen(), refresh=True)
        except KeyboardInterrupt:
            pass
    return 0
