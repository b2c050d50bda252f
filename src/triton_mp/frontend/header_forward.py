"""Triton's header forwarding: request headers whose name matches a pattern become string
request parameters.

Imported by the gRPC servicer and stream (``--grpc-header-forward-pattern``: call
metadata), the HTTP ``infer`` route (``--http-header-forward-pattern``: request headers) and
``frontend.validation`` (the merge). Upstream server ``grpc/infer_handler.h``
``ForwardHeadersAsParameters`` and ``http_server.cc`` ``ForwardHeaders``:

- a header is forwarded when ``RE2::PartialMatch(name, pattern)``: the pattern may match
  anywhere in the name (``re.search``); tritonserver's parser prefixes the flag's value
  with ``(?i)`` (``CASE_INSENSITIVE``, ``command_line_parser.cc``), so it matches in any
  case; the parameter keeps the name as it arrived (gRPC metadata keys are lower case,
  HTTP names keep the client's case);
- no flag forwards nothing (the pattern is ""); a pattern RE2 cannot parse matches
  nothing (RE2 logs the error; the CLI warns, ``pattern_error``);
- a forwarded name in ``RESERVED_PARAMETER_KEYS`` or starting with ``triton_`` refuses the
  request: INVALID_ARGUMENT "Header '<name>' is reserved for Triton usage and cannot be
  forwarded." (server PR #8763; no ``[request id: ...]`` prefix);
- headers are added after the request's own parameters (``TRITONSERVER_InferenceRequest
  SetStringParameter`` appends), so on a name collision the backend's parameters JSON holds
  both and a JSON reader keeps the header's value, the last one: here the header's value
  replaces the parameter's. A repeated header: the last value.

The pattern is compiled by RE2 itself (the ``google-re2`` binding), so what it accepts,
refuses and matches is tritonserver's. Binary (``-bin``) gRPC metadata is forwarded as
Triton forwards it: its decoded bytes as a C string (cut at the first NUL byte).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from triton_mp.common.errors import InvalidRequest

RESERVED_PARAMETER_KEYS = (
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    "headers",
    "binary_data_output",
)
"""Request parameters Triton reads itself (server ``common.h`` ``kReservedParameterKeys``)."""

CASE_INSENSITIVE = "(?i)"
"""What tritonserver's parser puts before a given forward pattern."""

Headers = Sequence[tuple[str, str]]
"""Forwarded headers: (name, value) in arrival order."""


def _compile(pattern: str) -> tuple[Any, str]:
    """``pattern`` compiled by RE2, and "" ; or None and why RE2 refuses it."""
    import re2  # noqa: PLC0415 - loaded only when a forward pattern is given

    try:
        return re2.compile(pattern), ""
    except re2.error as e:
        why = e.args[0] if e.args else e
        return None, why.decode(errors="replace") if isinstance(why, bytes) else str(why)


def pattern_error(pattern: str) -> str:
    """Why RE2 cannot compile ``pattern`` ("" when it can, or it is empty)."""
    return _compile(pattern)[1] if pattern else ""


def _as_c_string(value: str | bytes) -> str:
    """A header value as tritonserver passes it on (``std::string::c_str()``): up to the
    first NUL; a binary value's bytes read as UTF-8 (an invalid byte becomes U+FFFD)."""
    if isinstance(value, bytes):
        value = value.split(b"\0", 1)[0].decode(errors="replace")
    return value.split("\0", 1)[0]


class HeaderForward:
    """One transport's forward pattern.

    Args:
        pattern: ``--grpc-header-forward-pattern`` / ``--http-header-forward-pattern``
            as the CLI gives it (``CASE_INSENSITIVE`` + the flag's value; "" forwards
            nothing; one RE2 refuses, nothing either).
    """

    __slots__ = ("_regex",)

    def __init__(self, pattern: str = "") -> None:
        self._regex = _compile(pattern)[0] if pattern else None

    @property
    def active(self) -> bool:
        """Whether any header can be forwarded."""
        return self._regex is not None

    def select(self, headers: Iterable[tuple[str, str | bytes]]) -> tuple[tuple[str, str], ...]:
        """The headers whose name the pattern matches anywhere, in arrival order.

        Args:
            headers: (name, value) pairs: gRPC invocation metadata (a ``-bin`` key's value
                comes as its decoded bytes) or HTTP request headers.

        Returns:
            (name, value) with the value as a string, as ``_as_c_string`` makes it.
        """
        regex = self._regex
        if regex is None:
            return ()
        return tuple(
            (str(name), _as_c_string(value)) for name, value in headers if regex.search(str(name))
        )


def check_forwarded(headers: Headers) -> None:
    """Refuse a forwarded header with a reserved name.

    Raises:
        InvalidRequest: "Header '<name>' is reserved for Triton usage and cannot be
            forwarded." for a name in ``RESERVED_PARAMETER_KEYS`` or starting ``triton_``.
    """
    for name, _ in headers:
        if name in RESERVED_PARAMETER_KEYS or name.startswith("triton_"):
            raise InvalidRequest(
                f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
            )


def merge_forwarded(parameters_json: str, headers: Headers) -> str:
    """The backend's parameters JSON with the forwarded headers as string parameters.

    Args:
        parameters_json: the request's custom parameters, a JSON object.
        headers: checked forwarded headers (``check_forwarded``).

    Returns:
        A JSON object: the request's parameters, then each header's name -> value (a
        header replaces a parameter of its name; of a repeated header the last value).
    """
    if not headers:
        return parameters_json
    merged = json.loads(parameters_json) if parameters_json else {}
    for name, value in headers:
        merged[name] = value
    return json.dumps(merged)
