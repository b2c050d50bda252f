"""``inference.*`` protos <-> the frontend core's transport-free objects.

Imported by the gRPC adapter (``frontend.grpc.servicer``). ``request_from_proto`` turns a
``ModelInferRequest`` into the ``InferenceRequest`` the core validates, keeping each
parameter's protocol type and the raw tensor bytes as they arrived (views into the received
message when ``wire.split_infer_request`` parsed it); typed contents are kept by field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.request import (
    TENSOR_CONTENTS,
    InferenceRequest,
    InputTensor,
    Parameter,
    ParameterType,
    RequestedOutput,
)

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


def _contents(t: pb.ModelInferRequest.InferInputTensor) -> Mapping[str, Sequence[object]]:
    """The typed-content fields of an input that hold elements."""
    if not t.HasField("contents"):
        return {}
    c = t.contents
    return {f: values for f in TENSOR_CONTENTS if len(values := getattr(c, f))}


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
