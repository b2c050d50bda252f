"""What a python model's ``execute`` returns, read as the worker's results.

Imported by ``backends.python.backend``. The rules are upstream's (python_backend
``pb_stub.cc`` ``ProcessReturnedResponses`` and ``InferResponse::Send``, 2.51): a default-mode
``execute`` returns a list with one entry per request; a response's error fails its request
only; a response's parameters are a JSON object of strings, booleans and int64s. Only the
outputs the request asked for are kept, reshaped back to the config's ``dims`` where the
config has a ``reshape``.
"""

from __future__ import annotations

import json

import numpy as np

from triton_mp.backends.base import BackendRequest, Outputs, ReturnedError
from triton_mp.backends.python import pb_utils
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.ipc.protocol.specs import ModelVersionSpec

NOT_RESCHEDULABLE = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
    "configured to handle such a flag."
)
"""Core's refusal of ``RELEASE_RESCHEDULE`` for a model without ``iterative_sequence``."""


def error_code(code: int) -> ErrorCode:
    """A ``TritonError`` code as our ``ErrorCode`` (same numbers); unknown ones are INTERNAL."""
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.INTERNAL


def returned_list_refusal(responses: object, n_requests: int) -> str | None:
    """Why a default-mode ``execute``'s return value (not None) is refused, as the stub's
    ProcessReturnedResponses says it (python_backend ``pb_stub.cc``, 2.51: a list only, one
    entry per request; the "\\n" ending the count message is upstream's), or None.

    Args:
        responses: what ``execute`` returned (None already replaced by a list of None).
        n_requests: the batch's request count.
    """
    if not isinstance(responses, list):
        return f"Expected a list in the execute return, found type '{type(responses)}'."
    if len(responses) != n_requests:
        return (
            "Number of InferenceResponse objects do not match the number of InferenceRequest "
            f"objects. InferenceRequest(s) size is:{n_requests}, and InferenceResponse(s) "
            f"size is:{len(responses)}\n"
        )
    return None


def parameters_refusal(parameters_json: str) -> str | None:
    """Why a response's parameters cannot be sent (None when they can): as upstream's
    ``InferResponse::Send`` refuses a value that is not a string, an int64 or a boolean
    ("Unsupported value type on parameters"; the constructor takes any Python int); a JSON
    string that is no object is refused too (only our ``parameters=`` JSON-string extension
    can produce either)."""
    try:
        doc = json.loads(parameters_json)
    except ValueError as e:
        return f"Unable to parse the response parameters as JSON: {e}"
    if not isinstance(doc, dict):
        return "Unable to parse the response parameters: expected a JSON object"
    if any(not _sendable(v) for v in doc.values()):
        return "Unsupported value type on parameters"
    return None


_INT64 = range(-(2**63), 2**63)


def _sendable(value: object) -> bool:
    """A parameter value upstream's ``InferResponse::Send`` sends: a string, a boolean, or an
    integer TritonJson reads as ``IsInt`` (RapidJSON's int64; a larger one is a uint64 or a
    double there, refused as an unsupported type)."""
    if isinstance(value, bool | str):
        return True
    return isinstance(value, int) and value in _INT64


def _client_dims(dims: tuple[int, ...]) -> tuple[int, ...] | None:
    """Config ``dims`` usable as a numpy reshape target (at most one -1), else None."""
    return dims if dims.count(-1) <= 1 else None


class ResponseReader:
    """Turns one ``pb_utils.InferenceResponse`` into a request's result (per instance).

    Args:
        model: the model version (its name for messages, ``max_batch_size``, outputs'
            ``reshape``).
        origin: the ``ErrorInfo.origin`` of every error made here (``"worker <instance>"``).
    """

    def __init__(self, model: ModelVersionSpec, origin: str) -> None:
        self._model = model.model
        self._origin = origin
        self._batched = model.max_batch_size > 0
        self._output_dims = {
            t.name: dims
            for t in model.outputs
            if t.reshape is not None and (dims := _client_dims(t.dims)) is not None
        }

    def result(
        self, request: BackendRequest, response: object
    ) -> dict[str, np.ndarray] | ErrorInfo:
        """One request's outputs (name -> array, only those ``request.outputs`` asks for;
        an ``Outputs`` when the response has parameters), or the error its response carries
        (a ``ReturnedError``) or its malformation earns (an INTERNAL ``ErrorInfo``)."""
        if not isinstance(response, pb_utils.InferenceResponse):
            return ErrorInfo(
                ErrorCode.INTERNAL,
                f"model '{self._model}' returned {type(response).__name__} instead of an "
                "InferenceResponse for a request",
                self._origin,
            )
        # NOTE: pb_utils' own slots, read without the accessor calls (the hot path: one
        # response per request).
        error = response._error  # noqa: SLF001
        if error is not None:
            return ReturnedError(error_code(error.code()), error.message(), self._origin)
        outputs: dict[str, np.ndarray] = {}
        wanted = request.outputs
        output_dims = self._output_dims
        tensor_type = pb_utils.Tensor
        for tensor in response._output_tensors:  # noqa: SLF001
            if type(tensor) is not tensor_type and not isinstance(tensor, tensor_type):
                return ErrorInfo(
                    ErrorCode.INTERNAL,
                    f"model '{self._model}' put a {type(tensor).__name__} among the "
                    "output tensors of a response; expected pb_utils.Tensor",
                    self._origin,
                )
            name = tensor._name  # noqa: SLF001
            if name not in wanted:
                continue
            arr = tensor._array  # noqa: SLF001 - BF16 too (as pb_utils._tensor_data)
            if output_dims:
                dims = output_dims.get(name)
                if dims is not None:
                    try:
                        arr = arr.reshape(((request.batch_size,) if self._batched else ()) + dims)
                    except ValueError:
                        return ErrorInfo(
                            ErrorCode.INTERNAL,
                            f"output '{name}' of model '{self._model}' has shape "
                            f"{list(arr.shape)}, which does not reshape to its config dims "
                            f"{list(dims)}",
                            self._origin,
                        )
            outputs[name] = arr
        parameters = response._parameters  # noqa: SLF001
        if parameters and parameters != "{}":
            refusal = parameters_refusal(parameters)
            if refusal is not None:
                return ErrorInfo(ErrorCode.INTERNAL, refusal, self._origin)
            return Outputs(outputs, parameters)
        return outputs
