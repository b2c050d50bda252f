"""The request-tracing flags: ``--trace-config`` and the deprecated ``--trace-*`` flags.

Imported by the CLI (which parses the flags), the supervisor (which hands the result to the
frontends in their spec) and the frontends (which sample and record traces). Pure: no I/O.
The rules and the error texts are those of tritonserver's ``command_line_parser.cc``
(``ParseTraceConfigOption``, ``SetGlobalTraceArgs``, ``SetTritonTraceArgs``,
``ProcessOpenTelemetryBatchSpanProcessorArgs``): ``--trace-config [<mode>,]<setting>=<value>``
with the global settings ``rate``, ``level``, ``count`` and ``mode``, the ``triton`` settings
``file`` and ``log-frequency`` and the ``opentelemetry`` settings ``url``, ``resource`` and
the batch span processor's ``bsp_*``; a ``--trace-config`` value wins over its deprecated
flag (with Triton's warning).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import IntFlag
from typing import Literal

import msgspec

from triton_mp.common.errors import TritonMPError


class TraceLevel(IntFlag):
    """``TRITONSERVER_InferenceTraceLevel`` (tritonserver.h): what a trace records."""

    DISABLED = 0
    TIMESTAMPS = 0x4
    """Timestamps of each request's events."""
    TENSORS = 0x8
    """The input and output tensors (``TENSOR_QUEUE_INPUT``, ``TENSOR_BACKEND_*``)."""


OTEL_DEFAULT_URL = "http://localhost:4318/v1/traces"
"""Triton's default OTLP/HTTP endpoint (``opentelemetry,url``)."""
OTEL_SERVICE_NAME = "triton-inference-server"
"""The ``service.name`` resource attribute unless ``opentelemetry,resource`` sets one."""

UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1


class TraceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The trace settings the server starts with (Triton's global trace setting)."""

    level: int = 0
    """``TraceLevel`` bits; 0 = tracing off (``level=OFF``, the default)."""
    rate: int = 1000
    """``rate``: trace every ``rate``-th request (uint32; 0 = only requests that carry an
    OpenTelemetry context, in opentelemetry mode)."""
    count: int = -1
    """``count``: how many more traces to take; -1 = no limit."""
    log_frequency: int = 0
    """``triton,log-frequency``: 0 = write the trace file once, at shutdown; n = write
    ``<file>.<k>`` every n traces."""
    file: str = ""
    """``triton,file``: where the triton mode writes its JSON."""
    mode: Literal["triton", "opentelemetry"] = "triton"
    otel_url: str = OTEL_DEFAULT_URL
    """``opentelemetry,url``: the OTLP/HTTP endpoint the spans are posted to."""
    otel_resource: tuple[tuple[str, str], ...] = ()
    """``opentelemetry,resource=<key>=<value>`` pairs, in order (``service.name`` defaults
    to ``triton-inference-server``)."""
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512

    @property
    def enabled(self) -> bool:
        """Whether any request may be traced with these settings."""
        return self.level != 0


def _bad(option: str, why: str) -> TritonMPError:
    return TritonMPError(f'Bad option: "--trace-config {option}".\n{why}')


def parse_int(text: str, low: int, high: int) -> int:
    """Triton's ``ParseOption<int>``: a whole decimal number within ``[low, high]``.

    Raises:
        ValueError: with Triton's text (``Invalid option value. Got ...`` or ``Provided
            option value is out of bound. Got ...``).
    """
    body = text.strip()
    digits = body[1:] if body[:1] in "+-" else body
    if not digits.isdigit():
        raise ValueError(f"Invalid option value. Got {text}")
    value = int(body)
    if not low <= value <= high:
        raise ValueError(f"Provided option value is out of bound. Got {text}")
    return value


def parse_level(text: str) -> TraceLevel:
    """Triton's ``ParseTraceLevelOption`` (case-insensitive; ``MIN``/``MAX`` are TIMESTAMPS).

    Raises:
        ValueError: ``invalid value for trace level option: <text>``.
    """
    low = text.lower()
    if low in ("false", "off"):
        return TraceLevel.DISABLED
    if low in ("true", "on", "min", "max", "timestamps"):
        return TraceLevel.TIMESTAMPS
    if low == "tensors":
        return TraceLevel.TENSORS
    raise ValueError(f"invalid value for trace level option: {text}")


def parse_mode(text: str) -> Literal["triton", "opentelemetry"]:
    """Triton's ``ParseTraceModeOption``.

    Raises:
        ValueError: ``invalid value for trace mode option: ...``.
    """
    low = text.lower()
    if low == "triton":
        return "triton"
    if low == "opentelemetry":
        return "opentelemetry"
    raise ValueError(
        f"invalid value for trace mode option: {text}. "
        'Available options are "triton" and "opentelemetry"'
    )


def split_trace_config(arg: str) -> tuple[str, str, str]:
    """One ``--trace-config`` value -> ``(mode or "", setting, value)``.

    Raises:
        TritonMPError: Triton's format errors.
    """
    comma = arg.find(",")
    eq = arg.find("=", comma + 1)
    mode = ""
    if comma > 0:
        try:
            mode = parse_mode(arg[:comma])
        except ValueError as e:
            raise TritonMPError(f'Bad option: "--trace-config".\n{e}') from None
    elif comma == 0:
        raise TritonMPError(
            "No trace mode specified. --trace-config option format is "
            "<trace mode>,<setting>=<value> or <setting>=<value>. Got " + arg
        )
    fmt = "--trace-config option format is '<trace mode>,<setting>=<value>'. Got " + arg
    if eq < 0:
        raise TritonMPError(fmt)
    setting, value = arg[comma + 1 : eq], arg[eq + 1 :]
    if not setting or not value:
        raise TritonMPError(fmt)
    return mode, setting, value


class DeprecatedTraceFlags(msgspec.Struct, frozen=True, kw_only=True):
    """The deprecated flags as given (None: absent)."""

    file: str | None = None
    levels: tuple[str, ...] = ()
    rate: str | None = None
    count: str | None = None
    log_frequency: str | None = None


def _deprecated(flags: DeprecatedTraceFlags, warn: list[str]) -> dict[str, object]:
    """The deprecated flags' values and Triton's deprecation warnings."""
    out: dict[str, object] = {}
    names = {
        "file": ("--trace-file", "triton,file=<filepath>"),
        "rate": ("--trace-rate", "rate=<rate value>"),
        "count": ("--trace-count", "count=<count value>"),
        "log_frequency": ("--trace-log-frequency", "triton,log-frequency=<log frequency value>"),
    }
    if flags.levels:
        warn.append(
            "'--trace-level' has been deprecated and will be removed in future releases. "
            "Please use '--trace-config level=<OFF|TIMESTAMPS|TENSORS> instead."
        )
        try:
            out["levels"] = [parse_level(v) for v in flags.levels]
        except ValueError as e:
            raise TritonMPError(str(e)) from None
    for key, (flag, new) in names.items():
        value = getattr(flags, key)
        if value is None:
            continue
        warn.append(
            f"'{flag}' has been deprecated and will be removed in future releases. "
            f"Please use '--trace-config {new} instead."
        )
        if key == "file":
            out[key] = value
            continue
        low, high = (-1, INT32_MAX) if key == "count" else (-(2**31), INT32_MAX)
        try:
            out[key] = parse_int(value, low, high)
        except ValueError as e:
            raise TritonMPError(str(e)) from None
    return out


def _global_settings(
    items: Sequence[tuple[str, str]], old: Mapping[str, object], warn: list[str]
) -> dict[str, object]:
    """``--trace-config <setting>=<value>`` (rate, level, mode, count) over the deprecated
    flags; an unknown global setting is ignored, as Triton ignores it (with a warning)."""
    out: dict[str, object] = {}
    levels = list(old.get("levels", []))  # type: ignore[call-overload]
    for setting, value in items:
        try:
            if setting == "rate":
                if "rate" in old:
                    warn.append(
                        "Overriding deprecated '--trace-rate' in favor of provided rate value "
                        "in --trace-config!"
                    )
                out["rate"] = parse_int(value, -(2**31), INT32_MAX) & UINT32_MAX
            elif setting == "level":
                if "levels" in old:
                    warn.append(
                        "Overriding deprecated '--trace-level' in favor of provided level in "
                        "--trace-config!"
                    )
                levels.append(parse_level(value))
            elif setting == "mode":
                out["mode"] = parse_mode(value)
            elif setting == "count":
                if "count" in old:
                    warn.append(
                        "Overriding deprecated '--trace-count' in favor of provided count in "
                        "--trace-config!"
                    )
                out["count"] = parse_int(value, -(2**31), INT32_MAX)
            else:
                # NOTE: Triton ignores it without a word; we say so (file and
                # log-frequency are settings of a trace mode: "triton,log-frequency=1").
                warn.append(
                    f"--trace-config {setting}={value} is ignored, as Triton ignores it: "
                    f"'{setting}' is not a global trace setting (rate, level, count, mode); "
                    f"give it with its trace mode: '<trace mode>,{setting}={value}'"
                )
        except ValueError as e:
            raise _bad(setting, str(e)) from None
    level = 0
    for one in levels:
        level |= int(one)
    # NOTE: Triton: an explicit OFF anywhere disables tracing whatever else was given.
    out["level"] = 0 if TraceLevel.DISABLED in levels else level
    return out


def _triton_settings(
    items: Sequence[tuple[str, str]], old: Mapping[str, object], warn: list[str]
) -> dict[str, object]:
    out: dict[str, object] = {}
    for setting, value in items:
        if setting == "file":
            if "file" in old:
                warn.append(
                    "Overriding deprecated '--trace-file' in favor of provided file in "
                    "--trace-config!"
                )
            out["file"] = value
        elif setting == "log-frequency":
            if "log_frequency" in old:
                warn.append(
                    "Overriding deprecated '--trace-log-frequency' in favor of provided "
                    "log-frequency in --trace-config!"
                )
            try:
                out["log_frequency"] = parse_int(value, -(2**31), INT32_MAX)
            except ValueError as e:
                raise TritonMPError(
                    f'Bad option: "--trace-config triton,{setting}".\n{e}'
                ) from None
    return out


_BSP = {
    "bsp_max_queue_size": ("bsp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
    "bsp_schedule_delay": ("bsp_schedule_delay_ms", "OTEL_BSP_SCHEDULE_DELAY", "5000"),
    "bsp_max_export_batch_size": (
        "bsp_max_export_batch_size",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "512",
    ),
}


def _otel_settings(items: Sequence[tuple[str, str]], env: Mapping[str, str]) -> dict[str, object]:
    out: dict[str, object] = {}
    resource: list[tuple[str, str]] = []
    given: set[str] = set()
    for setting, value in items:
        if setting == "url":
            out["otel_url"] = value
        elif setting == "resource":
            key, sep, val = value.partition("=")
            if sep:
                resource.append((key, val))
        elif setting in _BSP:
            given.add(setting)
            try:
                out[_BSP[setting][0]] = parse_int(value, 0, UINT32_MAX)
            except ValueError as e:
                raise TritonMPError(
                    f'Bad option: "--trace-config opentelemetry,{setting}".\n{e}'
                ) from None
    for setting, (field, var, default) in _BSP.items():
        if setting in given:
            continue
        try:
            out[field] = parse_int(env.get(var, default), 0, UINT32_MAX)
        except ValueError as e:
            raise TritonMPError(f'Bad option: "{var}".\n{e}') from None
    out["otel_resource"] = tuple(resource)
    return out


def parse_trace_flags(
    trace_config: Sequence[str],
    deprecated: DeprecatedTraceFlags,
    env: Mapping[str, str],
) -> tuple[TraceConfig, list[str]]:
    """All of ``start``'s trace flags -> the starting ``TraceConfig`` and Triton's warnings.

    Args:
        trace_config: every ``--trace-config`` value, in order.
        deprecated: the deprecated ``--trace-*`` flags.
        env: the environment (``OTEL_BSP_*`` defaults of the batch span processor).

    Raises:
        TritonMPError: a value Triton refuses, with Triton's text.
    """
    warn: list[str] = []
    old = _deprecated(deprecated, warn)
    per_mode: dict[str, list[tuple[str, str]]] = {"": [], "triton": [], "opentelemetry": []}
    for arg in trace_config:
        mode, setting, value = split_trace_config(arg)
        per_mode[mode].append((setting, value))
    fields: dict[str, object] = {
        k: v for k, v in old.items() if k in ("file", "rate", "count", "log_frequency")
    }
    if "rate" in fields:
        fields["rate"] = int(fields["rate"]) & UINT32_MAX  # type: ignore[call-overload]
    fields.update(_global_settings(per_mode[""], old, warn))
    if fields.get("mode", "triton") == "opentelemetry":
        if "file" in old:
            warn.append(
                "'--trace-file' is deprecated and will be ignored with opentelemetry tracing mode. "
            )
        if "log_frequency" in old:
            warn.append(
                "'--trace-log-frequency' is deprecated and will be ignored with "
                "opentelemetry tracing mode."
            )
        fields.pop("file", None)
        fields.pop("log_frequency", None)
        fields.update(_otel_settings(per_mode["opentelemetry"], env))
    else:
        fields.update(_triton_settings(per_mode["triton"], old, warn))
    if int(fields.get("log_frequency", 0)) < 0:  # type: ignore[call-overload]
        fields["log_frequency"] = int(fields["log_frequency"]) & UINT32_MAX  # type: ignore[call-overload]
    return msgspec.convert(fields, TraceConfig), warn
