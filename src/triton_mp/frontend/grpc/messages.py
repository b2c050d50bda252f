"""``inference.*`` protos <-> the frontend core's transport-free objects.

Imported by the gRPC adapter (``frontend.grpc.servicer``, ``frontend.grpc.stream``).
``request_from_proto`` turns a ``ModelInferRequest`` into the ``InferenceRequest`` the core
validates, keeping each parameter's protocol type and the raw tensor bytes as they arrived
(views into the received message when ``wire.split_infer_request`` parsed it); typed
contents are kept by field. ``infer_response`` / ``infer_response_bytes`` write an
``InferResult`` back as a ``ModelInferResponse`` (and release it); ``stream_response``,
``stream_end``, ``stream_error`` and ``stream_refusal`` are ModelStreamInfer's answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.dispatch.ticket import InferResult
from triton_mp.frontend.grpc.wire import infer_response_bytes as _response_bytes
from triton_mp.frontend.request import (
    TENSOR_CONTENTS,
    InferenceRequest,
    InputTensor,
    Parameter,
    ParameterType,
    RequestedOutput,
)
from triton_mp.ipc import TensorRef

FINAL_PARAMETER = "triton_final_response"
"""Stream response parameter: true on the last response of a request (Triton sets it on
every stream response)."""

_NO_PARAMETERS: Mapping[str, Parameter] = {}


def parameter_from_proto(p: pb.InferParameter) -> Parameter:
    """One ``InferParameter`` with the type it was sent as."""
    which = p.WhichOneof("parameter_choice")
    if which is None:
        return Parameter(None)
    return Parameter(ParameterType(which), getattr(p, which))


def parameters_from_proto(params: Any) -> Mapping[str, Parameter]:
    """A ``map<string, InferParameter>`` as a dict (in the map's iteration order)."""
    if not params:
        return _NO_PARAMETERS
    return {key: parameter_from_proto(p) for key, p in params.items()}


_NO_ELEMENTS: Mapping[str, Sequence[object]] = {"bytes_contents": ()}
"""An input's ``contents`` sent without elements: one empty field, so the input still
counts as sending typed contents (Triton reads ``has_contents()``: refused beside
``raw_input_contents`` or shared memory, else zero bytes of data)."""


def _contents(t: pb.ModelInferRequest.InferInputTensor) -> Mapping[str, Sequence[object]]:
    """The typed-content fields of an input that hold elements (``_NO_ELEMENTS`` for a
    ``contents`` message with none; empty without one)."""
    if not t.HasField("contents"):
        return {}
    c = t.contents
    return {f: values for f in TENSOR_CONTENTS if len(values := getattr(c, f))} or _NO_ELEMENTS


def request_from_proto(
    message: pb.ModelInferRequest, raw: Sequence[bytes | memoryview] | None = None
) -> InferenceRequest:
    """A ``ModelInferRequest`` as the core's ``InferenceRequest``.

    Args:
        message: the request.
        raw: its ``raw_input_contents`` when the transport split them off (views into the
            received message); None to take the message's own.
    """
    return InferenceRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        parameters=parameters_from_proto(message.parameters),
        inputs=tuple(
            InputTensor(
                t.name,
                t.datatype,
                tuple(t.shape),
                parameters_from_proto(t.parameters),
                _contents(t),
            )
            for t in message.inputs
        ),
        outputs=tuple(
            RequestedOutput(o.name, parameters_from_proto(o.parameters)) for o in message.outputs
        ),
        raw_inputs=message.raw_input_contents if raw is None else raw,
    )


