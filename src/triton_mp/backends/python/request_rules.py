"""What 2.51's python backend does to a batch's requests before ``execute``, beyond building
them: an ensemble step's inputs are the model's own copy, and a batching model's request
without any input is refused.

Imported by ``backends.python.backend``. 2.51's stub copies every input into its own shared
memory; here a request's inputs are views of its requester's block. A frontend's request owns
its block, but an ensemble tensor is one block that other steps may read and the client may
get as an output (r14 F2), so a step's inputs are copied (``own_step_inputs``; for a batch
``backend.PythonBackend._pb_requests`` builds in C, ``pb_requests.cc`` copies them itself).
``python_be.cc`` ProcessRequests reads a batching model's batch size from input 0 of each
request (``TRITONBACKEND_RequestInputByIndex``): a request without inputs fails there, is
counted as a failure, and the batch's other requests run (``refuse_without_inputs``; r14 F4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from triton_mp.backends.base import BackendRequest, PhaseTimes, Result
from triton_mp.backends.python import pb_utils
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import ErrorInfo, InferRequest, Requester


class WithoutInputs(Exception):  # noqa: N818 - a signal to the caller, not an error
    """Requests of a batching model's batch that have no input (their indices, ascending)."""

    def __init__(self, indices: list[int]) -> None:
        super().__init__(indices)
        self.indices = indices


def check_inputs(requests: Sequence[BackendRequest]) -> None:
    """Raise ``WithoutInputs`` when a request of a batching model's batch has no input.

    Raises:
        WithoutInputs: the indices of those requests.
    """
    refused = [i for i, r in enumerate(requests) if not r.inputs]
    if refused:
        raise WithoutInputs(refused)


def refuse_without_inputs(
    requests: Sequence[BackendRequest],
    refused: list[int],
    execute: Callable[[Sequence[BackendRequest]], tuple[list[Result], PhaseTimes]],
    origin: str,
) -> tuple[list[Result], PhaseTimes]:
    """Each request's result in batch order, and the times of the one execution of the
    others (``execute``; none when all are refused): INVALID_ARG in 2.51's words for the
    ``refused`` indices (core prefixes the request id)."""
    skip = set(refused)
    rest = [r for i, r in enumerate(requests) if i not in skip]
    ran, times = execute(rest) if rest else ([], PhaseTimes(0, 0))
    out: list[Result] = []
    results = iter(ran)
    for i, r in enumerate(requests):
        if i in skip:
            rid = r.request_id or "<id_unknown>"
            message = f"[request id: {rid}] out of bounds index 0: request has 0 inputs"
            out.append(ErrorInfo(ErrorCode.INVALID_ARG, message, origin))
        else:
            out.append(next(results))
    return out, times


_ENSEMBLE = int(Requester.ENSEMBLE)
"""``Requester.ENSEMBLE`` as an int: an enum member's lookup costs ~3x the loop's test."""


def own_step_inputs(
    requests: Sequence[BackendRequest], built: list[pb_utils.InferenceRequest]
) -> list[pb_utils.InferenceRequest]:
    """``built``, with each ensemble step's inputs copied (a model writing its input in place,
    ``x /= 255``, then changes nothing but its copy). A frontend's request keeps its views.

    NOTE: on the hot path: one type and one int test per request (a batch without a step
    request, the common case, returns after the loop)."""
    for i, r in enumerate(requests):
        token = r.token
        if type(token) is InferRequest and token.reply_to.kind == _ENSEMBLE:
            for t in built[i]._inputs:  # noqa: SLF001 - the backend builds pb_utils' requests
                t._array = t._array.copy()  # noqa: SLF001
    return built
