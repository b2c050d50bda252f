"""Request parameters: Triton's reserved ones read, custom ones kept for the backend.

Imported by ``frontend.validation``. Reserved: ``sequence_id`` (``int64_param``, read as
unsigned, or ``string_param``), ``sequence_start`` / ``sequence_end`` (``bool_param``),
``priority`` (``int64_param`` >= 0 or ``uint64_param``) and ``timeout`` (``int64_param``,
microseconds). Keys starting with ``triton_`` are reserved too (only
``triton_enable_empty_final_response`` may be sent, a ``bool_param``). Everything else is a
custom parameter, passed to the backend as JSON (``uint64`` ones are refused, as Triton's
gRPC frontend does).
Messages are server ``grpc/infer_handler.cc``'s: no ``[request id: ...]`` prefix, as the
frontend refuses them before the core sees the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.request import Parameter, Parameters, ParameterType
from triton_mp.ipc.protocol.messages import SequenceFlags

EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
"""The one ``triton_`` request parameter a client may send (the gRPC stream reads it)."""


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What a request's parameters ask for."""

    priority: int = 0
    """``priority``: the request's priority level (0 = the model's default)."""
    timeout_us: int = 0
    """``timeout``: queue timeout in microseconds (0 = the model's default)."""
    sequence_id: int | str = 0
    """``sequence_id``: the correlation ID (0 / "" = none)."""
    sequence_flags: int = 0
    """``SequenceFlags`` bits from ``sequence_start`` / ``sequence_end``."""
    parameters_json: str = "{}"
    """Custom (non-reserved) request parameters, as JSON, for backends."""


def priority_param(p: Parameter) -> int:
    """``priority``: ``int64_param`` >= 0 or ``uint64_param`` (server ``infer_handler.cc``).

    Raises:
        InvalidRequest: "invalid value for 'priority', expected value >= 0." or "invalid
            value type for 'priority' parameter, expected int64_param or uint64_param."
    """
    if p.type is ParameterType.INT64 and isinstance(p.value, int):
        if p.value < 0:
            raise InvalidRequest("invalid value for 'priority', expected value >= 0.")
        return p.value
    if p.type is ParameterType.UINT64 and isinstance(p.value, int):
        return p.value
    raise InvalidRequest(
        "invalid value type for 'priority' parameter, expected int64_param or uint64_param."
    )


def timeout_param(p: Parameter) -> int:
    """``timeout`` in microseconds: an ``int64_param``. Triton reads it as unsigned, so a
    negative one is a timeout that never comes: 0 here (none).

    Raises:
        InvalidRequest: "invalid value type for 'timeout' parameter, expected int64_param."
    """
    if p.type is ParameterType.INT64 and isinstance(p.value, int):
        return max(p.value, 0)
    raise InvalidRequest("invalid value type for 'timeout' parameter, expected int64_param.")


def sequence_id(p: Parameter) -> int | str:
    """``sequence_id``: ``int64_param`` (read as unsigned) or ``string_param`` (Triton's gRPC
    frontend; ``uint64_param`` is refused there).

    Raises:
        InvalidRequest: any other type.
    """
    if p.type is ParameterType.INT64 and isinstance(p.value, int):
        return p.value & 0xFFFFFFFFFFFFFFFF
    if p.type is ParameterType.STRING:
        text = str(p.value)
        if len(text) > MAX_STRING_CORRID:
            raise TritonMPError(
                "string correlation ID cannot be longer than 128 characters",
                ErrorCode.UNSUPPORTED,
            )
        return text
    raise InvalidRequest(
        "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."
    )


MAX_STRING_CORRID = 128
"""Longest string correlation ID (core ``TRITONSERVER_InferenceRequestSetCorrelationIdString``)."""


def check_correlation_id_type(
    corrid: int | str, config: mc.ModelConfig, model_name: str, rid: str
) -> None:
    """A sequence model's CORRID control against the request's correlation ID type (core
    ``InferenceRequest::ValidateCorrelationId``): a string ID needs a BYTES control, an
    integer one (or none: Triton's default ID is UINT64 0) UINT64, INT64, UINT32 or INT32.

    Raises:
        InvalidRequest: "<rid>sequence batching control '<name>' data-type is '<BYTES or
            UINT64>', but model '<m>' expects '<datatype>'".
    """
    if not config.HasField("sequence_batching"):
        return
    for ci in config.sequence_batching.control_input:
        for control in ci.control:
            if control.kind != mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
                continue
            want = mc.DataType.Name(control.data_type).removeprefix("TYPE_")
            want = "BYTES" if want == "STRING" else want
            got = "BYTES" if isinstance(corrid, str) else "UINT64"
            ok = (
                want == "BYTES"
                if got == "BYTES"
                else want in ("UINT64", "INT64", "UINT32", "INT32")
            )
            if not ok:
                raise InvalidRequest(
                    f"{rid}sequence batching control '{ci.name}' data-type is '{got}', but "
                    f"model '{model_name}' expects '{want}'"
                )
            return


def bool_param(p: Parameter, key: str) -> bool:
    """A ``bool_param``.

    Raises:
        InvalidRequest: any other type.
    """
    if p.type is not ParameterType.BOOL:
        raise InvalidRequest(f"invalid value type for '{key}' parameter, expected bool_param.")
    return bool(p.value)


RESERVED_TRITON_PARAMETERS = (EMPTY_FINAL_PARAMETER,)
"""``triton_`` keys a request may carry (server ``TRITON_RESERVED_REQUEST_PARAMS``)."""


def read_parameters(parameters: Parameters, rid: str) -> RequestOptions:
    """The options a request's parameters set, and its custom parameters as JSON.

    Args:
        parameters: the request-level parameters.
        rid: ``"[request id: <id>] "``, the prefix of Triton's messages.

    Raises:
        InvalidRequest: a malformed reserved parameter, a ``triton_`` key, a ``uint64``
            custom parameter.
    """
    priority = timeout_us = 0
    seq_id: int | str = 0
    flags = 0
    custom: dict[str, bool | int | float | str] = {}
    for key, p in parameters.items():
        if key == "sequence_id":
            seq_id = sequence_id(p)
        elif key == "sequence_start":
            flags |= SequenceFlags.START if bool_param(p, key) else 0
        elif key == "sequence_end":
            flags |= SequenceFlags.END if bool_param(p, key) else 0
        elif key == "priority":
            priority = priority_param(p)
        elif key == "timeout":
            timeout_us = timeout_param(p)
        elif key == EMPTY_FINAL_PARAMETER:
            bool_param(p, key)  # NOTE: SetStateParameterFromTritonParameter; the stream reads it
        elif key.startswith("triton_") and key not in RESERVED_TRITON_PARAMETERS:
            raise InvalidRequest(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only "
                "the following keys starting with 'triton_' are allowed: "
                + " ".join(RESERVED_TRITON_PARAMETERS)
            )
        elif p.type is ParameterType.UINT64 or p.type is None:
            raise InvalidRequest(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, "
                "or string_param."
            )
        elif p.type is not None and p.value is not None and not key.startswith("triton_"):
            custom[key] = p.value
    return RequestOptions(
        priority=priority,
        timeout_us=timeout_us,
        sequence_id=seq_id,
        sequence_flags=int(flags),
        parameters_json=json.dumps(custom) if custom else "{}",
    )
