"""The backend contract and the batch helpers every backend shares.

Imported by worker processes only. A backend owns one model instance and implements
``execute(requests) -> (results, times)``: exactly one result per request, each either a
dict of output arrays or an ``ErrorInfo``. The worker checks the count; if ``execute``
raises, every request of that batch fails with INTERNAL and the worker goes on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from triton_mp.config import ModelVersionSpec
from triton_mp.ipc.messages import ErrorInfo


@dataclass(frozen=True, slots=True)
class BackendRequest:
    """One request as a backend sees it.

    Attributes:
        inputs: name -> array with the client-visible shape (batch dim first when the model
            batches); views over shared memory, valid until the batch ends: copy to keep.
        outputs: requested output names.
        batch_size: the request's batch size (1 when the model does not batch).
        request_id: the client's request ``id``.
        timeout_us: the request's ``timeout`` parameter in microseconds (0 = none).
        parameters_json: the request's non-reserved parameters as a JSON object.
    """

    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]
    batch_size: int
    request_id: str = ""
    timeout_us: int = 0
    parameters_json: str = "{}"


@dataclass(frozen=True, slots=True)
class PhaseTimes:
    """Durations of one execution in nanoseconds (Triton's compute_input / compute_infer)."""

    compute_input_ns: int
    compute_infer_ns: int


Result = dict[str, np.ndarray] | ErrorInfo


class Backend(Protocol):
    """One loaded model instance."""

    def execute(self, requests: Sequence[BackendRequest]) -> tuple[list[Result], PhaseTimes]:
        """Run a batch; returns one result per request plus phase durations."""
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


def scatter(
    spec: ModelVersionSpec,
    requests: Sequence[BackendRequest],
    outputs: dict[str, np.ndarray],
) -> list[Result]:
    """Split batched outputs back into per-request dicts (client-visible shapes)."""
    batched = spec.max_batch_size > 0
    dims = {t.name: t for t in spec.outputs}
    results: list[Result] = []
    start = 0
    for r in requests:
        out: dict[str, np.ndarray] = {}
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
