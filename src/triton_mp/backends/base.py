"""The backend contract and the batch helpers every backend shares.

Imported by worker processes only (the worker and every backend package; see
``backends.registry`` for how a worker finds its backend). A backend owns one model
instance and implements
``execute(requests) -> (results, times)``: exactly one result per request, each either a
dict of output arrays or an ``ErrorInfo``. The worker checks the count; if ``execute``
raises, every request of that batch fails with INTERNAL and the worker goes on.

Sequence models (``ModelVersionSpec.sequence`` set) get ``execute(requests, sequence)``: a
``SequenceBatch`` says which batch row each request sits in (rows holding no request are
"null" rows) and carries the control tensors; the worker has already put each request's
implicit state inputs into its ``inputs`` and the state outputs into its ``outputs``. Every
other model gets ``execute(requests)`` alone, as before.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec
import numpy as np

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.ipc.protocol.specs import ModelVersionSpec


class BackendRequest(msgspec.Struct, frozen=True):
    """One request as a backend sees it (a frozen struct, never encoded: it is built once
    per request per batch, and a msgspec struct is ~10x cheaper to build than a frozen
    dataclass, whose ``__init__`` goes through ``object.__setattr__`` per field).

    Attributes:
        inputs: name -> array with the client-visible shape (batch dim first when the model
            batches); views over shared memory, valid until the batch ends: copy to keep.
        outputs: requested output names.
        batch_size: the request's batch size (1 when the model does not batch).
        request_id: the client's request ``id``.
        timeout_us: the request's ``timeout`` parameter in microseconds (0 = none).
        parameters_json: the request's non-reserved parameters as a JSON object.
        sequence_id: the correlation ID (uint64 or string; 0 outside sequences).
        sequence_flags: ``ipc.protocol.messages.SequenceFlags`` bits.
        token: the worker's handle of the request (its ``InferRequest``), which a backend
            that answers on its own (decoupled models) passes back to ``Responder``.
    """

    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]
    batch_size: int
    request_id: str = ""
    timeout_us: int = 0
    parameters_json: str = "{}"
    sequence_id: int | str = 0
    sequence_flags: int = 0
    token: object = None


@dataclass(frozen=True, slots=True)
class SequenceBatch:
    """How the requests of one sequence-batcher execution sit in the backend's batch.

    Attributes:
        rows: batch rows the backend runs (>= the sum of the requests' batch sizes; always 1
            for a model with max_batch_size 0).
        slots: the first row of each request, in request order: request ``i`` covers rows
            ``slots[i]`` to ``slots[i] + batch_size - 1``. Rows no request covers are null
            rows (READY false; their input data is garbage).
        controls: control input name -> tensor for the whole batch: shape ``[rows, 1]`` when
            the model batches, ``[1]`` when it does not (see ``sequence.control_tensors``).
    """

    rows: int
    slots: tuple[int, ...]
    controls: dict[str, np.ndarray]


class PhaseTimes(msgspec.Struct, frozen=True):
    """Durations of one execution in nanoseconds (Triton's compute_input / compute_infer);
    a frozen struct, built once per batch (see ``BackendRequest``)."""

    compute_input_ns: int
    compute_infer_ns: int


class Responded:
    """The result of a request the backend answers itself, through the worker's
    ``Responder`` (decoupled models): the worker sends nothing for it after the batch."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RESPONDED"


RESPONDED = Responded()
"""The one ``Responded`` value."""


class Rescheduled:
    """The result of a request the model released with ``RELEASE_RESCHEDULE`` (python
    ``request.set_release_flags``, iterative sequence batching): no response is sent for
    it now; the worker reports it in ``BatchDone.rescheduled`` and the scheduler runs it
    again in a later batch of its sequence."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RESCHEDULED"


RESCHEDULED = Rescheduled()
"""The one ``Rescheduled`` value."""


class Outputs(dict[str, np.ndarray]):
    """A request's outputs (name -> array) with the response's parameters: what a backend
    returns instead of a plain dict when the response carries parameters (the python
    backend's ``InferenceResponse(parameters=...)``).

    Attributes:
        parameters_json: the response parameters as a JSON object of str -> bool/int/str
            (KServe ``ModelInferResponse.parameters``); "" for none.
    """

    __slots__ = ("parameters_json",)

    def __init__(self, outputs: dict[str, np.ndarray], parameters_json: str = "") -> None:
        super().__init__(outputs)
        self.parameters_json = parameters_json


def response_parameters(outputs: dict[str, np.ndarray]) -> str:
    """The response parameters carried by a backend's outputs ("" for a plain dict)."""
    return outputs.parameters_json if isinstance(outputs, Outputs) else ""


class ReturnedError(ErrorInfo, frozen=True, array_like=True):
    """An error the model itself returned as a request's response (the python backend's
    ``InferenceResponse(error=...)``), not a failed execution: answered as any error, but the
    request counts as executed (statistics ``success``, ``nv_inference_request_success``), as
    python_be.cc reports it (its ``PbMetricReporter`` marks a request failed only when
    ``ProcessRequests`` itself fails: ``execute`` raised, an input could not be read).
    Crosses processes as a plain ``ErrorInfo`` (no field of its own)."""


Result = dict[str, np.ndarray] | ErrorInfo | Responded | Rescheduled


class Responder(Protocol):
    """What a backend calls to answer a request itself, from any thread, at any time
    (``Worker.respond``): outputs, an error, or None (a flags-only final response)."""

    def __call__(
        self, token: object, result: dict[str, np.ndarray] | ErrorInfo | None, final: bool
    ) -> None:
        """Send one response for the request ``token`` names; ``final`` ends the request.

        Raises:
            TritonMPError: the outputs cannot be written (missing output, arena full).
        """
        ...


class Backend(Protocol):
    """One loaded model instance."""

    def execute(
        self, requests: Sequence[BackendRequest], sequence: SequenceBatch | None = None
    ) -> tuple[list[Result], PhaseTimes]:
        """Run a batch; returns one result per request plus phase durations.

        ``sequence`` is given for sequence models only (batch rows and control tensors).
        """
        ...

    def close(self) -> None:
        """Release the instance's resources."""
        ...


def to_backend_shape(arr: np.ndarray, reshape: tuple[int, ...] | None, batched: bool) -> np.ndarray:
    """Apply a config ``reshape`` (the backend's view of a tensor); None leaves it as is."""
    if reshape is None:
        return arr
    shape = ((arr.shape[0],) + reshape) if batched else reshape
    return arr.reshape(shape)


def gather(spec: ModelVersionSpec, requests: Sequence[BackendRequest]) -> dict[str, np.ndarray]:
    """Concatenate the requests' inputs along the batch dimension (no copy for one request).

    Inputs absent from some request (optional inputs) are left out of the batch.
    """
    batched = spec.max_batch_size > 0
    feeds: dict[str, np.ndarray] = {}
    for t in spec.inputs:
        arrays = [r.inputs[t.name] for r in requests if t.name in r.inputs]
        if not arrays:
            continue
        arr = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        feeds[t.name] = to_backend_shape(arr, t.reshape, batched)
    return feeds


def gather_rows(
    spec: ModelVersionSpec,
    requests: Sequence[BackendRequest],
    sequence: SequenceBatch,
    extra: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """Lay the requests' inputs out in ``sequence.rows`` rows (sequence batcher).

    Request ``i`` fills rows from ``sequence.slots[i]``; each null row gets a copy of the
    first row of ``requests[0]`` (garbage the model must ignore: its READY control is
    false). ``extra`` names inputs beyond the config's (implicit state) to lay out the same
    way, without reshape. Rows and slots must be consistent (``sequence.batch_rows``).

    Raises:
        TritonMPError (INVALID_ARG): an input some requests give and others do not.
    """
    names = [(t.name, t.reshape) for t in spec.inputs] + [(n, None) for n in extra]
    at = {s: r for r, s in zip(requests, sequence.slots, strict=True)}
    pieces: list[BackendRequest | None] = []
    row = 0
    while row < sequence.rows:
        req = at.get(row)
        pieces.append(req)
        row += 1 if req is None else req.batch_size
    batched = spec.max_batch_size > 0
    feeds: dict[str, np.ndarray] = {}
    for name, reshape in names:
        have = sum(name in r.inputs for r in requests)
        if have == 0:
            continue
        if have != len(requests):
            raise TritonMPError(
                f"input '{name}' is given by {have} of the {len(requests)} requests batched "
                "together; it must be given by all or none",
                ErrorCode.INVALID_ARG,
            )
        filler = requests[0].inputs[name][:1] if batched else requests[0].inputs[name]
        arrays = [filler if p is None else p.inputs[name] for p in pieces]
        arr = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        feeds[name] = to_backend_shape(arr, reshape, batched)
    return feeds


def scatter(
    spec: ModelVersionSpec,
    requests: Sequence[BackendRequest],
    outputs: dict[str, np.ndarray],
    starts: Sequence[int] | None = None,
) -> list[Result]:
    """Split batched outputs back into per-request dicts (client-visible shapes).

    ``starts`` gives each request's first batch row (``SequenceBatch.slots``); None = the
    requests' rows follow each other from row 0. Rows no request covers are dropped.
    """
    batched = spec.max_batch_size > 0
    dims = {t.name: t for t in spec.outputs}
    results: list[Result] = []
    start = 0
    for k, r in enumerate(requests):
        out: dict[str, np.ndarray] = {}
        if starts is not None:
            start = starts[k]
        stop = start + r.batch_size
        for name in r.outputs:
            arr = outputs[name]
            part = arr[start:stop] if batched else arr
            t = dims.get(name)
            if t is not None and t.reshape is not None:
                part = part.reshape(((r.batch_size,) if batched else ()) + t.dims)
            out[name] = part
        results.append(out)
        start = stop
    return results


class Stopwatch:
    """Splits one execution into phases with ``time.perf_counter_ns``."""

    def __init__(self) -> None:
        self._t = time.perf_counter_ns()

    def lap(self) -> int:
        """Nanoseconds since the previous lap (or creation)."""
        now = time.perf_counter_ns()
        d = now - self._t
        self._t = now
        return d
