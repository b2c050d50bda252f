"""Per-process logging set-up: stdlib ``logging`` rendered by structlog (plain console
lines by ``log_lines``, the same bytes without importing it).

Imported by every role's ``main`` and by the CLI. Modules log with
``logging.getLogger(__name__)`` and %-style arguments; ``configure_logging`` adds the
process's role, model, instance and pid to every line, so messages never repeat them, and
renders lines as console text or JSON (``--log-format``). A process that speaks for many
models (supervisor, scheduler) names the one a line is about with
``extra={"model": ..., "instance": ...}``; those keys become fields of the line.

State changes log at INFO, one line each (model loading / ready / failed, instance
started / ready / died / restarted / given up, draining, stopped); ``--log-verbose 1`` adds
per-request and per-batch detail at DEBUG.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, MutableMapping
from typing import Any

import msgspec

from triton_mp.common.process.log_lines import ConsoleLines

LONG_EXCEPTION_CHARS = 2000
"""An exception whose message is longer than this is logged as plain text with each line
cut to this many characters (rich's traceback layout is quadratic in a long unbroken
message: 20 KB took 2.5 s, 100 KB would hold the process for a minute)."""


def cap_long_exception(
    _: Any, __: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: replace ``exc_info`` whose exception message is over
    ``LONG_EXCEPTION_CHARS`` by an ``exception`` text of the plain traceback, lines cut."""
    exc_info = event.get("exc_info")
    if exc_info is True:
        exc_info = sys.exc_info()
    exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if not isinstance(exc, BaseException) or len(str(exc)) <= LONG_EXCEPTION_CHARS:
        return event
    lines = "".join(traceback.format_exception(exc)).splitlines()
    event.pop("exc_info", None)
    event["exception"] = "\n".join(_cut(line) for line in lines)
    return event


def _cut(line: str) -> str:
    if len(line) <= LONG_EXCEPTION_CHARS:
        return line
    return f"{line[:LONG_EXCEPTION_CHARS]}... [{len(line) - LONG_EXCEPTION_CHARS} more characters]"


def _verbosity_level(verbose: int) -> int:
    return logging.DEBUG if verbose > 0 else logging.INFO


class LogSettings(msgspec.Struct, frozen=True):
    """This process's log settings, as Triton's log settings API names them
    (``GET /v2/logging``, gRPC ``LogSettings``)."""

    info: bool = True
    warning: bool = True
    error: bool = True
    verbose: int = 0
    """``log_verbose_level``; > 0 logs DEBUG records."""
    format: str = "default"
    """``default`` / ``ISO8601`` (console text) or ``json``."""
    file: str = ""
    """``log_file``: the file every process logs to (``--log-file``), or "" for stderr."""


_current = LogSettings()
_process: dict[str, str] = {}
"""role, instance, model of this process (``configure_logging``), for a format change."""


class _LevelSwitch(logging.Filter):
    """Drops INFO, WARNING or ERROR/CRITICAL records while ``log_info`` / ``log_warning`` /
    ``log_error`` is off (DEBUG records follow the verbose level, on the root logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        s = _current
        if record.levelno >= logging.ERROR:
            return s.error
        if record.levelno >= logging.WARNING:
            return s.warning
        if record.levelno >= logging.INFO:
            return s.info
        return True


_debug_watchers: list[Callable[[bool], object]] = []
"""``watch_debug``'s callbacks, told when DEBUG (``--log-verbose`` > 0) turns on or off."""


def watch_debug(callback: Callable[[bool], object]) -> Callable[[], None]:
    """Call ``callback(on)`` now, with whether this process logs DEBUG (``--log-verbose`` >
    0), and again whenever that changes (``apply_log_settings``, ``configure_logging``): what
    logs per request outside Python (the native gRPC thread's accepted calls,
    ``frontend.native.handoff``) follows the level. Returns what stops the watching."""
    _debug_watchers.append(callback)
    callback(logging.getLogger().isEnabledFor(logging.DEBUG))

    def unwatch() -> None:
        with contextlib.suppress(ValueError):
            _debug_watchers.remove(callback)

    return unwatch


def _set_root_level(verbose: int) -> None:
    """The root logger's level for ``verbose``; the watchers told when DEBUG turned."""
    root = logging.getLogger()
    was = root.isEnabledFor(logging.DEBUG)
    root.setLevel(_verbosity_level(verbose))
    now = root.isEnabledFor(logging.DEBUG)
    if now != was:
        for callback in list(_debug_watchers):
            callback(now)


