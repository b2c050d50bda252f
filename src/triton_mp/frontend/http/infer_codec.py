"""KServe v2 HTTP inference bodies <-> the transport-free ``InferenceRequest`` the core takes.

Imported by the frontend's HTTP routes (``frontend.http.routes``); no aiohttp and no sockets
here, so every rule is testable on bytes. ``parse_infer_body`` turns a request body (JSON header,
then the binary tensor tail Triton's ``Inference-Header-Content-Length`` delimits; or a raw
binary request) into an ``InferenceRequest`` whose raw bytes are slices of the body (JSON
``data`` is packed with numpy); ``render_infer_response`` writes the answer as JSON ``data``
or a binary tail per ``binary_data`` / ``binary_data_output``. Messages and rules follow
Triton's ``http_server.cc`` and core ``infer_request.cc`` (shared/reference/triton.md §2);
JSON values and tensor ``data`` are ``frontend.http.json_tensors``'.
"""

from __future__ import annotations

import dataclasses
import re
import struct
import zlib
from typing import Any

import msgspec

from triton_mp.common.datatypes import ELEMENT_BYTES
from triton_mp.common.errors import InvalidRequest
from triton_mp.frontend.dispatch.ticket import InferResult
from triton_mp.frontend.http.json_tensors import (
    INT64_MAX,
    access_error,
    decode_json,
    is_uint,
    json_output_data,
    json_string,
    json_tensor_bytes,
    json_uint,
)
from triton_mp.frontend.model_table import Model
from triton_mp.frontend.request import (
    InferenceRequest,
    InputTensor,
    Parameter,
    ParameterType,
    RequestedOutput,
    bool_parameter,
    int64_parameter,
    string_parameter,
    uint64_parameter,
)

MAX_INPUT_BYTES = 64 << 20
"""Largest request body, compressed or not, in bytes (``--http-max-input-size`` default)."""

HEADER_LENGTH = "Inference-Header-Content-Length"
"""Binary tensor extension: bytes of the JSON header at the start of the body."""

JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
_U32 = struct.Struct("<I")


# ------------------------------------------------------------------ request translation


class InferPlan(msgspec.Struct):
    """How to answer one HTTP inference: binary or JSON per output."""

    binary_default: bool = False
    """``binary_data_output``: the form of outputs the request did not list."""
    binary: dict[str, bool] = {}
    """Listed outputs (not in shared memory): True for a binary tail, False for JSON."""


def _request_parameters(params: dict[str, Any], plan: InferPlan) -> dict[str, Parameter]:
    """The request-level ``parameters`` in their protocol types (ParseJsonTritonParams)."""
    out: dict[str, Parameter] = {}
    for key, v in params.items():
        if key == "sequence_id":
            if is_uint(v):
                # NOTE: the gRPC form carries a uint64 correlation ID as int64_param (the
                # frontend reads it back as unsigned); uint64_param is refused there.
                out[key] = int64_parameter(v - (1 << 64) if v > INT64_MAX else v)
            elif isinstance(v, str):
                out[key] = string_parameter(v)
            else:
                raise access_error("Unable to parse 'sequence_id'", "string")
        elif key in ("sequence_start", "sequence_end"):
            if not isinstance(v, bool):
                raise access_error(f"Unable to parse '{key}'", "bool")
            out[key] = bool_parameter(v)
        elif key in ("priority", "timeout"):
            if not is_uint(v):
                raise access_error(f"Unable to parse '{key}'", "uint")
            # NOTE: timeout travels as the gRPC form's int64_param (a uint64 past INT64_MAX
            # is a timeout that never comes, as 0 is).
            out[key] = (
                uint64_parameter(v)
                if key == "priority"
                else int64_parameter(v if v <= INT64_MAX else 0)
            )
        elif key == "binary_data_output":
            if not isinstance(v, bool):
                raise access_error("Unable to parse 'binary_data_output'", "bool")
            plan.binary_default = v
        elif key.startswith("triton_"):
            raise InvalidRequest(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                "should not be specified."
            )
        elif isinstance(v, bool):
            out[key] = bool_parameter(v)
        elif isinstance(v, str):
            out[key] = string_parameter(v)
        elif isinstance(v, int) and -(2**63) <= v <= INT64_MAX:
            out[key] = int64_parameter(v)
        elif isinstance(v, int | float):
            # NOTE: TritonJson's IsNumber: a fraction, or an integer past int64, is a double.
            out[key] = Parameter(ParameterType.DOUBLE, float(v))
        else:
            raise InvalidRequest(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                "'string'."
            )
    return out


