"""``triton-mp stat`` rendering, JSON and command flow, from hand-made queue snapshots.

No server: ``run_stat`` takes a ``fetch`` function, and the tables render into a rich
console writing to a string.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable

import msgspec
import pytest
from rich.console import Console

from tests.unit.fake_queues import busy_cls, idle_add_sub, instance
from triton_mp.cli import stat
from triton_mp.cli.admin_client import AdminError
from triton_mp.cli.main import build_parser
from triton_mp.cli.stat import (
    RECENT_ROWS,
    format_age_us,
    histogram_rows,
    render,
    run_stat,
    snapshot_json,
)
from triton_mp.common.close_reason import CloseReason
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.reports import ModelQueueStatus

URL = "localhost:8001"
MODELS = (busy_cls(), idle_add_sub())


def _text(models: tuple[ModelQueueStatus, ...], width: int, **kw: str) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(render(models, URL, **kw))
    out = console.file.getvalue()
    assert isinstance(out, str)
    return out


def _fetch_returning(
    models: tuple[ModelQueueStatus, ...], restarts: dict[int, int] | None = None
) -> Callable[[str, str], stat.Snapshot]:
    def fetch(url: str, model: str) -> stat.Snapshot:
        assert url == URL
        return tuple(m for m in models if not model or m.model == model), dict(restarts or {})

    return fetch


# ----------------------------------------------------------------------------------- JSON
def test_json_snapshot_has_stable_keys() -> None:
    snap = snapshot_json(MODELS, URL)
    assert list(snap) == ["url", "frontend_restarts", "models"]
    assert snap["frontend_restarts"] == {}
    cls, add_sub = snap["models"]  # type: ignore[misc]
    assert list(cls) == [
        "model",
        "version",
        "scheduler",
        "max_batch_size",
        "preferred_batch_sizes",
        "max_queue_delay_us",
        "levels",
        "instances",
        "batch_sizes",
        "close_reasons",
        "recent_batches",
        "steps",
    ]
    assert list(cls["levels"][0]) == [
        "level",
        "depth",
        "delayed",
        "oldest_age_us",
        "rejected",
        "timed_out",
        "delayed_total",
    ]
    assert list(cls["instances"][0]) == [
        "instance_id",
        "name",
        "live",
        "batches_in_flight",
        "requests_in_flight",
        "batch_size_in_flight",
        "executions",
        "restarts",
        "waiting_requests",
    ]
    assert list(cls["recent_batches"][0]) == [
        "age_us",
        "batch_size",
        "requests",
        "reason",
        "instance",
    ]
    # NOTE: JSON object keys are strings; sizes ascend numerically, not lexically.
    assert cls["batch_sizes"] == {"1": 5, "3": 2, "8": 60, "16": 40}
    assert list(cls["batch_sizes"]) == ["1", "3", "8", "16"]
    assert cls["close_reasons"] == {
        "max": 0,
        "preferred": 100,
        "delay": 0,
        "idle": 7,
        "shape": 0,
        "single": 0,
    }
    assert list(add_sub["close_reasons"]) == [r.value for r in CloseReason]
    assert add_sub["batch_sizes"] == {}
    assert len(cls["recent_batches"]) == 12  # every batch the scheduler sent


def test_json_snapshot_keeps_a_close_reason_it_does_not_know() -> None:
    model = msgspec.structs.replace(idle_add_sub(), close_reasons={"drain": 2})
    reasons = snapshot_json((model,), URL)["models"][0]["close_reasons"]  # type: ignore[index]
    assert reasons == dict.fromkeys([r.value for r in CloseReason], 0) | {"drain": 2}


def test_run_stat_json_prints_one_snapshot() -> None:
    out, err = io.StringIO(), io.StringIO()
    rc = run_stat(URL, as_json=True, fetch=_fetch_returning(MODELS), out=out, err=err)
    assert rc == 0
    assert err.getvalue() == ""
    assert json.loads(out.getvalue()) == snapshot_json(MODELS, URL)


def test_run_stat_shows_frontend_restarts_in_header_and_json() -> None:
    """The admin reply's ``frontend_restarts`` (per frontend id) reach the table's header and
    ``--json``; a server whose frontends never restarted says 0."""
    fetch = _fetch_returning(MODELS, {0: 0, 1: 2, 2: 1})
    out = io.StringIO()
    assert run_stat(URL, as_json=True, fetch=fetch, out=out) == 0
    assert json.loads(out.getvalue())["frontend_restarts"] == {"0": 0, "1": 2, "2": 1}
    out = io.StringIO()
    assert run_stat(URL, fetch=fetch, out=out) == 0
    header = out.getvalue().splitlines()[0]
    assert header.startswith(f"triton-mp stat  {URL}")
    assert header.rstrip().endswith("frontend restarts 3 (#1: 2, #2: 1)")
    out = io.StringIO()
    assert run_stat(URL, fetch=_fetch_returning(MODELS, {0: 0, 1: 0}), out=out) == 0
    assert out.getvalue().splitlines()[0].rstrip().endswith("frontend restarts 0")


def test_run_stat_json_for_one_model() -> None:
    out = io.StringIO()
    assert run_stat(URL, "add_sub", as_json=True, fetch=_fetch_returning(MODELS), out=out) == 0
    assert [m["model"] for m in json.loads(out.getvalue())["models"]] == ["add_sub"]


# ----------------------------------------------------------------------------- formatting
@pytest.mark.parametrize(
    ("age_us", "text"),
    [
        (0, "-"),
        (1, "1 µs"),
        (999, "999 µs"),
        (1_000, "1.0 ms"),
        (12_345, "12.3 ms"),
        (250_000, "250 ms"),
        (1_250_000, "1.25 s"),
        (75_000_000, "75.0 s"),
    ],
)
def test_format_age(age_us: int, text: str) -> None:
    assert format_age_us(age_us) == text


def test_histogram_rows_one_per_size_when_few() -> None:
    assert histogram_rows({16: 40, 1: 5, 8: 60, 3: 0}) == [("1", 5), ("8", 60), ("16", 40)]


def test_histogram_rows_grouped_by_powers_of_two_when_many() -> None:
    sizes = {s: 1 for s in range(1, 33)}
    rows = histogram_rows(sizes, max_rows=10)
    assert rows == [("1", 1), ("2", 1), ("3-4", 2), ("5-8", 4), ("9-16", 8), ("17-32", 16)]
    assert sum(n for _, n in rows) == 32


# ------------------------------------------------------------------------------- the table
def test_table_shows_queues_instances_histogram_reasons_and_recent_batches() -> None:
    text = _text(MODELS, 100, taken_at="14:02:31")
    lines = text.splitlines()
    assert lines[0].split() == ["triton-mp", "stat", URL, "14:02:31"]
    assert (
        "ocr_cls v1 · dynamic batcher · max batch 32 · preferred 8, 16 · max delay 100 µs" in text
    )
    assert "add_sub v1 · default scheduler · max batch 8" in text

    def row(first: str) -> list[str]:
        return next(line.split() for line in lines if line.split()[:1] == [first])

    # level 2: depth, delayed, oldest, rejected, timed out; then its instance beside it
    assert row("2")[:7] == ["2", "40", "3", "1.25", "s", "7", "2"]
    assert row("1")[:6] == ["1", "12", "0", "3.2", "ms", "0"]
    busy = next(line for line in lines if "ocr_cls_0_0" in line and "req" in line)
    assert "ocr_cls_0_0   yes  8 (5 req)      121" in busy  # 120 run, 1 running
    dead = next(line for line in lines if "ocr_cls_0_1" in line)
    assert dead.split()[-3:] == ["no", "-", "99"]
    # histogram rows (size, count, bar), close reasons with shares
    assert "107 batches, mean 10.6" in text
    assert "preferred    100    93%" in text
    assert "idle           7     7%" in text
    for reason in CloseReason:
        assert any(line.split()[:1] == [reason] or f"  {reason}  " in line for line in lines)
    recent = [line for line in lines if line.rstrip().endswith("ocr_cls_0_0") and "µs" in line]
    recent += [line for line in lines if line.rstrip().endswith("ocr_cls_0_0") and " ms " in line]
    assert len(recent) == RECENT_ROWS
    assert "no batches formed yet" in text  # add_sub


def test_table_fits_80_columns_by_stacking_tables() -> None:
    text = _text(MODELS, 80)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    assert "…" not in text  # nothing squeezed or cut
    assert "8 (5 req)" in text
    assert "1.25 s" in text


def test_an_instance_counts_the_batch_it_runs_as_the_caption_does() -> None:
    """The batch-size caption counts every batch formed; an instance's ``batches`` column
    was its executions alone, one below while a batch runs."""
    running = msgspec.structs.replace(
        idle_add_sub(),
        instances=(
            instance("add_sub_0_0", 0, executions=4, batches_in_flight=1, requests_in_flight=2,
                     batch_size_in_flight=2),
        ),
        batch_sizes={1: 3, 2: 2},
        close_reasons={"idle": 5},
    )  # fmt: skip
    lines = _text((running,), 100).splitlines()
    row = next(line.split() for line in lines if "add_sub_0_0" in line)
    assert row[-6:] == ["add_sub_0_0", "yes", "2", "(2", "req)", "5"]
    assert any(line.startswith("5 batches, mean 1.4") for line in lines)


def _crowded() -> ModelQueueStatus:
    """A long name, many preferred sizes and a long delay: a settings line past 80."""
    return msgspec.structs.replace(
        busy_cls(),
        model="ocr_rec_bls_postprocess",
        preferred_batch_sizes=(1, 2, 4, 8, 16, 32),
        max_queue_delay_us=12_500,
    )


def test_the_watch_screen_fits_80_columns_without_wrapping() -> None:
    """At 80 columns a --watch screen wrapped its settings line mid-part and a long error
    over several lines (moving the whole screen down while the server was away)."""
    error = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:8001: "
    error += "Connection refused (showing the snapshot of 14:02:31; retrying)"
    text = _text((_crowded(), idle_add_sub()), 80, footer="every 1 s · Ctrl-C to quit",
                 error=error)  # fmt: skip
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert lines[1].startswith("failed to connect")
    assert lines[1].rstrip().endswith("…")
    assert lines[2] == ""
    first = lines.index(next(line for line in lines if line.startswith("ocr_rec_bls")))
    settings = [lines[first].rstrip(), lines[first + 1].rstrip()]
    assert settings == [
        "ocr_rec_bls_postprocess v1 · dynamic batcher · max batch 32",
        "  preferred 1, 2, 4, 8, 16, 32 · max delay 12.5 ms",
    ]
    assert lines[first + 2].startswith("queue")


def test_oldest_age_of_a_request_that_just_arrived_is_not_a_dash() -> None:
    fresh = msgspec.structs.replace(
        idle_add_sub(), levels=(msgspec.structs.replace(idle_add_sub().levels[0], depth=1),)
    )
    row = next(line.split() for line in _text((fresh,), 100).splitlines() if line[:1] == "-")
    assert row[:5] == ["-", "1", "0", "0", "µs"]


def test_table_shows_error_and_empty_server() -> None:
    text = _text((), 100, error="cannot reach a server at x")
    assert "cannot reach a server at x" in text
    assert "no models" in text


# ---------------------------------------------------------------------------- the command
def test_run_stat_prints_a_table_snapshot() -> None:
    out = io.StringIO()
    assert run_stat(URL, fetch=_fetch_returning(MODELS), out=out) == 0
    assert "ocr_cls v1" in out.getvalue()
    assert "recent batches" in out.getvalue()


@pytest.mark.parametrize("as_json", [False, True])
def test_run_stat_failure_is_one_line_and_status_1(as_json: bool) -> None:
    def fetch(url: str, model: str) -> stat.Snapshot:
        raise AdminError(
            f"cannot reach a server at {url}: connection refused", ErrorCode.UNAVAILABLE
        )

    out, err = io.StringIO(), io.StringIO()
    assert run_stat(URL, as_json=as_json, fetch=fetch, out=out, err=err) == 1
    assert out.getvalue() == ""
    assert err.getvalue() == f"triton-mp stat: cannot reach a server at {URL}: connection refused\n"


def test_watch_redraws_keeps_last_snapshot_on_error_and_ends_on_ctrl_c() -> None:
    calls: list[int] = []
    later = msgspec.structs.replace(busy_cls(), batch_sizes={8: 999})

    def fetch(url: str, model: str) -> stat.Snapshot:
        calls.append(1)
        if len(calls) == 1:
            return MODELS, {0: 0}
        if len(calls) == 2:
            raise AdminError("cannot reach a server at x: gone", ErrorCode.UNAVAILABLE)
        if len(calls) == 3:
            return (later,), {0: 1}
        raise KeyboardInterrupt  # what Ctrl-C raises in the sleeping main thread

    out = io.StringIO()
    assert run_stat(URL, watch=True, interval_s=0.001, fetch=fetch, out=out) == 0
    assert len(calls) == 4
    text = out.getvalue()
    assert "Ctrl-C to quit" in text
    assert "999 batches" in text  # the last snapshot is on screen when it stops
    assert "frontend restarts 1 (#0: 1)" in text  # and its restart count


def test_watch_on_a_terminal_shows_the_error_while_retrying() -> None:
    calls: list[int] = []

    def fetch(url: str, model: str) -> stat.Snapshot:
        calls.append(1)
        if len(calls) == 1:
            return MODELS, {}
        if len(calls) == 2:
            raise AdminError("cannot reach a server at x: gone", ErrorCode.UNAVAILABLE)
        raise KeyboardInterrupt

    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True, color_system=None)
    assert stat._watch(URL, "", fetch(URL, ""), fetch, console, 0.001) == 0
    assert "cannot reach a server at x: gone" in out.getvalue()
    assert "retrying" in out.getvalue()


# -------------------------------------------------------------------------------- the CLI
def test_cli_stat_defaults() -> None:
    args = build_parser().parse_args(["stat"])
    assert (args.url, args.model, args.json, args.watch, args.interval) == (
        "localhost:8001",
        "",
        False,
        False,
        1.0,
    )


def test_cli_stat_flags() -> None:
    args = build_parser().parse_args(
        ["stat", "--url", "h:1", "--model", "m", "--watch", "--interval", "0.5"]
    )
    assert (args.url, args.model, args.watch, args.interval) == ("h:1", "m", True, 0.5)


@pytest.mark.parametrize(
    "argv",
    [["stat", "--json", "--watch"], ["stat", "--interval", "0"], ["stat", "--interval", "x"]],
)
def test_cli_stat_rejects(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2


def test_a_reader_that_went_away_is_not_an_error() -> None:
    """``triton-mp stat --json | head -1``: the closed pipe ends the output quietly. (The
    table goes through rich, which handles a closed pipe itself.)"""
    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "w") as out:
        err = io.StringIO()
        rc = run_stat(URL, as_json=True, fetch=_fetch_returning(MODELS), out=out, err=err)
        assert rc == 0
        assert err.getvalue() == ""


def test_a_table_into_a_file_does_not_wrap_at_80_columns() -> None:
    r, w = os.pipe()
    with os.fdopen(w, "w") as out:
        assert run_stat(URL, fetch=_fetch_returning(MODELS), out=out) == 0
    with os.fdopen(r) as got:
        text = got.read()
    header = next(line for line in text.splitlines() if "max delay" in line)
    assert header.rstrip().endswith("µs")