class HeadSource(Protocol):
    """What a response head holds (an ``InferResult``, or ``Answered``)."""

    @property
    def model(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def request_id(self) -> str: ...
    @property
    def parameters_json(self) -> str: ...
    @property
    def outputs(self) -> tuple[TensorRef, ...]: ...


class Answered(NamedTuple):
    """A response head's parts, taken from an answer without an ``InferResult``."""

    model: str
    version: int
    request_id: str
    parameters_json: str
    outputs: tuple[TensorRef, ...]


def response_head(result: HeadSource) -> pb.ModelInferResponse:
    """An answer's ModelInferResponse without ``raw_output_contents``."""
    resp = pb.ModelInferResponse(
        model_name=result.model, model_version=str(result.version), id=result.request_id
    )
    if result.parameters_json:
        for key, value in json.loads(result.parameters_json).items():
            param = resp.parameters[key]
            if isinstance(value, bool):
                param.bool_param = value
            elif isinstance(value, int):
                param.int64_param = value
            else:
                param.string_param = str(value)
    for ref in result.outputs:
        out = resp.outputs.add()
        out.name = ref.name
        out.datatype = ref.datatype
        out.shape.extend(ref.shape)
    return resp


def infer_response(result: InferResult) -> pb.ModelInferResponse:
    """The proto of an answer; releases the answer's output block."""
    try:
        resp = response_head(result)
        # NOTE: an output in the client's shared memory gets an empty entry (Triton).
        resp.raw_output_contents.extend(result.data(ref) for ref in result.outputs)
    finally:
        result.release()
    return resp


class ResponseHeads:
    """Serialized response heads (``response_head`` without the tensor bytes), by what they
    hold: model, version, request id, parameters and each output's name, datatype and
    shape. A client sending the same requests gets the same heads, built once. At most
    ``capacity`` (cleared whole when full)."""

    def __init__(self, capacity: int = 512) -> None:
        self._heads: dict[tuple[object, ...], bytes] = {}
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._heads)

    def get(self, result: HeadSource) -> bytes:
        """``response_head(result)``, serialized."""
        return self.head(
            result.model, result.version, result.request_id, result.parameters_json, result.outputs
        )

    def head(
        self,
        model: str,
        version: int,
        request_id: str,
        parameters_json: str,
        outputs: tuple[TensorRef, ...],
    ) -> bytes:
        """``get`` from the parts of an answer (``Answered``'s fields)."""
        key = (
            model,
            version,
            request_id,
            parameters_json,
            *[(r.name, r.datatype, r.shape) for r in outputs],
        )
        head = self._heads.get(key)
        if head is None:
            parts = Answered(model, version, request_id, parameters_json, outputs)
            head = response_head(parts).SerializeToString()
            if len(self._heads) >= self._capacity:
                self._heads.clear()
            self._heads[key] = head
        return head


def infer_response_bytes(result: InferResult, heads: ResponseHeads | None = None) -> bytes:
    """``infer_response`` serialized, each output copied once, straight from the arena;
    releases the answer's output block.

    Args:
        heads: serialized heads to reuse; None builds the head anew.
    """
    try:
        head = response_head(result) if heads is None else heads.get(result)
        # NOTE: views stay valid until release(), after the join copied them.
        return _response_bytes(head, [result.view(ref) for ref in result.outputs])
    finally:
        result.release()


def stream_response(result: InferResult, final: bool) -> pb.ModelStreamInferResponse:
    """A stream response with outputs; releases the answer's output block."""
    resp = infer_response(result)
    resp.parameters[FINAL_PARAMETER].bool_param = final
    return pb.ModelStreamInferResponse(infer_response=resp)


def stream_end(model: str, version: str, request_id: str) -> pb.ModelStreamInferResponse:
    """The empty response that ends a decoupled request (when the request asked for it).

    Args:
        model, version: the request's ``model_name`` and ``model_version`` as it sent them
            (server ``stream_infer_handler.cc`` StreamInferResponseComplete echoes the
            request's strings: "" when it named no version, not the version that ran).
        request_id: the request's ``id``.
    """
    resp = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    resp.parameters[FINAL_PARAMETER].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=resp)


def stream_error(
    message: str, model: str, version: str, request_id: str, final: bool = True
) -> pb.ModelStreamInferResponse:
    """A stream response carrying a model's error for one request (the stream goes on).

    Args:
        model, version: the request's ``model_name`` and ``model_version`` strings, as
            ``stream_end`` has them (StreamInferResponseComplete).
        final: ``triton_final_response``: whether it is the request's last response.
    """
    resp = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    resp.parameters[FINAL_PARAMETER].bool_param = final
    return pb.ModelStreamInferResponse(error_message=message, infer_response=resp)


def stream_refusal(message: str, request_id: str) -> pb.ModelStreamInferResponse:
    """A stream response refusing a request before it ran (its checks failed): the error
    and the request's ``id`` alone, no model, version or ``triton_final_response``
    (server ``stream_infer_handler.cc`` Process clears the response and sets the id)."""
    return pb.ModelStreamInferResponse(
        error_message=message, infer_response=pb.ModelInferResponse(id=request_id)
    )