def _shm_parameters(params: dict[str, Any]) -> dict[str, Parameter]:
    """The shared_memory_* tensor parameters (CheckSharedMemoryData's types; Triton reads
    them for every tensor not in the binary tail, whether it names a region or not).

    Raises:
        TritonMPError: INTERNAL "Unable to parse '<key>': <TritonJson's words>" for a region
            that is no string, an offset or size that is no unsigned integer.
        InvalidRequest: an offset or size past int64.
    """
    out: dict[str, Parameter] = {}
    if "shared_memory_region" in params:
        region = params["shared_memory_region"]
        if not isinstance(region, str):
            raise access_error("Unable to parse 'shared_memory_region'", "string")
        out["shared_memory_region"] = string_parameter(region)
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key in params:
            if not is_uint(params[key]):
                raise access_error(f"Unable to parse '{key}'", "uint")
            if params[key] > INT64_MAX:
                raise InvalidRequest(f"Unable to parse '{key}'")
            out[key] = int64_parameter(params[key])
    if "shared_memory_region" in out and "shared_memory_byte_size" not in out:
        # NOTE: Triton's HTTP parse leaves the size at 0; the region is checked first.
        out["shared_memory_byte_size"] = int64_parameter(0)
    return out


def _input_content_error(has_data: bool, has_binary: bool, has_shm: bool) -> str | None:
    """Triton's ValidateInputContentType message, or None when exactly one source is set."""
    if has_data + has_binary + has_shm == 1:
        return None
    head = (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But"
    )
    if not (has_data or has_binary or has_shm):
        return head + " no field is set"
    names = [
        n
        for n, on in (
            ("'data'", has_data),
            ("'binary_data_size'", has_binary),
            ("'shared_memory_region'", has_shm),
        )
        if on
    ]
    return head + " set " + " ".join(names)


def _inputs(
    items: object, tail: memoryview, model: str
) -> tuple[list[InputTensor], list[bytes | memoryview]]:
    """The JSON ``inputs`` array as tensors, and the bytes of each that carries them
    (slices of ``tail`` for binary inputs, packed JSON ``data`` otherwise)."""
    if items is None:
        raise access_error("Unable to parse 'inputs'", "missing", "inputs")
    if not isinstance(items, list):
        raise access_error("Unable to parse 'inputs'", "array")
    inputs: list[InputTensor] = []
    raw: list[bytes | memoryview] = []
    pos = 0
    for item in items:
        # NOTE: TritonJson finds no member in a value that is not an object: an input that
        # is no object sets no field, parameters that are no object set none.
        item = _members(item)
        params = _members(item.get("parameters"))
        has_binary = "binary_data_size" in params
        has_shm = "shared_memory_region" in params
        message = _input_content_error("data" in item, has_binary, has_shm)
        if message is not None:
            raise InvalidRequest(message)
        name = json_string(item, "name")
        datatype = json_string(item, "datatype")
        if "shape" not in item:
            raise access_error("Unable to parse 'shape'", "missing", "shape")
        shape = item["shape"]
        if not isinstance(shape, list):
            raise access_error("Unable to parse 'shape'", "array")
        if not all(is_uint(d) for d in shape):
            raise access_error("Unable to parse 'shape'", "uint")
        huge = any(d > INT64_MAX for d in shape)
        tensor_params: dict[str, Parameter] = {}
        if has_binary or huge and _wrapped_count(shape) >= 0:
            if huge:
                raise InvalidRequest("Unable to parse 'shape'")
            size = json_uint(params, "binary_data_size")
            if pos + size > len(tail):
                raise InvalidRequest(
                    f"unexpected size for input '{name}', expecting {pos + size - len(tail)} "
                    f"additional bytes for model '{model}'"
                )
            raw.append(tail[pos : pos + size])
            pos += size
        elif has_shm:
            tensor_params = _shm_parameters(params)
        else:
            _shm_parameters(params)
            # NOTE: Triton counts elements in int64: a count that wraps below 0 is a shape
            # no 'data' matches (json_tensor_bytes says so in Triton's words).
            count = _wrapped_count(shape)
            raw.append(json_tensor_bytes(name, datatype, item["data"], count) if count else b"")
        inputs.append(InputTensor(name, datatype, tuple(shape), tensor_params))
    if pos != len(tail):
        raise InvalidRequest(f"unexpected additional input data for model '{model}'")
    return inputs, raw


