"""Trace settings at run time: the global and per-model settings, sampling, the trace files.

Imported by the frontend only (``frontend.tracing.tracer`` samples through it; the TraceSetting
endpoints of both transports read and update it). No transport, no clock. It follows
Triton's ``TraceManager`` (server ``src/tracer.cc``):

- one global setting, and per model an optional setting whose fields fall back to the
  global one unless the model specified them; clearing a field (``null`` over HTTP, an empty
  value list over gRPC) makes it fall back again, and a model with no field of its own left
  uses the global setting itself;
- every update replaces the setting object: its sample counter starts again, and the traces
  it collected but had not written are written when it is replaced (to ``<file>.<k>`` when
  it has a log frequency, else appended to ``<file>``);
- a setting samples every ``rate``-th request it sees while ``count`` is not 0 (-1: no
  limit); with ``log_frequency`` n its traces go to ``<file>.<k>`` every n traces, and when
  ``count`` reaches 0 the rest go to the next ``<file>.<k>``;
- ``trace_file`` cannot be changed over the network (UNSUPPORTED, as current Triton).

With several frontend processes each keeps its own settings and counters; the frontend that
takes a settings request passes the update on to the others (``TraceSettingUpdate``), which
apply it too. Each writes its own file: frontend 0 ``<file>``, frontend k
``<file>.frontend<k>`` (see ``frontend.tracing.tracer``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.common.trace_config import (
    INT32_MAX,
    UINT32_MAX,
    TraceConfig,
    TraceLevel,
)

log = logging.getLogger(__name__)


class TraceFile:
    """One trace file (Triton's ``TraceFile``): traces appended at shutdown, or written
    whole to ``<name>.<k>`` files.

    Args:
        name: the file path; "" = no file (a setting without one samples nothing).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._first = True
        self._index = 0
        self._handle: object = None

    def save(self, body: str, *, indexed: bool) -> None:
        """Write ``body`` (comma-joined JSON objects) to ``<name>.<k>`` as a whole array
        (``indexed``), or append it to the one array of ``<name>``. A file that cannot be
        written costs its traces and one error line, never the request or the process
        (Triton's ``TraceFile::SaveTraces``: "failed creating trace file: ...")."""
        if not self.name:
            return
        try:
            if indexed:
                path = f"{self.name}.{self._index}"
                self._index += 1
                Path(path).write_text(f"[{body}]")
                return
            with open(self.name, "w" if self._first else "a") as f:
                f.write(("[" if self._first else ",") + body)
            self._first = False
        except OSError as e:
            log.error("failed creating trace file: %s", e)

    def close(self) -> None:
        """End the array of ``<name>`` if anything was appended to it."""
        if not self._first and self.name:
            try:
                with open(self.name, "a") as f:
                    f.write("]")
            except OSError as e:
                log.error("failed creating trace file: %s", e)
            self._first = True


@dataclass(slots=True)
class Specified:
    """Which fields a setting gives itself (the rest come from its fallback)."""

    level: bool = False
    rate: bool = False
    count: bool = False
    log_frequency: bool = False
    file: bool = False


class TraceSetting:
    """One setting object (Triton's ``TraceSetting``): its values, its sampling state and
    the traces it collected but has not written yet."""

    def __init__(
        self,
        *,
        level: int,
        rate: int,
        count: int,
        log_frequency: int,
        file: TraceFile,
        mode: str,
        specified: Specified,
    ) -> None:
        self.level = level
        self.rate = rate
        self.count = count
        self.log_frequency = log_frequency
        self.file = file
        self.mode = mode
        self.specified = specified
        self.sample = 0
        """Requests seen (every one counts, traced or not)."""
        self.created = 0
        self.collected = 0
        self._stream: list[str] = []
        self.outstanding = 0
        """Traces sampled from this setting and not yet written."""
        self.retired = False
        """Replaced by an update: written out once its last trace is in."""
        if level == TraceLevel.DISABLED:
            self.invalid_reason = "tracing is disabled"
        elif rate == 0:
            self.invalid_reason = "sample rate must be non-zero"
        elif mode == "triton" and not file.name:
            self.invalid_reason = "trace file name is not given"
        else:
            self.invalid_reason = ""

    @property
    def valid(self) -> bool:
        """Triton's ``Valid()``: it may sample (a reason is empty and count is not 0)."""
        return not self.invalid_reason and self.count != 0

    def take_sample(self, force: bool = False) -> bool:
        """One request arrives: whether it is traced (Triton's ``SampleTrace``).

        Args:
            force: the request carries a propagated OpenTelemetry context (always traced).
        """
        hit = False
        if self.rate != 0:
            if not self.valid and not force:
                return False
            self.sample += 1
            hit = self.sample % self.rate == 0
            if hit and self.count > 0:
                self.count -= 1
                self.created += 1
            elif hit and self.count == 0:
                hit = False
        if hit or force:
            self.outstanding += 1
            return True
        return False

    def write(self, objects: Sequence[str]) -> None:
        """A trace of this setting completed: keep its JSON objects, writing a file when
        the log frequency or the count says so (Triton's ``WriteTrace``)."""
        self.outstanding -= 1
        self.collected += 1
        self._stream.append(",".join(objects))
        if (self.count == 0 and self.collected == self.sample) or (
            self.log_frequency != 0 and len(self._stream) >= self.log_frequency
        ):
            self.file.save(",".join(self._stream), indexed=True)
            self._stream = []
        if self.retired and self.outstanding <= 0:
            self.flush()

    def flush(self) -> None:
        """Write what is left (Triton does it when the setting object is destroyed)."""
        if self.mode == "triton" and self._stream:
            self.file.save(",".join(self._stream), indexed=self.log_frequency != 0)
        self._stream = []


@dataclass(frozen=True, slots=True)
class NewSetting:
    """A settings request: per field, a new value, ``clear`` (back to the fallback), or
    unchanged (``None`` and not cleared). Triton's ``TraceManager::NewSetting``."""

    level: int | None = None
    rate: int | None = None
    count: int | None = None
    log_frequency: int | None = None
    clear_level: bool = False
    clear_rate: bool = False
    clear_count: bool = False
    clear_log_frequency: bool = False


class TraceSettings:
    """The global setting, the per-model ones and their files (Triton's ``TraceManager``).

    Args:
        config: the settings the server started with.
    """

    def __init__(self, config: TraceConfig, file_name: str | None = None) -> None:
        self.config = config
        self._files: dict[str, TraceFile] = {}
        name = config.file if file_name is None else file_name
        self._default = TraceSetting(
            level=config.level,
            rate=config.rate,
            count=config.count,
            log_frequency=config.log_frequency,
            file=self._file(name),
            mode=config.mode,
            specified=Specified(),
        )
        self.global_setting = TraceSetting(
            level=config.level,
            rate=config.rate,
            count=config.count,
            log_frequency=config.log_frequency,
            file=self._default.file,
            mode=config.mode,
            specified=Specified(file=True),
        )
        self.models: dict[str, TraceSetting] = {}
        self._fallback_models: set[str] = set()

    def _file(self, name: str) -> TraceFile:
        if name not in self._files:
            self._files[name] = TraceFile(name)
        return self._files[name]

    @property
    def active(self) -> bool:
        """Whether any setting may trace (the one check an untraced request pays when
        tracing is off everywhere)."""
        if self.global_setting.level:
            return True
        return any(s.level for s in self.models.values())

    def setting_for(self, model: str) -> TraceSetting:
        """The setting requests for ``model`` are sampled by."""
        return self.models.get(model, self.global_setting)

    def update(self, model: str, new: NewSetting) -> None:
        """Apply a settings request to ``model``'s setting ("" = the global one); an update
        of the global setting also refreshes every model setting that falls back to it.

        Raises:
            TritonMPError: INVALID_ARG ``Attempting to set invalid trace setting :<why>``
                for a setting that could not trace (other than one that turns tracing off).
        """
        self._update(model, new)
        if not model:
            for name in sorted(self._fallback_models):
                self._update(name, NewSetting())

    def _update(self, model: str, new: NewSetting) -> None:
        if model:
            current: TraceSetting | None = self.models.get(model)
            fallback = self.global_setting
        else:
            current, fallback = self.global_setting, self._default
        was = current.specified if current is not None else Specified()
        spec = Specified(
            level=not new.clear_level and (was.level or new.level is not None),
            rate=not new.clear_rate and (was.rate or new.rate is not None),
            count=not new.clear_count and (was.count or new.count is not None),
            log_frequency=not new.clear_log_frequency
            and (was.log_frequency or new.log_frequency is not None),
            file=was.file,
        )

        def pick(flag: bool, given: int | None, field: str) -> int:
            if not flag:
                return int(getattr(fallback, field))
            if given is not None:
                return given
            assert current is not None
            return int(getattr(current, field))

        file = current.file if (spec.file and current is not None) else fallback.file
        if model:
            every = spec.level and spec.rate and spec.count and spec.log_frequency and spec.file
            none = not (spec.level or spec.rate or spec.count or spec.log_frequency or spec.file)
            if every:
                self._fallback_models.discard(model)
            elif none:
                old = self.models.pop(model, None)
                self._fallback_models.discard(model)
                self._retire(old)
                return
            else:
                self._fallback_models.add(model)
        setting = TraceSetting(
            level=pick(spec.level, new.level, "level"),
            rate=pick(spec.rate, new.rate, "rate"),
            count=pick(spec.count, new.count, "count"),
            log_frequency=pick(spec.log_frequency, new.log_frequency, "log_frequency"),
            file=file,
            mode=fallback.mode,
            specified=spec,
        )
        if not setting.valid and setting.level != TraceLevel.DISABLED:
            raise TritonMPError(
                f"Attempting to set invalid trace setting :{setting.invalid_reason}",
                ErrorCode.INVALID_ARG,
            )
        if model:
            self._retire(self.models.get(model))
            self.models[model] = setting
        else:
            self._retire(self.global_setting)
            self.global_setting = setting

    @staticmethod
    def _retire(setting: TraceSetting | None) -> None:
        if setting is None:
            return
        setting.retired = True
        if setting.outstanding <= 0:
            setting.flush()

    def view(self, model: str) -> dict[str, str | list[str]]:
        """The settings of ``model`` ("" = global) as Triton answers them: every value a
        string, ``trace_level`` a list; ``log_frequency`` and ``trace_file`` in triton mode
        only, the mode's own options after ``trace_mode``."""
        s = self.setting_for(model) if model else self.global_setting
        levels: list[str] = []
        if s.level == TraceLevel.DISABLED:
            levels.append("OFF")
        else:
            if s.level & TraceLevel.TIMESTAMPS:
                levels.append("TIMESTAMPS")
            if s.level & TraceLevel.TENSORS:
                levels.append("TENSORS")
        out: dict[str, str | list[str]] = {
            "trace_level": levels,
            "trace_rate": str(s.rate),
            "trace_count": str(s.count),
        }
        if s.mode == "triton":
            out["log_frequency"] = str(s.log_frequency)
            out["trace_file"] = self.config.file
        out["trace_mode"] = s.mode
        if s.mode == "opentelemetry":
            c = self.config
            out["url"] = c.otel_url
            for key, value in c.otel_resource:
                out["resource"] = f"{key}={value}"
            out["bsp_max_queue_size"] = str(c.bsp_max_queue_size)
            out["bsp_schedule_delay"] = str(c.bsp_schedule_delay_ms)
            out["bsp_max_export_batch_size"] = str(c.bsp_max_export_batch_size)
        return out

    def close(self) -> None:
        """Shutdown: write every setting's remaining traces and end the files' arrays."""
        for s in (self.global_setting, *self.models.values()):
            s.flush()
        for f in self._files.values():
            f.close()


# ----------------------------------------------------------------- settings requests
FILE_REFUSED = "trace file location can not be updated through network protocol"


def stoi(text: str) -> int | None:
    """C++ ``std::stoi``: leading blanks, a sign, then digits (the rest is ignored); None
    when no digit comes first (``invalid_argument``). Out of int32 raises OverflowError."""
    body = text.lstrip(" \t\n\r\f\v")
    sign = ""
    if body[:1] in ("+", "-"):
        sign, body = body[0], body[1:]
    digits = ""
    for ch in body:
        if not ch.isdigit() or not ch.isascii():
            break
        digits += ch
    if not digits:
        return None
    value = int(sign + digits)
    if not -(2**31) <= value <= INT32_MAX:
        raise OverflowError
    return value


def _number(name: str, text: str, got: str = "got: ") -> int:
    """One numeric setting with Triton's errors and ranges (rate, log_frequency: uint32,
    wrapping a negative value; count: >= -1). ``got``: how the count error introduces the
    value (Triton's HTTP text has no space after ``got:``, its gRPC one has)."""
    try:
        value = stoi(text)
    except OverflowError:
        low, high = ("-1", str(INT32_MAX)) if name == "trace_count" else ("0", str(UINT32_MAX))
        raise TritonMPError(
            f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {text}",
            ErrorCode.INVALID_ARG,
        ) from None
    if value is None:
        raise TritonMPError(f"Unable to parse '{name}', got: {text}", ErrorCode.INVALID_ARG)
    if name == "trace_count":
        if value < -1:
            raise TritonMPError(
                f"Unable to parse 'trace_count'. Expecting value >= -1, {got}{text}",
                ErrorCode.INVALID_ARG,
            )
        return value
    return value & UINT32_MAX


def _levels(values: Sequence[str]) -> int | None:
    """``trace_level`` values -> level bits; None when none names a level (unknown names
    are ignored, as Triton ignores them)."""
    level: int | None = None
    for v in values:
        if v == "OFF":
            if len(values) != 1:
                raise TritonMPError(
                    "Expect only one trace level 'OFF' is specified", ErrorCode.INVALID_ARG
                )
            level = 0
        elif v == "TIMESTAMPS":
            level = (level or 0) | TraceLevel.TIMESTAMPS
        elif v == "TENSORS":
            level = (level or 0) | TraceLevel.TENSORS
    return level


_FIELDS = ("trace_rate", "trace_count", "log_frequency")
_ATTR = {"trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


def new_setting_from_grpc(settings: Mapping[str, Sequence[str]]) -> NewSetting:
    """``TraceSettingRequest.settings`` (name -> values; no values = clear) -> NewSetting.

    Raises:
        TritonMPError: UNSUPPORTED for ``trace_file``; INVALID_ARG with Triton's texts.
    """
    if "trace_file" in settings:
        raise TritonMPError(FILE_REFUSED, ErrorCode.UNSUPPORTED)
    kw: dict[str, object] = {}
    if "trace_level" in settings:
        values = list(settings["trace_level"])
        if not values:
            kw["clear_level"] = True
        else:
            kw["level"] = _levels(values)
    for name in _FIELDS:
        if name not in settings:
            continue
        values = list(settings[name])
        if not values:
            kw["clear_" + _ATTR[name]] = True
        elif len(values) == 1:
            kw[_ATTR[name]] = _number(name, values[0])
        else:
            raise TritonMPError(f"expect only 1 value for '{name}'", ErrorCode.INVALID_ARG)
    return NewSetting(**kw)  # type: ignore[arg-type]


def new_setting_from_json(body: Mapping[str, object]) -> NewSetting:
    """An HTTP settings request's JSON object (``null`` = clear) -> NewSetting.

    Raises:
        TritonMPError: UNSUPPORTED for ``trace_file``; INVALID_ARG with Triton's texts;
            INTERNAL for a value of the wrong JSON type (Triton's TritonJson errors).
    """
    if "trace_file" in body:
        raise TritonMPError(FILE_REFUSED, ErrorCode.UNSUPPORTED)
    kw: dict[str, object] = {}
    if "trace_level" in body:
        value = body["trace_level"]
        if value is None:
            kw["clear_level"] = True
        else:
            if not isinstance(value, list):
                raise TritonMPError("attempt to access JSON non-array as array", ErrorCode.INTERNAL)
            if not all(isinstance(v, str) for v in value):
                raise TritonMPError(
                    "attempt to access JSON non-string as string", ErrorCode.INTERNAL
                )
            kw["level"] = _levels(value)
    for name in _FIELDS:
        if name not in body:
            continue
        value = body[name]
        if value is None:
            kw["clear_" + _ATTR[name]] = True
        elif not isinstance(value, str):
            raise TritonMPError("attempt to access JSON non-string as string", ErrorCode.INTERNAL)
        else:
            kw[_ATTR[name]] = _number(name, value, got="got:")
    return NewSetting(**kw)  # type: ignore[arg-type]
