"""What Triton's gRPC frontend checks in each tensor before the core sees the request.

Imported by ``frontend.validation``. Server ``grpc/infer_handler.cc`` InferGRPCToInput reads
each input in order: its ``shared_memory_*`` parameters (``shared_memory.shm_parameters``),
explicit ``contents`` together with shared memory, the window in its registered region
(``shared_memory.shm_window``: an unknown region, a window outside it), explicit
``contents`` together with ``raw_input_contents``, which typed
``contents`` field carries the elements against the request's datatype
(InferGRPCToInputHelper), else the next ``raw_input_contents`` entry, and with none left
"unable to find data" (even for a tensor of no elements); then every output's
``shared_memory_*`` and ``classification`` parameters and its window (InferAllocatorPayload).
All of it comes before the core's checks (names, datatypes, shapes). These
messages have no ``[request id: ...]`` prefix. HTTP requests never carry typed contents,
give every input outside shared memory a raw entry, and their shared-memory parameters are
always well formed, so for them this finds nothing.
"""

from __future__ import annotations

from triton_mp.common.datatypes import DataType
from triton_mp.common.errors import InvalidRequest
from triton_mp.frontend.request import (
    TENSOR_CONTENTS,
    InferenceRequest,
    InputTensor,
    ParameterType,
)
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.frontend.validation.shared_memory import shm_parameters, shm_window

_NARROW = {
    "int_contents": {"INT8": "INT8", "INT16": "INT16"},
    "uint_contents": {"UINT8": "UINT8", "UINT16": "UINT16"},
}
_FIELD_TYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}
"""A contents field -> the type Triton reads it as (int/uint fields: the narrow type when
the request's datatype is one, else 32 bits)."""


def contents_type(field: str, datatype: str) -> str:
    """The datatype Triton takes a typed contents field as, for a request ``datatype``."""
    return _NARROW.get(field, {}).get(datatype, _FIELD_TYPE[field])


def no_data_message(tensor: str, model: str) -> str:
    """Server ``infer_handler.cc`` InferGRPCToInput (2.51 and main): an input outside shared
    memory with neither typed contents nor a ``raw_input_contents`` entry left (INVALID_ARG,
    no request id)."""
    return f"unable to find data for input tensor '{tensor}' for model '{model}' in request."


def _check_contents(t: InputTensor, model: str) -> None:
    where = f"for input tensor '{t.name}' for model '{model}'"
    known = DataType.from_wire(t.datatype) is not DataType.INVALID
    datatype = t.datatype if known else "<invalid>"
    supplied = False
    for field in TENSOR_CONTENTS:
        if not len(t.contents.get(field, ())):
            continue
        if supplied:
            raise InvalidRequest(
                f"unexpected explicit tensor data {where}, binary data was already supplied."
            )
        got = contents_type(field, t.datatype)
        if got != datatype:
            raise InvalidRequest(
                f"unexpected explicit tensor data {where} of type '{got}', expected datatype "
                f"'{datatype}'"
            )
        supplied = True


def check_frontend_tensors(req: InferenceRequest, shm: SystemShmRegistry | None = None) -> None:
    """Each input's, then each output's, checks as the gRPC frontend makes them.

    Args:
        req: the request.
        shm: the frontend's registered regions, which a tensor's window is checked against
            (None: none is registered).

    Raises:
        InvalidRequest: malformed shared-memory parameters (``shm_parameters``); "unexpected
            'content' provided when using shared memory for input tensor '<i>' for model
            '<m>'"; "contents field must not be specified when using raw_input_contents for
            '<i>' for model '<m>'"; "unexpected explicit tensor data for input tensor '<i>'
            for model '<m>' of type '<T>', expected datatype '<D>'" or "..., binary data
            was already supplied."; ``no_data_message`` for the first input left without
            data (entries past the last input are ignored); a ``classification`` that is
            not a positive ``int64_param``, or one together with shared memory; a window
            outside its region.
        TritonMPError: as ``shm_window`` (NOT_FOUND for an unknown region, UNSUPPORTED
            with client shared memory off).
    """
    model = req.model_name
    raw_left = len(req.raw_inputs)
    for t in req.inputs:
        in_shm = bool(t.parameters) and shm_parameters(t.parameters, t.name) is not None
        if in_shm:
            if t.contents:
                raise InvalidRequest(
                    f"unexpected 'content' provided when using shared memory for input tensor "
                    f"'{t.name}' for model '{model}'"
                )
            shm_window(shm, t.parameters, t.name)
            continue
        if not t.contents:
            if not raw_left:
                raise InvalidRequest(no_data_message(t.name, model))
            raw_left -= 1
            continue
        if req.raw_inputs:
            raise InvalidRequest(
                f"contents field must not be specified when using raw_input_contents for "
                f"'{t.name}' for model '{model}'"
            )
        _check_contents(t, model)
    for o in req.outputs:
        if not o.parameters:
            continue
        in_shm = shm_parameters(o.parameters, o.name) is not None
        classification = o.parameters.get("classification")
        if classification is None:
            if in_shm:
                shm_window(shm, o.parameters, o.name)
            continue
        # NOTE: grpc_utils.cc ParseClassificationParams, then InferAllocatorPayload
        if classification.type is not ParameterType.INT64:
            raise InvalidRequest(
                "invalid value type for 'classification' parameter, expected int64_param"
            )
        if not isinstance(classification.value, int) or classification.value <= 0:
            raise InvalidRequest("invalid value for 'classification' parameter, expected >= 0")
        if in_shm:
            raise InvalidRequest(
                "output can't set both 'shared_memory_region' and 'classification'"
            )
