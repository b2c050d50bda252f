"""ModelInferRequest validation and tensor bytes in and out of shared memory.

Imported by the frontend only. ``validate_request`` applies Triton's request rules (core
``infer_request.cc`` Normalize, server ``infer_handler.cc``; triton.md §1.2, §4.3, §4.9)
and returns where each input's bytes are; ``write_inputs`` copies them into one block of
the frontend's input arena (the single host copy of the request path); ``read_outputs``
copies a worker's output block into the gRPC response (the single copy of the reply path).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.common.datatypes import (
    ELEMENT_BYTES,
    NUMPY_DTYPES,
    bytes_tensor_elements,
    element_count,
)
from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.models import Model
from triton_mp.frontend.shm import SystemShmRegistry
from triton_mp.ipc import ArenaAllocator, BlockRef, TensorRef
from triton_mp.ipc.messages import OutputRegion, SequenceFlags
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, align

_TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""Datatype -> the InferTensorContents field that carries it (FP16/BF16: raw only)."""

_RESERVED_PARAMS = {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout"}


@dataclass(frozen=True, slots=True)
class ValidInput:
    """One validated input: its name, datatype, full shape and bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes | memoryview
    window: ShmWindow | None = None
    """Set when the bytes are in a client's registered shared memory (``data`` is empty)."""


@dataclass(frozen=True, slots=True)
class ShmWindow:
    """The part of a client's shared-memory object a tensor names (absolute offsets)."""

    name: str
    key: str
    region_id: int
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class ValidRequest:
    """A request that passed validation (nothing written to shared memory yet)."""

    model: Model
    version: int
    batch_size: int
    inputs: tuple[ValidInput, ...]
    outputs: tuple[str, ...]
    priority: int
    timeout_us: int
    output_regions: tuple[OutputRegion | None, ...] = ()
    parameters_json: str = "{}"
    """Custom (non-reserved) request parameters, as JSON, for backends."""
    sequence_id: int | str = 0
    """``sequence_id``: the correlation ID (0 / "" = none)."""
    sequence_flags: int = 0
    """``SequenceFlags`` bits from ``sequence_start`` / ``sequence_end``."""


def _fmt_shape(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _dims_match(dims: Sequence[int], shape: Sequence[int]) -> bool:
    return len(dims) == len(shape) and all(
        d == -1 or d == s for d, s in zip(dims, shape, strict=True)
    )


def _int_param(p: pb.InferParameter, key: str, rid: str) -> int:
    which = p.WhichOneof("parameter_choice")
    if which == "int64_param" and p.int64_param >= 0:
        return int(p.int64_param)
    if which == "uint64_param":
        return int(p.uint64_param)
    raise InvalidRequest(
        f"{rid}invalid value for '{key}' parameter: expected a non-negative integer"
    )


def _sequence_id(p: pb.InferParameter, rid: str) -> int | str:
    """``sequence_id``: ``int64_param`` (read as unsigned) or ``string_param`` (Triton's gRPC
    frontend; ``uint64_param`` is refused there)."""
    which = p.WhichOneof("parameter_choice")
    if which == "int64_param":
        return int(p.int64_param) & 0xFFFFFFFFFFFFFFFF
    if which == "string_param":
        return str(p.string_param)
    raise InvalidRequest(
        f"{rid}invalid value type for 'sequence_id' parameter, expected int64_param or "
        "string_param."
    )


def _bool_param(p: pb.InferParameter, key: str, rid: str) -> bool:
    if p.WhichOneof("parameter_choice") != "bool_param":
        raise InvalidRequest(f"{rid}invalid value type for '{key}' parameter, expected bool_param.")
    return bool(p.bool_param)


def _uses_shm(params: Mapping[str, pb.InferParameter]) -> bool:
    return "shared_memory_region" in params


def _shm_window(
    shm: SystemShmRegistry | None,
    params: Mapping[str, pb.InferParameter],
    what: str,
    rid: str,
) -> ShmWindow:
    """Resolve a tensor's shared_memory_* parameters against the registered regions."""
    name = params["shared_memory_region"].string_param
    if "shared_memory_byte_size" not in params:
        raise InvalidRequest(
            f"{rid}'shared_memory_byte_size' parameter is required for {what} using shared "
            f"memory region '{name}'"
        )
    byte_size = _int_param(params["shared_memory_byte_size"], "shared_memory_byte_size", rid)
    offset = 0
    if "shared_memory_offset" in params:
        offset = _int_param(params["shared_memory_offset"], "shared_memory_offset", rid)
    if shm is None:
        raise TritonMPError(f"Unable to find shared memory region: '{name}'", ErrorCode.NOT_FOUND)
    region = shm.window(name, offset, byte_size)
    return ShmWindow(name, region.key, region.region_id, region.offset + offset, byte_size)


def _typed_contents(
    t: pb.ModelInferRequest.InferInputTensor, datatype: str, model: str, count: int
) -> bytes:
    field = _TYPED_FIELD.get(datatype)
    if field is None:
        raise InvalidRequest(
            f"unable to find data for input tensor '{t.name}' for model '{model}' in request: "
            f"{datatype} data can only be sent in raw_input_contents"
        )
    for other in set(_TYPED_FIELD.values()) - {field}:
        if len(getattr(t.contents, other)):
            raise InvalidRequest(
                f"unexpected explicit tensor data for input tensor '{t.name}' for model "
                f"'{model}' of type '{other.removesuffix('_contents')}', expected datatype "
                f"'{datatype}'"
            )
    values = getattr(t.contents, field)
    if len(values) != count:
        raise InvalidRequest(
            f"unexpected number of elements in explicit tensor data for input '{t.name}' "
            f"for model '{model}'. Expected {count}, got {len(values)}"
        )
    if datatype == "BYTES":
        return b"".join(len(v).to_bytes(4, "little") + v for v in values)
    return np.asarray(values, dtype=NUMPY_DTYPES[datatype]).tobytes()


def validate_request(
    req: pb.ModelInferRequest,
    model: Model,
    version: int,
    shm: SystemShmRegistry | None = None,
    raw_inputs: Sequence[bytes | memoryview] | None = None,
) -> ValidRequest:
    """Check a request against the model's effective config.

    Args:
        raw_inputs: used instead of ``req.raw_input_contents`` when given (HTTP passes
            slices of the request body, so the bytes are not copied into the proto first).

    Returns:
        The validated request: inputs with full shapes and their bytes (raw bytes as sent,
        typed contents converted to raw little-endian form).

    Raises:
        InvalidRequest (INVALID_ARGUMENT) with Triton's message for: unknown input or
        output, missing required input, wrong datatype, wrong shape, batch over
        max_batch_size, batch mismatch between inputs, wrong byte size, missing data, typed
        contents together with raw_input_contents, shared-memory parameters for an
        unregistered region or a window outside it, reserved or malformed parameters.
        TritonMPError (UNSUPPORTED) when client shared memory is disabled.
    """
    name = model.name
    rid = f"[request id: {req.id or '<id_unknown>'}] "
    mbs = model.max_batch_size

    priority = timeout_us = 0
    sequence_id: int | str = 0
    sequence_flags = 0
    custom: dict[str, bool | int | float | str] = {}
    for key, p in req.parameters.items():
        if key == "sequence_id":
            sequence_id = _sequence_id(p, rid)
        elif key == "sequence_start":
            sequence_flags |= SequenceFlags.START if _bool_param(p, key, rid) else 0
        elif key == "sequence_end":
            sequence_flags |= SequenceFlags.END if _bool_param(p, key, rid) else 0
        elif key == "priority":
            priority = _int_param(p, key, rid)
        elif key == "timeout":
            timeout_us = _int_param(p, key, rid)
        elif key.startswith("triton_") and key != "triton_enable_empty_final_response":
            raise InvalidRequest(
                f"{rid}parameter keys starting with 'triton_' are reserved: '{key}'"
            )
        elif key not in _RESERVED_PARAMS:
            kind = p.WhichOneof("parameter_choice")
            if kind == "uint64_param":
                raise InvalidRequest(f"{rid}unsupported type uint64 for parameter '{key}'")
            if kind is not None and not key.startswith("triton_"):
                custom[key] = getattr(p, kind)

    seen: set[str] = set()
    for t in req.inputs:
        if t.name not in model.inputs:
            raise InvalidRequest(f"unexpected inference input '{t.name}' for model '{name}'")
        if t.name in seen:
            raise InvalidRequest(
                f"{rid}input '{t.name}' is specified more than once for model '{name}'"
            )
        seen.add(t.name)
    required = [n for n, s in model.inputs.items() if not s.optional]
    missing = [n for n in required if n not in seen]
    if missing:
        got = ",".join(f"'{t.name}'" for t in req.inputs)
        miss = ",".join(f"'{n}'" for n in missing)
        if len(required) == len(model.inputs):
            head = f"expected {len(model.inputs)} inputs but got {len(req.inputs)} inputs"
        else:
            head = (
                f"expected number of inputs between {len(required)} and {len(model.inputs)} "
                f"but got {len(req.inputs)} inputs"
            )
        raise InvalidRequest(
            f"{rid}{head} for model '{name}'. Got input(s) [{got}], but missing required "
            f"input(s) [{miss}]. Please provide all required input(s)."
        )

    raw = req.raw_input_contents if raw_inputs is None else raw_inputs
    uses_shm = [_uses_shm(t.parameters) for t in req.inputs]
    # NOTE: raw_input_contents holds one entry per input that sends its bytes in the request
    # (neither typed contents nor shared memory), in input order.
    raw_takers = sum(1 for t, shm in zip(req.inputs, uses_shm, strict=True) if not shm)
    # NOTE: Triton ignores surplus entries; too few is an error.
    if raw and len(raw) < raw_takers:
        raise InvalidRequest(
            f"{rid}expected {raw_takers} entries in raw_input_contents for model '{name}', "
            f"got {len(raw)}"
        )
    raw_index = 0

    batch_size = -1  # NOTE: unset; 0 is a real (invalid) batch size
    inputs = []
    for i, t in enumerate(req.inputs):
        spec = model.inputs[t.name]
        if t.datatype != spec.datatype:
            raise InvalidRequest(
                f"{rid}inference input '{t.name}' data-type is '{t.datatype}', but model "
                f"'{name}' expects '{spec.datatype}'"
            )
        shape = tuple(int(d) for d in t.shape)
        if any(d < 0 for d in shape):
            raise InvalidRequest(
                f"{rid}All input dimensions should be specified for input '{t.name}' for "
                f"model '{name}', got {_fmt_shape(shape)}"
            )
        if mbs > 0:
            if not shape:
                raise InvalidRequest(
                    f"{rid}input '{t.name}' has no shape but model requires batch dimension "
                    f"for '{name}'"
                )
            if batch_size < 0:
                batch_size = shape[0]
            elif shape[0] != batch_size:
                raise InvalidRequest(
                    f"{rid}input '{t.name}' batch size does not match other inputs for '{name}'"
                )
            item_shape = shape[1:]
        else:
            item_shape = shape
        if not _dims_match(spec.dims, item_shape):
            expected = ([-1] if mbs > 0 else []) + list(spec.dims)
            note = (
                " NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
                "dimension to be prepended to each input shape. If you want to specify the full "
                "shape including the batch dim in your input dims config, try setting "
                "max_batch_size to zero. See the model configuration docs for more info on "
                "max_batch_size."
                if mbs > 0
                else ""
            )
            raise InvalidRequest(
                f"{rid}unexpected shape for input '{t.name}' for model '{name}'. Expected "
                f"{_fmt_shape(expected)}, got {_fmt_shape(shape)}.{note}"
            )
        count = element_count(shape)
        has_typed = t.HasField("contents") and t.contents.ByteSize() > 0
        if uses_shm[i]:
            if has_typed:
                raise InvalidRequest(
                    f"{rid}input '{t.name}' for model '{name}' has both shared memory and "
                    "explicit tensor contents"
                )
            window = _shm_window(shm, t.parameters, f"input '{t.name}'", rid)
            if spec.datatype != "BYTES":
                expected_bytes = count * ELEMENT_BYTES[spec.datatype]
                if window.byte_size != expected_bytes:
                    raise InvalidRequest(
                        f"{rid}input byte size mismatch for input '{t.name}' for model "
                        f"'{name}'. Expected {expected_bytes}, got {window.byte_size}"
                    )
            inputs.append(ValidInput(t.name, spec.datatype, shape, b"", window))
            continue
        if raw:
            if has_typed:
                raise InvalidRequest(
                    f"{rid}contents field must not be specified when using raw_input_contents "
                    f"for '{t.name}' for model '{name}'"
                )
            data: bytes | memoryview = raw[raw_index]
            raw_index += 1
        elif has_typed:
            data = _typed_contents(t, spec.datatype, name, count)
        elif count == 0:
            data = b""
        else:
            raise InvalidRequest(
                f"unable to find data for input tensor '{t.name}' for model '{name}' in request."
            )
        if spec.datatype == "BYTES":
            got_elems = bytes_tensor_elements(data)
            if got_elems != count:
                raise InvalidRequest(
                    f"{rid}input byte size mismatch for input '{t.name}' for model '{name}'. "
                    f"Expected {count} string elements, got "
                    f"{'malformed data' if got_elems is None else got_elems}"
                )
        else:
            expected_bytes = count * ELEMENT_BYTES[spec.datatype]
            if len(data) != expected_bytes:
                raise InvalidRequest(
                    f"{rid}input byte size mismatch for input '{t.name}' for model '{name}'. "
                    f"Expected {expected_bytes}, got {len(data)}"
                )
        inputs.append(ValidInput(t.name, spec.datatype, shape, data))

    if mbs > 0 and batch_size > mbs:
        raise InvalidRequest(f"{rid}inference request batch-size must be <= {mbs} for '{name}'")
    if mbs > 0 and batch_size == 0:
        raise InvalidRequest(f"{rid}inference request batch-size must be >= 1 for '{name}'")

    outputs: list[str] = []
    regions: list[OutputRegion | None] = []
    for o in req.outputs:
        if o.name in outputs:
            continue  # NOTE: Triton returns an output requested twice once
        if o.name not in model.outputs:
            raise InvalidRequest(f"unexpected inference output '{o.name}' for model '{name}'")
        if "classification" in o.parameters:
            if _uses_shm(o.parameters):
                raise InvalidRequest(
                    f"{rid}output '{o.name}' for model '{name}' cannot use both shared memory "
                    "and the classification extension"
                )
            raise TritonMPError(
                f"{rid}the classification extension is not supported yet (output '{o.name}')",
                ErrorCode.UNSUPPORTED,
            )
        if _uses_shm(o.parameters):
            w = _shm_window(shm, o.parameters, f"output '{o.name}'", rid)
            regions.append(OutputRegion(w.key, w.region_id, w.offset, w.byte_size, w.name))
        else:
            regions.append(None)
        outputs.append(o.name)
    if not outputs:
        outputs = list(model.outputs)
        regions = [None] * len(outputs)
    return ValidRequest(
        model=model,
        version=version,
        batch_size=max(batch_size, 1) if mbs > 0 else 1,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        priority=priority,
        timeout_us=timeout_us,
        output_regions=tuple(regions) if any(r is not None for r in regions) else (),
        parameters_json=json.dumps(custom) if custom else "{}",
        sequence_id=sequence_id,
        sequence_flags=sequence_flags,
    )


def write_inputs(
    arena: ArenaAllocator, req: ValidRequest
) -> tuple[BlockRef, tuple[TensorRef, ...]]:
    """Copy every input of ``req`` into one new block of the frontend's arena.

    Raises:
        ArenaExhausted (UNAVAILABLE): no room within the arena budget.
    """
    total = sum(align(len(i.data)) for i in req.inputs)
    seg, block = arena.alloc(total)
    mv = memoryview(seg.buf)
    pos = block + BLOCK_HEADER_BYTES
    refs = []
    for i in req.inputs:
        if i.window is not None:
            w = i.window
            refs.append(
                TensorRef(i.name, i.datatype, i.shape, w.key, w.offset, w.byte_size, w.region_id)
            )
            continue
        n = len(i.data)
        mv[pos : pos + n] = i.data
        refs.append(TensorRef(i.name, i.datatype, i.shape, seg.name, pos, n))
        pos += align(n)
    mv.release()
    return BlockRef(seg.name, block), tuple(refs)