def _members(value: object) -> dict[str, Any]:
    """A JSON value as TritonJson's ``Find`` sees it: an object's members, none otherwise."""
    return value if isinstance(value, dict) else {}


def _wrapped_count(shape: list[int]) -> int:
    """The element count of ``shape`` (uint64 dims) as Triton's ``GetElementCount``
    computes it in int64: wrapping, so a huge shape may count below 0 (or 0)."""
    count = 1
    for d in shape:
        count = count * d % (1 << 64)
    return count - (1 << 64) if count > INT64_MAX else count


def _outputs(items: object, plan: InferPlan) -> list[RequestedOutput]:
    """The JSON ``outputs`` array as requested outputs; records each one's form in
    ``plan``. Checked in http_server.cc's order: ValidateOutputParameter, ``name``,
    CheckClassificationOutput, CheckSharedMemoryData, CheckBinaryOutputData."""
    if not isinstance(items, list):
        raise access_error("Unable to parse 'outputs'", "array")
    outputs: list[RequestedOutput] = []
    for item in map(_members, items):
        params = _members(item.get("parameters"))
        if "shared_memory_region" in params:
            if "classification" in params:
                raise InvalidRequest(
                    "Output can't set both 'shared_memory_region' and 'classification'"
                )
            if "binary_data" in params and not isinstance(params["binary_data"], bool):
                raise access_error("Unable to set 'binary_data'", "bool")
            if params.get("binary_data"):
                raise InvalidRequest(
                    "Output can't set both 'shared_memory_region' and 'binary_data'"
                )
        name = json_string(item, "name")
        out_params: dict[str, Parameter] = {}
        if "classification" in params:
            classes = params["classification"]
            if not is_uint(classes):
                raise access_error("Unable to set 'classification'", "uint")
            if classes > INT64_MAX:
                raise InvalidRequest("Unable to set 'classification'")
            if classes > 0:
                # NOTE: Triton's HTTP frontend takes 0 classes as no classification
                out_params["classification"] = int64_parameter(classes)
        shm = _shm_parameters(params)
        if "shared_memory_region" in params:
            out_params.update(shm)
        else:
            binary = params.get("binary_data", False)
            if not isinstance(binary, bool):
                raise access_error("Unable to parse 'binary_data'", "bool")
            plan.binary[name] = binary
        outputs.append(RequestedOutput(name, out_params))
    return outputs


