"""Console log lines without structlog, for the records that carry no exception.

``common.process.log`` renders console lines with structlog's ``ConsoleRenderer(colors=False)``
behind a ``ProcessorFormatter``. Importing structlog (which imports rich and asyncio) cost
about 100 ms of CPU in every process of the server: the supervisor, the scheduler, each
frontend and each worker, on the serial path of every start. ``ConsoleLines`` writes the same
line, byte for byte, for a record without ``exc_info`` or ``stack_info`` whose ``extra`` keys
do not collide with the line's own (``timestamp``, ``level``, ``event``, ``logger``...), and
hands every other record to the structlog formatter, built on first use
(tests/unit/test_log_lines.py compares the two on generated records).

A line: ``<UTC ISO timestamp>Z [<level padded to 9>] <message padded to 30> [<logger>]``,
then ``key=value`` for the process's fields and the record's ``extra``, sorted by key; a
string value with a space, tab, ``=``, quote or line break, and every other value, as its
``repr``.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any

LEVEL_WIDTH = 9
"""structlog pads the level to its longest level name (``exception``)."""

EVENT_WIDTH = 30
"""``ConsoleRenderer``'s ``pad_event_to``."""

_RECORD_KEYS = frozenset(logging.LogRecord("name", 0, "pathname", 0, "msg", (), None).__dict__)
"""A bare record's attributes: every other one is ``extra`` (structlog's ``ExtraAdder``)."""

_LINE_KEYS = frozenset(
    (
        "timestamp",
        "level",
        "event",
        "logger",
        "logger_name",
        "stack",
        "exception",
        "exc_info",
        "stack_info",
        "_record",
        "_from_structlog",
    )
)
"""Keys the structlog chain gives a meaning of its own: an ``extra`` of one of these names
goes to the structlog formatter."""

_QUOTED = frozenset(" \t=\r\n\"'")


def _value(v: object) -> str:
    """``ConsoleRenderer``'s value: a plain string as it is, anything else as its repr."""
    if isinstance(v, str) and not _QUOTED.intersection(v):
        return v
    return repr(v)


def _level(record: logging.LogRecord) -> str:
    """structlog's level name of a stdlib record (``add_log_level``)."""
    name = record.levelname.lower()
    return {"warn": "warning", "exception": "error"}.get(name, name)


class ConsoleLines(logging.Formatter):
    """The console formatter of ``configure_logging``: the process's ``fields`` (role, pid,
    and model / instance where set) on every line, then the record's ``extra`` (which wins).

    Args:
        fields: the process's own key/value pairs.
        fallback: builds the structlog formatter of the same line, for the records this one
            does not write (called once, on the first such record).
    """

    def __init__(
        self, fields: dict[str, object], fallback: Callable[[], logging.Formatter]
    ) -> None:
        super().__init__()
        self._fields = fields
        self._make_fallback = fallback
        self._fallback: logging.Formatter | None = None

    def format(self, record: logging.LogRecord) -> str:
        extra = {k: v for k, v in record.__dict__.items() if k not in _RECORD_KEYS}
        if record.exc_info or record.stack_info or not _LINE_KEYS.isdisjoint(extra):
            if self._fallback is None:
                self._fallback = self._make_fallback()
            return self._fallback.format(record)
        return self.line(record, extra)

    def line(self, record: logging.LogRecord, extra: dict[str, Any]) -> str:
        """The line of ``record`` (no exception, no stack, ``extra`` already picked out)."""
        now = datetime.datetime.now(tz=datetime.UTC).isoformat().replace("+00:00", "Z")
        event = record.getMessage()
        head = (
            f"{now} [{_level(record).ljust(LEVEL_WIDTH)}] "
            f"{event.ljust(EVENT_WIDTH)} [{record.name}]"
        )
        fields = {**self._fields, **extra}
        tail = " ".join(f"{k}={_value(fields[k])}" for k in sorted(fields))
        return f"{head} {tail}".rstrip(" ")
