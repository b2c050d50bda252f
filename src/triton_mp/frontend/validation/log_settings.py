"""Triton's log settings requests (the ``logging`` extension), checked in Triton's order
and words: HTTP ``POST /v2/logging`` (server ``HTTPAPIServer::HandleLogging``) and gRPC
``LogSettings`` (server ``CommonHandler::RegisterLogging``).

Both read the settings in one order (``log_file``, ``log_info``, ``log_warning``,
``log_error``, ``log_verbose_level``, ``log_format``) and apply each one as it is read, so a
bad setting fails the request after the ones before it took effect; ``update_from_json`` and
``update_from_grpc`` return those settings with the error. Names outside the six are
ignored, as Triton ignores them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.common.process.log import LogSettings

FILE_REFUSED = "log file location can not be updated through network protocol"
_FORMATS = ("default", "ISO8601")
_BOOLS = (("log_info", "info"), ("log_warning", "warning"), ("log_error", "error"))
_INT32 = 0xFFFFFFFF


def _verbose(value: int) -> int:
    """Triton keeps the level as an int32 (``static_cast<int32_t>``) and reports it as
    unsigned: levels wrap at 2**32."""
    return value & _INT32


def update_from_json(now: LogSettings, body: object) -> tuple[LogSettings, TritonMPError | None]:
    """An HTTP request's JSON object -> (the settings after it, the error that stopped it).

    ``null`` values leave a setting as it is. Errors: UNSUPPORTED for a ``log_file`` that is
    not null; INTERNAL with TritonJson's text for a value of the wrong JSON type;
    UNAVAILABLE ``invalid argument for --log_format, got: <f>`` for a format other than
    ``default`` / ``ISO8601``.
    """
    if not isinstance(body, Mapping):
        return now, None
    if body.get("log_file") is not None:
        return now, TritonMPError(FILE_REFUSED, ErrorCode.UNSUPPORTED)
    for name, attr in _BOOLS:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, bool):
            return now, TritonMPError(
                "attempt to access JSON non-boolean as boolean", ErrorCode.INTERNAL
            )
        now = msgspec.structs.replace(now, **{attr: value})
    value = body.get("log_verbose_level")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return now, TritonMPError(
                "attempt to access JSON non-unsigned-integer as unsigned-integer",
                ErrorCode.INTERNAL,
            )
        now = msgspec.structs.replace(now, verbose=_verbose(value))
    value = body.get("log_format")
    if value is not None:
        if not isinstance(value, str):
            return now, TritonMPError(
                "attempt to access JSON non-string as string", ErrorCode.INTERNAL
            )
        if value not in _FORMATS:
            return now, TritonMPError(
                f"invalid argument for --log_format, got: {value}", ErrorCode.UNAVAILABLE
            )
        now = msgspec.structs.replace(now, format=value)
    return now, None


def update_from_grpc(
    now: LogSettings, settings: Mapping[str, Any]
) -> tuple[LogSettings, TritonMPError | None]:
    """A gRPC ``LogSettingsRequest.settings`` map (name -> ``SettingValue``) -> (the
    settings after it, the error that stopped it).

    Errors: UNSUPPORTED for any ``log_file`` entry; INVALID_ARG ``expect boolean for
    '<name>'``, ``expect int32 for 'log_verbose_level'`` (a value that is not
    ``uint32_param``), ``expect string for 'log_format'`` and ``invalid argument for
    log_format, got: <f>``.
    """
    if "log_file" in settings:
        return now, TritonMPError(FILE_REFUSED, ErrorCode.UNSUPPORTED)
    for name, attr in _BOOLS:
        if name not in settings:
            continue
        value = settings[name]
        if value.WhichOneof("parameter_choice") != "bool_param":
            return now, TritonMPError(f"expect boolean for '{name}'", ErrorCode.INVALID_ARG)
        now = msgspec.structs.replace(now, **{attr: value.bool_param})
    if "log_verbose_level" in settings:
        value = settings["log_verbose_level"]
        if value.WhichOneof("parameter_choice") != "uint32_param":
            return now, TritonMPError("expect int32 for 'log_verbose_level'", ErrorCode.INVALID_ARG)
        now = msgspec.structs.replace(now, verbose=value.uint32_param)
    if "log_format" in settings:
        value = settings["log_format"]
        if value.WhichOneof("parameter_choice") != "string_param":
            return now, TritonMPError("expect string for 'log_format'", ErrorCode.INVALID_ARG)
        if value.string_param not in _FORMATS:
            return now, TritonMPError(
                f"invalid argument for log_format, got: {value.string_param}",
                ErrorCode.INVALID_ARG,
            )
        now = msgspec.structs.replace(now, format=value.string_param)
    return now, None


def settings_json(s: LogSettings) -> dict[str, object]:
    """The settings as Triton's HTTP answer writes them (keys in Triton's order)."""
    return {
        "log_file": s.file,
        "log_info": s.info,
        "log_warning": s.warning,
        "log_error": s.error,
        "log_verbose_level": s.verbose,
        "log_format": s.format,
    }