def build_infer_request(
    header: object, tail: memoryview, model: str, version: str
) -> tuple[InferenceRequest, InferPlan]:
    """Translate a KServe v2 JSON inference request (and its binary tail) into the request
    the core validates.

    Args:
        header: the decoded JSON inference header.
        tail: the body after the header (binary tensors, in input order).
        model: the model name from the URL.
        version: the version from the URL ("" for none).

    Returns:
        The request, whose ``raw_inputs`` hold one entry per input that is neither in
        shared memory (slices of ``tail``, or packed JSON data; empty bytes for an empty
        tensor), and how to render each output.

    Raises:
        InvalidRequest: malformed JSON fields with Triton's messages (``Unable to parse
            '<field>'``, ValidateInputContentType, ValidateOutputParameter, reserved
            ``triton_`` parameters), a binary tail shorter or longer than the
            ``binary_data_size`` values add up to.
    """
    if not isinstance(header, dict):
        header = {}  # NOTE: TritonJson finds no member in a non-object: "inputs" is missing
    plan = InferPlan()
    request_id = json_string(header, "id") if "id" in header else ""
    parameters: dict[str, Parameter] = {}
    if "parameters" in header:
        params = header["parameters"]
        if not isinstance(params, dict):
            raise access_error("failed to get request params.", "object")
        parameters = _request_parameters(params, plan)
    inputs, raw = _inputs(header.get("inputs"), tail, model)
    outputs = _outputs(header["outputs"], plan) if "outputs" in header else []
    request = InferenceRequest(
        model_name=model,
        model_version=version,
        id=request_id,
        parameters=parameters,
        inputs=inputs,
        outputs=outputs,
        raw_inputs=raw,
    )
    return request, plan


RAW_INPUT_NAME = "raw_input"
"""The name Triton's HTTP frontend adds a raw binary request's input by
(``EVBufferToRawInput``): core's later input checks print it."""


def build_raw_request(model: Model, version: str, body: bytes) -> InferenceRequest:
    """Triton's raw binary request (``Inference-Header-Content-Length: 0``): the whole body
    is the model's only input, batch 1 when the model batches, every output binary.

    Returns:
        The request with its one input and no bytes yet (``parse_infer_body`` adds them).

    Raises:
        InvalidRequest: the model has more than one input, more than one variable-size
            dimension, or a BYTES input whose shape is not [1] (core Normalize's messages).
    """
    rid = "[request id: <id_unknown>] "
    if len(model.inputs) != 1:
        raise InvalidRequest(
            f"{rid}Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(model.inputs)} inputs in '{model.name}' model configuration"
        )
    spec = next(iter(model.inputs.values()))
    shape = [1] if model.max_batch_size > 0 else []
    dynamic = -1
    fixed = 1
    for d in spec.dims:
        if d == -1:
            if dynamic != -1:
                raise InvalidRequest(
                    f"{rid}The shape of the raw input '{spec.name}' can not be deduced because "
                    "there are more than one variable-sized dimension"
                )
            dynamic = len(shape)
        else:
            fixed *= d
        shape.append(d)
    if spec.datatype == "BYTES":
        if dynamic != -1 or fixed != 1:
            raise InvalidRequest(
                f"{rid}For BYTE datatype raw input '{spec.name}', the model must have input "
                "shape [1]"
            )
    elif dynamic != -1:
        size = fixed * ELEMENT_BYTES.get(spec.datatype, 1)
        shape[dynamic] = len(body) // size if size else 0
    return InferenceRequest(
        model_name=model.name,
        model_version=version,
        inputs=(InputTensor(spec.name, spec.datatype, tuple(shape)),),
        raw_name=RAW_INPUT_NAME,
    )


# ------------------------------------------------------------------------- compression


def response_encoding(accept: str) -> str:
    """The encoding an ``Accept-Encoding`` header asks for: the highest-weighted of
    ``gzip``, ``deflate`` and ``identity`` (Triton's CompressionTypeUsed)."""
    best, weight = "identity", 0.0
    for part in accept.split(","):
        kind, _, q = part.strip().partition(";q=")
        if not kind:
            continue
        try:
            w = float(q) if q else 1.0
        except ValueError:
            continue
        if kind in ("identity", "deflate", "gzip") and w > weight:
            best, weight = kind, w
    return best


