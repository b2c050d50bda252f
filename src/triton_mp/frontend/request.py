"""An inference request as the frontend's core takes it, whatever the transport.

Imported by the frontend only; no protobuf, no aiohttp. The gRPC adapter
(``frontend.grpc.messages.request_from_proto``) and the HTTP one
(``frontend.http.infer_codec``) build these from their wire forms; validation
(``frontend.validation``) and submission (``frontend.inference``) read them. The fields are
those of KServe v2's ``inference.ModelInferRequest`` (grpc_service.proto), the data model
both transports share; a parameter keeps which of ``InferParameter``'s types it was sent as,
since Triton's rules depend on it (a ``uint64`` custom parameter is refused, an ``int64``
``sequence_id`` is read as unsigned).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum


class ParameterType(Enum):
    """Which field of ``InferParameter``'s ``parameter_choice`` a parameter was sent in (the
    values are those field names)."""

    BOOL = "bool_param"
    INT64 = "int64_param"
    STRING = "string_param"
    DOUBLE = "double_param"
    UINT64 = "uint64_param"


@dataclass(frozen=True, slots=True)
class Parameter:
    """One request or tensor parameter (``inference.InferParameter``).

    Attributes:
        type: the field it was sent in; None when the client set none.
        value: bool, int (INT64 and UINT64), float (DOUBLE) or str; None with no type.
    """

    type: ParameterType | None
    value: bool | int | float | str | None = None

    @property
    def string(self) -> str:
        """The value of a STRING parameter; "" for any other (as protobuf reads an unset
        ``string_param``)."""
        return self.value if self.type is ParameterType.STRING else ""  # type: ignore[return-value]


def bool_parameter(value: bool) -> Parameter:
    """A BOOL parameter."""
    return Parameter(ParameterType.BOOL, value)


def int64_parameter(value: int) -> Parameter:
    """An INT64 parameter (-2**63 .. 2**63-1)."""
    return Parameter(ParameterType.INT64, value)


def uint64_parameter(value: int) -> Parameter:
    """A UINT64 parameter (0 .. 2**64-1)."""
    return Parameter(ParameterType.UINT64, value)


def string_parameter(value: str) -> Parameter:
    """A STRING parameter."""
    return Parameter(ParameterType.STRING, value)


Parameters = Mapping[str, Parameter]
"""Parameter name -> parameter, as ``map<string, InferParameter>``."""

TENSOR_CONTENTS = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)
"""The fields of ``inference.InferTensorContents`` (tensor elements in typed form)."""


@dataclass(frozen=True, slots=True)
class InputTensor:
    """One input of a request (``ModelInferRequest.InferInputTensor``).

    Attributes:
        name: the input's name.
        datatype: the protocol datatype string the client sent (``"FP32"``, ``"BYTES"``).
        shape: the full shape the client sent (batch dimension included), in elements.
        parameters: ``shared_memory_region``, ``shared_memory_offset``,
            ``shared_memory_byte_size`` (the tensor is in registered shared memory).
        contents: the typed elements the client sent, by ``TENSOR_CONTENTS`` field name,
            only the fields that hold elements (flattened row-major); empty when the bytes
            come in ``InferenceRequest.raw_inputs`` or shared memory.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: Parameters = field(default_factory=dict)
    contents: Mapping[str, Sequence[object]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """One output the client asks for (``ModelInferRequest.InferRequestedOutputTensor``).

    Attributes:
        name: the output's name.
        parameters: ``classification``; ``shared_memory_*`` (write it into registered
            shared memory).
    """

    name: str
    parameters: Parameters = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """One inference request (``inference.ModelInferRequest``), transport-free.

    Attributes:
        model_name: the model addressed.
        model_version: the version addressed as sent ("" = the latest ready one).
        id: the client's request id, echoed in every response ("" when none).
        parameters: request parameters: ``sequence_id``, ``sequence_start``,
            ``sequence_end``, ``priority``, ``timeout`` (us) and custom ones for backends.
        inputs: the inputs in the order sent.
        outputs: the outputs asked for; none means all of the model's.
        raw_inputs: the bytes of each input that sends them in the request (neither typed
            contents nor shared memory), in input order (``raw_input_contents``); views into
            the received message where the transport can, so they are copied only once,
            into the frontend's arena.
        raw_name: the name core keys a raw binary request's one input by (HTTP
            ``Inference-Header-Content-Length: 0``: "raw_input", which Normalize's checks
            after its rename still print); "" for every other request.
    """

    model_name: str
    model_version: str = ""
    id: str = ""
    parameters: Parameters = field(default_factory=dict)
    inputs: Sequence[InputTensor] = ()
    outputs: Sequence[RequestedOutput] = ()
    raw_inputs: Sequence[bytes | memoryview] = ()
    headers: Sequence[tuple[str, str]] = ()
    raw_name: str = ""
