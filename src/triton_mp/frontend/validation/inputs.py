"""A request's inputs: names, datatypes, shapes, the batch size and where the bytes are.

Imported by ``frontend.validation``. ``check_repeated_inputs`` and ``check_input_names``
refuse repeated, unknown and missing inputs; ``read_inputs`` checks each input against the
model's config (datatype, shape, byte size) and finds its bytes: in ``raw_inputs``, in typed
contents (converted to the raw little-endian form here), or in a client's registered shared
memory. Messages follow core ``infer_request.cc`` (Normalize) and server
``infer_handler.cc``; the core's are built in ``common.input_checks``, which an ensemble's
steps are checked with too.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_mp.common.datatypes import ELEMENT_BYTES, DataType, element_count
from triton_mp.common.errors import InvalidRequest
from triton_mp.common.input_checks import (
    batch_mismatch_message,
    batch_too_big_message,
    byte_size_message,
    count_message,
    datatype_message,
    no_batch_dim_message,
    shape_problem,
    unknown_input_message,
)
from triton_mp.common.numpy_tensors import NUMPY_DTYPES
from triton_mp.common.unordered import iteration_order
from triton_mp.frontend.model_table import IOSpec, Model
from triton_mp.frontend.request import InferenceRequest, InputTensor
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.frontend.validation.frontend_tensors import no_data_message
from triton_mp.frontend.validation.shared_memory import ShmWindow, shm_window, uses_shm


class RefusedByBackend(InvalidRequest):
    """A refusal Triton's core lets through and its backend makes: 2.51 counts the request
    as failed (``fail``, ``nv_inference_request_failure`` reason BACKEND), so the frontend
    that refuses it tells the scheduler (``ipc.protocol.messages.RequestRefused``)."""


@dataclass(frozen=True, slots=True)
class ValidInput:
    """One validated input: its name, datatype, full shape and bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes | memoryview
    """The tensor's bytes in raw form (BYTES length-prefixed); empty with ``window``."""
    window: ShmWindow | None = None
    """Set when the bytes are in a client's registered shared memory (``data`` is empty)."""


def check_repeated_inputs(req: InferenceRequest, rid: str) -> None:
    """No input is named twice (core ``AddOriginalInput``, as the frontend adds each).

    Raises:
        InvalidRequest: "<rid>input '<name>' already exists in request".
    """
    seen: set[str] = set()
    for t in req.inputs:
        if t.name in seen:
            raise InvalidRequest(f"{rid}input '{t.name}' already exists in request")
        seen.add(t.name)


def check_input_names(req: InferenceRequest, model: Model, rid: str) -> None:
    """The number of inputs is the model's (core ``ValidateRequestInputs``);
    ``check_repeated_inputs`` ran first. An input the model lacks is refused by
    ``read_inputs``, where core Normalize's walks meet it (``Model::GetInput``).

    Raises:
        InvalidRequest: Triton's "expected N inputs but got M inputs ..." message.
    """
    required = [n for n, s in model.inputs.items() if not s.optional]
    if not len(required) <= len(req.inputs) <= len(model.inputs):
        raise InvalidRequest(
            count_message(
                rid, model.name, (t.name for t in req.inputs), required, len(model.inputs)
            )
        )
    # NOTE: a request with the right number of inputs but a required one absent (an optional
    # one in its place) goes on to the backend, as Triton's core lets it.


_SOURCE = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}
"""The protobuf type of each numeric contents field."""


def typed_contents(t: InputTensor, datatype: str) -> bytes:
    """An input's typed contents in raw little-endian form (BYTES length-prefixed), as the
    gRPC frontend serializes them (narrow integers keep their low bytes); the field was
    checked against ``datatype`` (``frontend_tensors.check_frontend_tensors``), and the
    core's byte-size check judges the count."""
    field = next((f for f in t.contents if len(t.contents[f])), None)
    if field is None:
        return b""  # NOTE: a contents message without elements: no data (has_contents())
    values = t.contents[field]
    if field == "bytes_contents":
        return b"".join(len(v).to_bytes(4, "little") + v for v in values)  # type: ignore[arg-type, operator]
    arr: np.ndarray[Any, Any] = np.asarray(values, dtype=_SOURCE[field])
    return arr.astype(NUMPY_DTYPES[datatype], copy=False).tobytes()