def current_log_settings() -> LogSettings:
    """The settings this process logs by now."""
    return _current


def apply_log_settings(settings: LogSettings) -> None:
    """Log by ``settings`` from now on: the root level follows the verbose level, the level
    switch drops the levels turned off, and a change between console text and JSON swaps the
    renderer (after ``configure_logging``)."""
    global _current
    old = _current
    _current = settings
    root = logging.getLogger()
    _set_root_level(settings.verbose)
    if (old.format == "json") != (settings.format == "json") and _process:
        for handler in root.handlers:
            handler.setFormatter(_formatter(settings.format, **_process))


def configure_logging(
    role: str,
    instance: str,
    verbose: int = 0,
    fmt: str = "console",
    model: str = "",
    levels: tuple[bool, bool, bool] = (True, True, True),
    file: str = "",
) -> None:
    """Route this process's log records to stderr with role/model/instance/pid fields.

    Args:
        role: ``supervisor``, ``frontend``, ``scheduler`` or ``worker``.
        instance: model instance name for workers, frontend index for frontends, else "".
        verbose: ``--log-verbose``; > 0 enables DEBUG (per-request detail).
        fmt: ``console`` or ``json`` (``--log-format``).
        model: the model a worker serves, else "".
        levels: ``--log-info``, ``--log-warning``, ``--log-error``: those lines on.
        file: ``--log-file`` in force (``log_to_file`` pointed stderr at it), or "".
    """
    global _current
    _process.update(role=role, instance=instance, model=model)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(fmt, role, instance, model))
    handler.addFilter(_LevelSwitch())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    info, warning, error = levels
    _current = msgspec.structs.replace(
        _current,
        verbose=verbose,
        format=fmt if fmt in ("json", "ISO8601") else "default",
        info=info,
        warning=warning,
        error=error,
        file=file,
    )
    _set_root_level(verbose)
    # NOTE: grpc's and onnxruntime's own loggers are chatty at DEBUG.
    logging.getLogger("grpc").setLevel(logging.WARNING)


def log_to_file(path: str) -> str:
    """Send this process's stderr, and so every child's log (they inherit it), to the end of
    ``path``: Triton's ``--log-file`` (common ``Logger::SetLogFile``: appended to, created if
    missing). Call before ``configure_logging`` and before any child starts.

    Returns:
        "" when the log now goes to ``path``; otherwise why not (``strerror``), and stderr is
        left as it was (Triton then logs to the console and answers ``log_file`` "").
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        return e.strerror or str(e)
    try:
        sys.stderr.flush()
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    return ""


def _formatter(fmt: str, role: str, instance: str, model: str) -> logging.Formatter:
    """The formatter of ``configure_logging``: console text or JSON, with the process's
    fields. Console lines without an exception are written by ``ConsoleLines`` (the same
    bytes), so a process imports structlog only to log JSON or an exception."""
    pid = os.getpid()
    if fmt == "json":
        return _structlog_formatter(fmt, role, instance, model, pid)
    fields: dict[str, object] = {"role": role}
    if model:
        fields["model"] = model
    if instance:
        fields["instance"] = instance
    fields["pid"] = pid
    return ConsoleLines(fields, lambda: _structlog_formatter(fmt, role, instance, model, pid))


def _structlog_formatter(
    fmt: str, role: str, instance: str, model: str, pid: int
) -> logging.Formatter:
    """structlog's formatter of ``_formatter``'s lines (all of them for JSON; for console
    text, those ``ConsoleLines`` leaves to it)."""
    import structlog  # NOTE: ~100 ms of CPU with rich and asyncio; most processes never need it

    def add_process(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event.setdefault("role", role)
        if model:
            event.setdefault("model", model)
        if instance:
            event.setdefault("instance", instance)
        event.setdefault("pid", pid)
        return event

    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(
            colors=False,
            # NOTE: no local variables in tracebacks: they hold client tensors and
            # turn one failure into hundreds of log lines.
            exception_formatter=structlog.dev.RichTracebackFormatter(
                color_system=None, show_locals=False
            ),
        )
    )
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.stdlib.ExtraAdder(),
            add_process,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            cap_long_exception,
            renderer,
        ],
    )
