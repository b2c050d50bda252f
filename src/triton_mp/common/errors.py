"""Error codes and the exception hierarchy shared by every process.

Imported by all roles. Transport mapping (gRPC status, HTTP status) lives only in
``triton_mp.frontend``; errors cross process boundaries as ``ipc.protocol.messages.ErrorInfo``
(code + message), never as pickled exceptions.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Triton's TRITONSERVER_Error codes (tritonserver.h ``TRITONSERVER_Error_Code``).

    The gRPC mapping (server/src/grpc/grpc_utils.cc) is done in ``frontend.grpc.servicer``:
    UNSUPPORTED -> UNIMPLEMENTED, INVALID_ARG -> INVALID_ARGUMENT, the rest by name.
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7
    DEADLINE_EXCEEDED = 8
    RESOURCE_EXHAUSTED = 9


_CODE_STRINGS = {
    ErrorCode.UNKNOWN: "Unknown",
    ErrorCode.INTERNAL: "Internal",
    ErrorCode.NOT_FOUND: "Not found",
    ErrorCode.INVALID_ARG: "Invalid argument",
    ErrorCode.UNAVAILABLE: "Unavailable",
    ErrorCode.UNSUPPORTED: "Unsupported",
    ErrorCode.ALREADY_EXISTS: "Already exists",
}


def status_text(code: ErrorCode, message: str) -> str:
    """Triton's ``Status::AsString`` (common ``error.cc``): "<code's words>: <message>", as
    core words a version's load failure (model_lifecycle.cc ``state_reason_``)."""
    return f"{_CODE_STRINGS.get(code, '<invalid code>')}: {message}"


class TritonMPError(Exception):
    """Root of every error triton-mp raises on purpose.

    Attributes:
        code: the ``ErrorCode`` a client will see.
        message: the Triton-like text a client will see.
    """

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class ConfigError(TritonMPError):
    """A model configuration or server flag is invalid (INVALID_ARG)."""

    code = ErrorCode.INVALID_ARG


class InvalidRequest(TritonMPError):
    """An inference request does not match the model configuration (INVALID_ARG)."""

    code = ErrorCode.INVALID_ARG


class ModelNotFound(TritonMPError):
    """The request names a model or version the server does not know (NOT_FOUND)."""

    code = ErrorCode.NOT_FOUND


class ModelUnavailable(TritonMPError):
    """The model exists but is not ready, or the server is stopping (UNAVAILABLE)."""

    code = ErrorCode.UNAVAILABLE


class QueueFull(TritonMPError):
    """The model's queue is at ``max_queue_size`` (UNAVAILABLE)."""

    code = ErrorCode.UNAVAILABLE


class RequestTimeout(TritonMPError):
    """A queue-policy timeout expired before the request was scheduled (UNAVAILABLE)."""

    code = ErrorCode.UNAVAILABLE


class WorkerCrashed(TritonMPError):
    """The model instance that held the request died (UNAVAILABLE)."""

    code = ErrorCode.UNAVAILABLE


class StartupError(TritonMPError):
    """A child process did not report ready within its deadline (INTERNAL)."""

    code = ErrorCode.INTERNAL


def cut_utf8(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes (at a character boundary), saying how many
    bytes were left out (``"... [N more bytes cut]"``); shorter texts are returned as they
    are. For messages that must fit a bounded carrier (a gRPC status, a ring record)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    head = data[:limit].decode(errors="ignore")
    return f"{head}... [{len(data) - len(head.encode())} more bytes cut]"


def flatten_exception(exc: BaseException) -> str:
    """Render a foreign exception as ``"pkg.Class: message"`` for an ``ErrorInfo``."""
    cls = type(exc)
    mod = cls.__module__
    name = cls.__qualname__ if mod in ("builtins", "__main__") else f"{mod}.{cls.__qualname__}"
    return f"{name}: {exc}"