def compress(encoding: str, body: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    return c.compress(body) + c.flush()


_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT32 = (-(2**31), 2**31 - 1)


def header_length_value(text: str) -> int:
    """``Inference-Header-Content-Length`` read as Triton reads it (``std::stoi``): leading
    whitespace, a sign and digits, whatever follows ignored ("16abc" is 16).

    Raises:
        InvalidRequest: no number there, or one outside int32 (Triton's words).
    """
    match = _STOI.match(text)
    if match is None:
        raise InvalidRequest(f"Unable to parse {HEADER_LENGTH}, got: {text}")
    value = int(match.group(1))
    if not _INT32[0] <= value <= _INT32[1]:
        raise InvalidRequest(
            f"Unable to parse {HEADER_LENGTH}, value is out of range [ {_INT32[0]}, "
            f"{_INT32[1]} ], got: {text}"
        )
    return value


def header_size(body_bytes: int, header_length: str | None) -> int:
    """The byte size of an inference body's JSON header.

    Args:
        body_bytes: the (decompressed) body's byte size.
        header_length: the ``Inference-Header-Content-Length`` header, None when absent
            (then the whole body is the JSON header); "0" makes a raw binary request.

    Raises:
        InvalidRequest: a malformed header length, or one outside [0, ``body_bytes``].
    """
    if header_length is None:
        return body_bytes
    header_len = header_length_value(header_length)
    if header_len < 0 or header_len > body_bytes:
        raise InvalidRequest(
            f"inference header size should be in range (0, {body_bytes}), got: {header_length}"
        )
    return header_len


def parse_infer_body(
    model: Model, version: str, body: bytes, header_len: int
) -> tuple[InferenceRequest, InferPlan]:
    """A (decompressed) inference request body as the request the core validates.

    Args:
        model: the model the URL names (resolved).
        version: the version the URL names ("" for none).
        body: the whole request body.
        header_len: its JSON header's byte size (``header_size``): 0 makes a raw binary
            request.

    Returns:
        The request (with the raw bytes of each input that carries them) and the output
        plan.

    Raises:
        InvalidRequest: malformed JSON or tensor (see ``build_infer_request``,
            ``build_raw_request``).
    """
    if header_len == 0:
        req = build_raw_request(model, version, body)
        data = body
        if model.inputs[req.inputs[0].name].datatype == "BYTES":
            data = _U32.pack(len(body)) + body
        return dataclasses.replace(req, raw_inputs=[data]), InferPlan(binary_default=True)
    view = memoryview(body)
    header = decode_json(view[:header_len])
    return build_infer_request(header, view[header_len:], model.name, version)


def render_infer_response(
    result: InferResult, plan: InferPlan, accept_encoding: str | None
) -> tuple[bytes, dict[str, str]]:
    """The inference response body and its headers: the JSON header, then the binary
    outputs in output order (``Inference-Header-Content-Length`` says where the JSON ends),
    compressed when ``Accept-Encoding`` asks for gzip or deflate.

    Raises:
        InvalidRequest: an FP16/BF16 output asked for as JSON.
        TritonMPError: INTERNAL when an output's bytes do not match its shape.
    """
    outputs = []
    tail: list[memoryview] = []
    try:
        for ref in result.outputs:
            out: dict[str, Any] = {"name": ref.name, "datatype": ref.datatype, "shape": ref.shape}
            view = result.view(ref)
            if view is not None:
                if plan.binary.get(ref.name, plan.binary_default):
                    out["parameters"] = {"binary_data_size": ref.nbytes}
                    if ref.nbytes:
                        tail.append(view)
                    else:
                        view.release()
                else:
                    try:
                        out["data"] = json_output_data(ref.name, ref.datatype, ref.shape, view)
                    finally:
                        view.release()
            outputs.append(out)
        doc: dict[str, Any] = {}
        if result.request_id:
            doc["id"] = result.request_id
        doc["model_name"] = result.model
        doc["model_version"] = str(result.version)
        if result.parameters_json:
            # NOTE: after model_version, before outputs, as Triton's FinalizeResponse writes.
            doc["parameters"] = msgspec.Raw(result.parameters_json.encode())
        doc["outputs"] = outputs
        header = msgspec.json.encode(doc)
        body = b"".join([header, *tail]) if tail else header
    finally:
        for v in tail:
            v.release()
    headers = {"Content-Type": BINARY_TYPE if tail else JSON_TYPE}
    if tail:
        headers[HEADER_LENGTH] = str(len(header))
    if accept_encoding:
        encoding = response_encoding(accept_encoding)
        if encoding != "identity":
            body = compress(encoding, body)
            headers["Content-Encoding"] = encoding
    return body, headers
