"""What travels for request tracing: the trace of a request and of its children, and the
frontends' settings updates to each other.

Imported by ``ipc.protocol.messages`` (which re-exports every name and puts ``TraceSettingUpdate``
in the ``ToFrontend`` union) and through it by every role. ``InferRequest.trace`` and
``InferResponse.trace`` are None for untraced requests; see ``frontend.tracing.tracer``.
"""

from __future__ import annotations

import msgspec


class TraceContext(msgspec.Struct, frozen=True, array_like=True):
    """A traced request's trace as it travels with the request (``InferRequest.trace``;
    None for every untraced request, so those pay one flag check only)."""

    level: int
    """``common.trace_config.TraceLevel`` bits: TIMESTAMPS, TENSORS."""
    queue_ns: int = 0
    """QUEUE_START (monotonic ns), stamped by the scheduler when it queues the request."""


class TensorTrace(msgspec.Struct, frozen=True, array_like=True):
    """One tensor of a TENSORS-level trace, as Triton's trace file writes it."""

    activity: str
    """``TENSOR_QUEUE_INPUT``, ``TENSOR_BACKEND_INPUT`` or ``TENSOR_BACKEND_OUTPUT``."""
    name: str
    data: str
    """The elements, comma-separated (Triton's text form)."""
    shape: str
    """The dims, comma-separated."""
    dtype: str


class ChildTrace(msgspec.Struct, frozen=True, array_like=True):
    """A child trace (a BLS request made with ``trace=request.trace()``), finished in the
    process that made it and carried home on its parent's response."""

    model: str
    version: int
    request_id: str
    stamps: tuple[tuple[str, int], ...]
    tensors: tuple[TensorTrace, ...] = ()
    children: tuple[ChildTrace, ...] = ()


class TraceRecord(msgspec.Struct, frozen=True, array_like=True):
    """What other processes recorded of a traced request, on its ``InferResponse``."""

    stamps: tuple[tuple[str, int], ...] = ()
    """(Triton timestamp name, monotonic ns): QUEUE_START from the scheduler, COMPUTE_* from
    the worker."""
    tensors: tuple[TensorTrace, ...] = ()
    children: tuple[ChildTrace, ...] = ()


class TraceSettingUpdate(
    msgspec.Struct, frozen=True, kw_only=True, tag="trace_setting", array_like=True
):
    """A frontend applied a TraceSetting update: the others apply it too (peer rings), so
    the settings are the server's, whichever frontend a client reached. Per field: a new
    value, ``clear_*``, or None (unchanged), as ``frontend.tracing.settings.NewSetting``."""

    frontend_id: int
    model: str
    """"" = the global setting."""
    level: int | None = None
    rate: int | None = None
    count: int | None = None
    log_frequency: int | None = None
    clear_level: bool = False
    clear_rate: bool = False
    clear_count: bool = False
    clear_log_frequency: bool = False
