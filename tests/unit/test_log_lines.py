"""``ConsoleLines`` (common/process/log_lines.py) writes the line structlog's console chain
writes (``log._structlog_formatter``), byte for byte but the timestamp, for generated
records; it hands exceptions, stacks and colliding ``extra`` keys to that chain; and a
process that logs plain lines never imports structlog or rich."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp.common.process.log import _formatter, _structlog_formatter
from triton_mp.common.process.log_lines import ConsoleLines

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z ")

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_values = st.one_of(
    _text,
    st.sampled_from(["plain", "two words", "a=b", "it's", 'say "x"', "tab\there", "line\nbreak"]),
    st.integers(),
    st.floats(allow_nan=False),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.tuples(_text, st.integers()),
)
_keys = st.one_of(
    st.sampled_from(["model", "instance", "role", "pid", "count", "url", "a", "zz", "message"]),
    st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True),
)
_levels = st.sampled_from(
    [logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL, 5, 25]
)


def _record(
    name: str, level: int, msg: str, args: tuple[object, ...], extra: dict[str, object]
) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def _without_stamp(line: str) -> str:
    assert STAMP.match(line), line
    return STAMP.sub("", line, count=1)


def _pair(role: str, instance: str, model: str) -> tuple[logging.Formatter, logging.Formatter]:
    ours = _formatter("console", role, instance, model)
    assert isinstance(ours, ConsoleLines)
    pid = ours._fields["pid"]
    assert isinstance(pid, int)
    return ours, _structlog_formatter("console", role, instance, model, pid)


_FORMATS = ("model '%s' loaded: %d versions", "%r and %s")
"""The %-formats given args; any other message has its "%" escaped (a drawn text such as
"%%r" or "%s%" is not a format of two args)."""


@settings(max_examples=200, deadline=None)  # NOTE: the first example imports structlog
@given(
    role=st.sampled_from(["supervisor", "worker", "frontend", "scheduler"]),
    instance=st.sampled_from(["", "0", "add_sub_0_0"]),
    model=st.sampled_from(["", "add_sub", "my model"]),
    name=st.sampled_from(["triton_mp.workers.main", "root", "grpc", "a b"]),
    level=_levels,
    msg=st.one_of(_text, st.sampled_from(_FORMATS)),
    extra=st.dictionaries(_keys, _values, max_size=5),
)
def test_a_plain_record_is_structlogs_line(
    role: str,
    instance: str,
    model: str,
    name: str,
    level: int,
    msg: str,
    extra: dict[str, object],
) -> None:
    args: tuple[object, ...] = ()
    if msg in _FORMATS:
        args = ("x y", 3) if "%d" in msg else ("x y", [1])
    elif "%" in msg:
        msg = msg.replace("%", "%%")
    ours, theirs = _pair(role, instance, model)
    record = _record(name, level, msg, args, extra)
    mine = _without_stamp(ours.format(record))
    assert mine == _without_stamp(theirs.format(record))
    assert isinstance(ours, ConsoleLines)
    assert ours._fallback is None  # written without structlog


def test_exceptions_stacks_and_colliding_extras_go_to_structlog() -> None:
    ours, theirs = _pair("worker", "add_sub_0_0", "add_sub")
    try:
        raise ValueError("boom")
    except ValueError:
        failed = _record("t", logging.ERROR, "it failed", (), {})
        failed.exc_info = sys.exc_info()
    stacked = _record("t", logging.INFO, "where", (), {})
    stacked.stack_info = "Stack (most recent call last):\n  here"
    for record in (failed, stacked):
        assert _without_stamp(ours.format(record)) == _without_stamp(theirs.format(record))
    colliding = _record("t", logging.INFO, "odd", (), {"timestamp": "then", "level": "x"})
    assert ours.format(colliding) == theirs.format(colliding)
    assert ours.format(colliding).startswith("then [x        ] odd")
    assert "ValueError" in ours.format(failed)
    assert "boom" in ours.format(failed)
    assert isinstance(ours, ConsoleLines)
    assert ours._fallback is not None


def test_a_process_that_logs_plain_lines_imports_neither_structlog_nor_rich() -> None:
    code = (
        "import logging, sys\n"
        "from triton_mp.common.process.log import configure_logging\n"
        "configure_logging('worker', 'm_0_0', model='m')\n"
        "logging.getLogger('x').info('loaded %s', 'm', extra={'n': 1})\n"
        "print(sorted(m for m in ('structlog', 'rich') if m in sys.modules))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    assert done.stdout.strip() == "[]"
    line = done.stderr.strip()
    assert re.fullmatch(
        r"\[info     \] loaded m {23}\[x\] instance=m_0_0 model=m n=1 pid=\d+ role=worker",
        _without_stamp(line),
    ), line