class _InputReader:
    """Reads a request's inputs: each input that sends its bytes in the request takes the
    next ``raw_inputs`` entry in request order; the batch size is the leading dimension of
    the first input checked (batching models)."""

    def __init__(
        self, req: InferenceRequest, model: Model, shm: SystemShmRegistry | None, rid: str
    ) -> None:
        self._model = model
        self._shm = shm
        self._rid = rid
        self._raw_name = req.raw_name
        self.batch_size = -1
        """-1 while unset: 0 is a real (invalid) batch size."""
        # NOTE: raw_inputs holds one entry per input that sends its bytes in the request
        # (neither typed contents nor shared memory), in input order; Triton ignores
        # surplus entries and refuses the first input left without one, before any of the
        # core's checks (check_frontend_tensors does so on the full path; a known
        # signature skips it, so the count is checked here too).
        takers = [t for t in req.inputs if not t.contents and not uses_shm(t.parameters)]
        raw = req.raw_inputs
        if len(raw) < len(takers):
            raise InvalidRequest(no_data_message(takers[len(raw)].name, model.name))
        self._raw = {t.name: raw[i] for i, t in enumerate(takers)}
        """Each taker's ``raw_inputs`` entry, by input name (names are unique by now)."""

    def first_walk(self, t: InputTensor) -> None:
        """Core Normalize's first walk over the inputs: the input is the model's
        (``Model::GetInput``); for a batching model it has a leading dimension, and that
        dimension is the batch size of the inputs walked before it."""
        rid, name = self._rid, self._model.name
        if t.name not in self._model.inputs:
            raise InvalidRequest(unknown_input_message(t.name, name))
        if self._model.max_batch_size <= 0:
            return
        if not t.shape:
            raise InvalidRequest(no_batch_dim_message(rid, t.name, name))
        if self.batch_size < 0:
            self.batch_size = int(t.shape[0])
        elif t.shape[0] != self.batch_size:
            raise InvalidRequest(batch_mismatch_message(rid, t.name, name))

    def read(self, t: InputTensor) -> ValidInput:
        """One input, checked (datatype, shape, byte size: core Normalize's second walk,
        after ``first_walk`` over every input); its bytes located."""
        spec = self._model.inputs[t.name]
        shape = self._shape(t, spec)
        count = element_count(shape)
        if uses_shm(t.parameters):
            return self._in_shared_memory(t, spec, shape, count)
        data = self._bytes(t, spec)
        self._check_byte_size(t, spec, count, data)
        return ValidInput(t.name, spec.datatype, shape, data)

    def read_known(self, t: InputTensor, shape: tuple[int, ...], count: int) -> ValidInput:
        """One input of a signature that passed (``SignatureCache``): only its bytes are
        located and checked (no tensor parameters, so never in shared memory)."""
        spec = self._model.inputs[t.name]
        data = self._bytes(t, spec)
        self._check_byte_size(t, spec, count, data)
        return ValidInput(t.name, spec.datatype, shape, data)

    def _shape(self, t: InputTensor, spec: IOSpec) -> tuple[int, ...]:
        """The input's full shape, checked against the config (datatype, dims, batch)."""
        rid, name, mbs = self._rid, self._model.name, self._model.max_batch_size
        if t.datatype != spec.datatype:
            # NOTE: Triton prints the type it parsed the string as: "<invalid>" for unknown.
            known = DataType.from_wire(t.datatype) is not DataType.INVALID
            got = t.datatype if known else "<invalid>"
            raise InvalidRequest(datatype_message(rid, t.name, got, name, spec.datatype))
        shape = tuple(int(d) for d in t.shape)
        item_shape = shape[1:] if mbs > 0 else shape
        problem = shape_problem(rid, t.name, name, spec.dims, item_shape, shape, mbs > 0)
        if problem is not None:
            raise InvalidRequest(problem)
        return shape

    def _in_shared_memory(
        self, t: InputTensor, spec: IOSpec, shape: tuple[int, ...], count: int
    ) -> ValidInput:
        rid, name = self._rid, self._model.name
        window = shm_window(self._shm, t.parameters, t.name)
        if spec.datatype != "BYTES":
            expected_bytes = count * ELEMENT_BYTES[spec.datatype]
            if window.byte_size != expected_bytes:
                raise InvalidRequest(
                    byte_size_message(rid, t.name, name, expected_bytes, window.byte_size)
                )
        return ValidInput(t.name, spec.datatype, shape, b"", window)

    def _bytes(self, t: InputTensor, spec: IOSpec) -> bytes | memoryview:
        """The input's bytes from its typed contents or the next ``raw_inputs`` entry (the
        constructor checked there is one)."""
        if t.contents:
            return typed_contents(t, spec.datatype)
        return self._raw[t.name]

    def _check_byte_size(
        self, t: InputTensor, spec: IOSpec, count: int, data: bytes | memoryview
    ) -> None:
        rid, name = self._rid, self._model.name
        # NOTE: core keys a raw request's input by its raw name; these checks print the key.
        label = self._raw_name or t.name
        if spec.datatype == "BYTES":
            check_bytes_elements(data, count, label, name, rid)
            return
        expected_bytes = count * ELEMENT_BYTES[spec.datatype]
        if len(data) != expected_bytes:
            raise InvalidRequest(byte_size_message(rid, label, name, expected_bytes, len(data)))


def check_bytes_elements(
    data: bytes | memoryview, count: int, input_name: str, model_name: str, rid: str
) -> None:
    """A BYTES input's serialised elements (4-byte little-endian length, then the bytes)
    against the ``count`` its shape names, in core ``ValidateBytesInputs``' order and words.

    Core counts an element whose length runs past the buffer and ends its walk there, so the
    element count is checked first; the backend then refuses the cut element (python
    backend, backend_common ``SetStringInputTensor``: no request id, no model name).

    Raises:
        InvalidRequest: "incomplete string length indicator ...", "unexpected number of
            string elements ...", "expected N string elements ..., got M", or (a count that
            matches, the last element cut off; ``RefusedByBackend``) "incomplete string data
            for inference input '<name>', expecting string of length <n> but only <m> bytes
            available".
    """
    where = f"for inference input '{input_name}' for model '{model_name}'"
    view = memoryview(data).cast("B")
    pos, end, checked, length = 0, len(view), 0, 0
    while pos < end:
        if end - pos < 4:
            raise InvalidRequest(
                f"{rid}incomplete string length indicator {where}, expecting 4 bytes but only "
                f"{end - pos} bytes available. Please make sure the string length indicator "
                "is in one buffer."
            )
        length = int.from_bytes(view[pos : pos + 4], "little")
        checked += 1
        if checked > count:
            raise InvalidRequest(
                f"{rid}unexpected number of string elements {checked} {where}, expecting {count}"
            )
        pos += 4 + length
    if checked != count:
        raise InvalidRequest(f"{rid}expected {count} string elements {where}, got {checked}")
    if pos > end:
        # NOTE: core passes this (the walk ends inside the last element); the backend then
        # refuses it and counts a failure. triton-mp refuses it here, in the backend's
        # words, rather than hand a model a cut string, and counts it as the backend would.
        raise RefusedByBackend(
            f"incomplete string data for inference input '{input_name}', expecting string of "
            f"length {length} but only {length - (pos - end)} bytes available"
        )


def read_inputs(
    req: InferenceRequest, model: Model, shm: SystemShmRegistry | None, rid: str
) -> tuple[tuple[ValidInput, ...], int]:
    """Every input checked, with its bytes, and the request's batch size.

    Returns:
        The inputs in request order, and the batch size: the leading dimension shared by
        every input when the model batches (``max_batch_size`` > 0), else 1.

    Raises:
        InvalidRequest: (INVALID_ARG) too few ``raw_inputs``, an input the model lacks, a
            wrong datatype or shape, mismatched batch sizes, a batch over ``max_batch_size``
            or of 0, a wrong byte size, missing data, typed contents together with raw bytes
            or shared memory; with two problems, the one Triton's walks meet first.
        TritonMPError: a shared-memory window that does not resolve (``shm_window``).
    """
    reader = _InputReader(req, model, shm, rid)
    # NOTE: the core keeps the inputs in an unordered_map and walks it twice (Normalize):
    # names and batch dimensions of all, the batch size, then datatype, shape and byte size
    # of each; a request with two bad inputs is told about the one Triton meets first.
    order = triton_order(req.inputs)
    for t in order:
        reader.first_walk(t)
    mbs = model.max_batch_size
    if mbs > 0 and reader.batch_size > mbs:
        raise InvalidRequest(batch_too_big_message(rid, mbs, model.name))
    read = {t.name: reader.read(t) for t in order}
    inputs = tuple(read[t.name] for t in req.inputs)
    if mbs <= 0:
        return inputs, 1
    if reader.batch_size == 0:
        raise InvalidRequest(f"{rid}inference request batch-size must be >= 1 for '{model.name}'")
    return inputs, max(reader.batch_size, 1)


def read_known_inputs(
    req: InferenceRequest,
    model: Model,
    shapes: Sequence[tuple[int, ...]],
    counts: Sequence[int],
    rid: str,
) -> tuple[ValidInput, ...]:
    """``read_inputs`` for a request whose signature already passed: the data checks only,
    in the same order and words (too few ``raw_inputs``, then per input where its bytes are
    and their size).

    Args:
        shapes, counts: each input's full shape and element count, in request order.

    Raises:
        InvalidRequest: as ``read_inputs``' data checks.
    """
    reader = _InputReader(req, model, None, rid)
    forms = {
        t.name: (shape, count) for t, shape, count in zip(req.inputs, shapes, counts, strict=True)
    }
    read = {t.name: reader.read_known(t, *forms[t.name]) for t in triton_order(req.inputs)}
    return tuple(read[t.name] for t in req.inputs)


@functools.lru_cache(maxsize=1024)
def _order_of(names: tuple[str, ...]) -> tuple[int, ...]:
    """The positions of ``names`` in the order core's ``original_inputs_`` yields them."""
    where = {name: i for i, name in enumerate(names)}
    return tuple(where[name] for name in iteration_order(names))


def triton_order(inputs: Sequence[InputTensor]) -> list[InputTensor]:
    """``inputs`` (distinct names) in the order Triton's core walks them (libstdc++
    ``unordered_map`` iteration, ``common.unordered``); cached per name tuple."""
    if len(inputs) < 2:
        return list(inputs)
    return [inputs[i] for i in _order_of(tuple(t.name for t in inputs))]
