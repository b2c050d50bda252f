"""``triton_python_backend_utils``: the API Triton python models import as ``pb_utils``.

Our own implementation of the public API of Triton's python backend (shared/reference/
triton.md §7), for ordinary models: tensors, requests as a model receives them, responses,
per-response errors, config helpers, ``auto_complete_config``'s ``ModelConfig``, logging and
Triton's constants. ``backends.python.backend`` installs this module as
``sys.modules["triton_python_backend_utils"]`` before it imports a user's ``model.py``; so does
``backends.python.autocomplete``. Imported only by worker processes and the auto-complete
child; of the IPC layer it imports only ``SequenceFlags`` (its request flags are those).

Decoupled models: ``InferenceRequest.get_response_sender()`` gives the request's
``InferenceResponseSender`` (``send(response=None, flags=0)``, ``is_cancelled()``), usable from
any thread until it sends ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; ``backends.python.backend``
wires it to the worker.

BLS: ``InferenceRequest(model_name=..., ...).exec()`` / ``await .async_exec()`` send the
request through the server's scheduler to another model (``workers.bls.bls_client``) and return its
``InferenceResponse`` (an error response, never an exception, for an unknown model or the
callee's failure); ``exec(decoupled=True)`` iterates over a decoupled callee's responses.

Custom metrics: ``MetricFamily(name, description, kind)`` and ``family.Metric(labels=...,
buckets=...)`` with ``increment``, ``set``, ``observe`` and ``value``, under Triton's rules
(``_MetricRegistry``). Values live in float64 slots of a ``MetricStore``; the python
backend installs one in shared memory (``backends.python.metrics``) that the server's
metrics endpoint reads at scrape time, so an operation is a store under a lock, never a
message.

Model control: ``load_model`` / ``unload_model`` go to the server's model control
(``set_model_control``; explicit mode only, the client API's checks and messages);
``is_model_ready`` answers from the BLS table of served models.

Request rescheduling: ``request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``
inside ``execute`` of a model with ``sequence_batching { iterative_sequence: true }`` runs the
request again in a later batch (the backend reports it; the scheduler queues it first in its
sequence).

Tensor data: ``Tensor.as_numpy()`` of an input returns the array the worker gave the backend,
which for fixed-size types is a view over the frontend's shared-memory arena. As in Triton,
such a view is valid only during the ``execute`` call that received it: a model that keeps
input data across calls must copy it (``arr.copy()``). BYTES tensors are numpy ``object``
arrays whose elements are ``bytes``. BF16 tensors have no numpy form, as in Triton:
``as_numpy`` refuses them and ``to_dlpack`` / ``from_dlpack`` carry them
(``backends.python.dlpack``).
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import math
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import IntEnum
from typing import Any, NamedTuple, Protocol, cast

import numpy as np

from triton_mp.backends.python.dlpack import Capsule as _DLCapsule
from triton_mp.backends.python.dlpack import export_bf16 as _export_bf16
from triton_mp.backends.python.dlpack import import_bf16 as _import_bf16
from triton_mp.backends.python.dlpack import is_bf16 as _is_bf16
from triton_mp.common.datatypes import DataType
from triton_mp.common.errors import ErrorCode
from triton_mp.common.numpy_tensors import BF16_DTYPE as _BF16_DTYPE
from triton_mp.common.numpy_tensors import deserialize_bytes_tensor as _deserialize
from triton_mp.common.numpy_tensors import serialize_bytes_tensor as _serialize
from triton_mp.ipc.protocol.messages import SequenceFlags

_log = logging.getLogger("triton_mp.model")

# ---------------------------------------------------------------------------
# Constants (values of tritonserver.h and the python backend)
# ---------------------------------------------------------------------------

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START: int = SequenceFlags.START.value
"""Request flag: the first request of a sequence (``ipc.protocol.messages.SequenceFlags.START``)."""
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END: int = SequenceFlags.END.value
"""Request flag: the last request of a sequence (``ipc.protocol.messages.SequenceFlags.END``)."""
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
"""Response flag: no more responses for this request (decoupled models)."""
TRITONSERVER_REQUEST_RELEASE_ALL = 1
"""Release flag: the model is done with the request."""
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
"""Release flag: schedule the request again (iterative sequence batching)."""
TRITONSERVER_MEMORY_GPU = 2
"""Memory type of ``PreferredMemory``: device memory."""
TRITONSERVER_MEMORY_CPU = 0
"""Memory type of ``PreferredMemory``: host memory."""

# TRITONSERVER_DataType values: common.datatypes.DataType's (the config's numbers, TYPE_FP32 = 11).
TRITONSERVER_TYPE_INVALID: int = DataType.INVALID.value
TRITONSERVER_TYPE_BOOL: int = DataType.BOOL.value
TRITONSERVER_TYPE_UINT8: int = DataType.UINT8.value
TRITONSERVER_TYPE_UINT16: int = DataType.UINT16.value
TRITONSERVER_TYPE_UINT32: int = DataType.UINT32.value
TRITONSERVER_TYPE_UINT64: int = DataType.UINT64.value
TRITONSERVER_TYPE_INT8: int = DataType.INT8.value
TRITONSERVER_TYPE_INT16: int = DataType.INT16.value
TRITONSERVER_TYPE_INT32: int = DataType.INT32.value
TRITONSERVER_TYPE_INT64: int = DataType.INT64.value
TRITONSERVER_TYPE_FP16: int = DataType.FP16.value
TRITONSERVER_TYPE_FP32: int = DataType.FP32.value
TRITONSERVER_TYPE_FP64: int = DataType.FP64.value
TRITONSERVER_TYPE_BYTES: int = DataType.STRING.value
TRITONSERVER_TYPE_BF16: int = DataType.BF16.value

_NUMPY_OF_TRITON: dict[int, type] = {t.value: t.numpy.type for t in DataType if t.numpy is not None}
_TRITON_OF_NUMPY: dict[np.dtype, int] = {np.dtype(t): k for k, t in _NUMPY_OF_TRITON.items()}
_TRITON_OF_NUMPY[_BF16_DTYPE] = TRITONSERVER_TYPE_BF16  # NOTE: how triton-mp holds BF16
TRITON_STRING_TO_NUMPY: dict[str, type] = {
    t.config_name: t.numpy.type for t in DataType if t.numpy is not None
}
"""Config data type string -> numpy type (``"TYPE_FP32"`` -> ``np.float32``,
``"TYPE_STRING"`` -> ``np.object_``), as Triton's ``pb_utils`` has it."""


def triton_to_numpy_type(data_type: int) -> type | None:
    """The numpy type of a ``TRITONSERVER_DataType`` value (None for BF16 and unknown)."""
    return _NUMPY_OF_TRITON.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The ``TRITONSERVER_DataType`` value of a numpy type; bytes/str arrays are BYTES.

    Returns None for numpy types Triton has no datatype for.
    """
    dtype = np.dtype(data_type)
    if dtype.kind in ("O", "S", "U"):
        return TRITONSERVER_TYPE_BYTES
    return _TRITON_OF_NUMPY.get(dtype)


def triton_string_to_numpy(triton_type_string: str) -> type | None:
    """The numpy type of a config data type string (``"TYPE_FP32"`` -> ``np.float32``).

    ``TYPE_STRING`` gives ``np.object_``; BF16 and unknown strings give None.
    """
    return TRITON_STRING_TO_NUMPY.get(triton_type_string)


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """Triton's length-prefixed form of a BYTES array, as a 1-D ``uint8`` array.

    Elements are ``bytes`` (``str`` is UTF-8 encoded), in row-major order. None for an empty
    array.

    Raises:
        TritonModelException: the array is not of bytes, str or object type.
    """
    arr = np.asarray(input_tensor)
    if arr.size == 0:
        return None
    if arr.dtype.kind not in ("O", "S", "U"):
        raise TritonModelException(f"cannot serialize a {arr.dtype} array as a BYTES tensor")
    return np.frombuffer(_serialize(arr), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray) -> np.ndarray:
    """A 1-D ``object`` array of ``bytes`` from Triton's length-prefixed form."""
    buf = encoded_tensor.tobytes() if isinstance(encoded_tensor, np.ndarray) else encoded_tensor
    count = 0
    pos = 0
    while pos + 4 <= len(buf):
        pos += 4 + int.from_bytes(buf[pos : pos + 4], "little")
        count += 1
    return _deserialize(buf, (count,))


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class TritonError:
    """An error a model attaches to one response: only that request fails.

    Codes are ``TRITONSERVER_Error_Code`` values, ``common.errors.ErrorCode``'s members (the
    class constants are those members); the default is INTERNAL.
    """

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    __slots__ = ("_code", "_message")

    def __init__(self, message: str | bytes, code: int = INTERNAL) -> None:
        self._message = _text(message)
        self._code = int(code)

    def message(self) -> str:
        """The error's text."""
        return self._message

    def code(self) -> int:
        """The error's code (one of the class constants)."""
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


class TritonModelException(Exception):  # noqa: N818 - Triton's name
    """Raised by ``pb_utils`` calls that fail, and by models in ``execute`` to fail a batch."""

    def __init__(self, message: str = "", code: int = TritonError.INTERNAL) -> None:
        super().__init__(message)
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        """The exception's text."""
        return self._message

    def code(self) -> int:
        """A ``TritonError`` code."""
        return self._code


# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------


class Tensor:
    """A named tensor held as a numpy array (host memory only in triton-mp).

    Args:
        name: the tensor's name (an input or output of the model).
        data: a numpy array; BYTES tensors are ``object`` arrays of ``bytes`` (``np.bytes_``
            arrays are accepted too).

    Raises:
        TritonModelException: ``data`` is not a numpy array, or its dtype has no Triton
            datatype: complex, datetime, ``str`` (``U``), a byte order that is not the
            host's (``>f4``), ... (2.51's words: its ``numpy_to_triton_type`` gives None for
            them and pb_stub's ``PbTensor`` refuses the tensor when it is made).
    """

    __slots__ = ("_array", "_name")

    def __init__(self, name: str | bytes, data: np.ndarray) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                f"tensor '{name}': data must be a numpy array, got {type(data).__name__}"
            )
        dtype = data.dtype
        if dtype not in _TRITON_OF_NUMPY and dtype.kind != "S":
            raise TritonModelException("NumPy dtype is not supported.")
        # NOTE: a str name (nearly always) needs none of _text's conversions.
        self._name = name if type(name) is str else _text(name)
        self._array = data

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The data. For inputs this may be a view over shared memory, valid during the
        ``execute`` call only (copy to keep).

        Raises:
            TritonModelException: a BF16 tensor (python_backend ``pb_tensor.cc`` AsNumpy:
                numpy has no bfloat16; use ``to_dlpack``).
        """
        arr = self._array
        d = arr.dtype
        if d.char == "V" and d == _BF16_DTYPE:
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and "
                "from_dlpack() instead."
            )
        return arr

    def shape(self) -> list[int]:
        """The shape as a list of ints."""
        return [int(d) for d in self._array.shape]

    def triton_dtype(self) -> int | None:
        """The ``TRITONSERVER_DataType`` value of the data."""
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        """Always True: triton-mp python models get host tensors."""
        return True

    def to_dlpack(self) -> object:
        """A DLPack capsule sharing the data (not for BYTES tensors; BF16 as ``kDLBfloat``).

        Raises:
            TritonModelException: the dtype has no DLPack form (object/bytes arrays).
        """
        try:
            if _is_bf16(self._array):
                return _export_bf16(self._array)
            return self._array.__dlpack__()
        except (TypeError, BufferError) as e:
            raise TritonModelException(f"tensor '{self._name}' cannot be exported: {e}") from None

    def __dlpack__(self, **kwargs: Any) -> object:
        if _is_bf16(self._array):
            return _export_bf16(self._array)
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        device: tuple[int, int] = self._array.__dlpack_device__()
        return device

    @staticmethod
    def from_dlpack(name: str, capsule: object) -> Tensor:
        """A tensor sharing the data of a DLPack capsule or of an object with ``__dlpack__``
        (host memory only).

        Raises:
            TritonModelException: the producer's data is not usable from numpy.
        """
        if isinstance(capsule, Tensor):
            return Tensor(name, capsule._array)
        producer = hasattr(capsule, "__dlpack__")
        try:
            if not producer:
                bf16 = _import_bf16(capsule)
                if bf16 is not None:
                    return Tensor(name, bf16)
            try:
                source = cast(Any, capsule if producer else _DLCapsule(capsule))
                return Tensor(name, np.from_dlpack(source))
            except (TypeError, BufferError, ValueError, RuntimeError) as e:
                # NOTE: numpy has no bfloat16: a producer's kDLBfloat capsule is read here
                bf16 = _import_bf16(cast(Any, capsule).__dlpack__()) if producer else None
                if bf16 is None:
                    raise e from None
                return Tensor(name, bf16)
        except (TypeError, BufferError, ValueError, RuntimeError) as e:
            raise TritonModelException(f"tensor '{name}': from_dlpack failed: {e}") from None

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, dtype={self._array.dtype}, shape={self._array.shape})"


# ---------------------------------------------------------------------------
# Requests and responses
# ---------------------------------------------------------------------------


def _tensor_data(tensor: Tensor) -> np.ndarray:
    """A tensor's array whatever its type (``as_numpy`` refuses BF16): what the backend
    writes out for an output or a BLS input."""
    return tensor._array  # noqa: SLF001 - pb_utils' own class


def _input_tensor(name: str, data: np.ndarray) -> Tensor:
    """A ``Tensor`` the backend builds from a request's input: ``name`` is a ``str`` and
    ``data`` an array already, so none of the constructor's checks apply (the hot path)."""
    t = Tensor.__new__(Tensor)
    t._name = name  # noqa: SLF001 - pb_utils' own class
    t._array = data  # noqa: SLF001
    return t


def _backend_request(
    model_name: str,
    outputs: list[str],
    inputs: list[Tensor],
    request_id: str,
    correlation_id: int | str,
    model_version: int,
    flags: int,
    timeout_us: int,
    parameters_json: str,
    key: object = None,
    sender_factory: Callable[[object], InferenceResponseSender] | None = None,
    cancelled: Callable[[object], bool] | None = None,
) -> InferenceRequest:
    """An ``InferenceRequest`` as the backend hands it to ``execute``: the constructor's
    result for arguments that are already ``str``, lists and a JSON string, without its
    conversions (one per request per batch: the hot path). ``sender_factory(key)`` makes the
    request's response sender when the model first asks for it and ``cancelled(key)``
    answers ``is_cancelled()``: two callables the backend builds once, and ``key`` its own
    handle of the request, so that no per-request closure is made for what most models never
    call."""
    r = InferenceRequest.__new__(InferenceRequest)
    r._trace = None  # noqa: SLF001 - pb_utils' own class
    r._model_name = model_name  # noqa: SLF001
    r._requested_output_names = outputs  # noqa: SLF001
    r._inputs = inputs  # noqa: SLF001
    r._request_id = request_id  # noqa: SLF001
    r._correlation_id = correlation_id  # noqa: SLF001
    r._model_version = model_version  # noqa: SLF001
    r._flags = flags  # noqa: SLF001
    r._timeout_us = timeout_us  # noqa: SLF001
    r._parameters = parameters_json  # noqa: SLF001
    r._sender = None  # noqa: SLF001
    r._key = key  # noqa: SLF001
    r._sender_factory = sender_factory  # noqa: SLF001
    r._cancelled = cancelled  # noqa: SLF001
    r._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL  # noqa: SLF001
    return r


def _text(value: object) -> str:
    """A string argument as Triton's python backend takes it: pybind hands ``str`` and
    ``bytes`` alike to a C++ ``std::string``, so ``bytes`` (``request.get_input_tensor_by_name(
    "MODEL").as_numpy()[0]`` in Triton's BLS example) are decoded as UTF-8 here; invalid
    sequences become U+FFFD (the name then matches nothing, as the raw bytes would in Triton).
    Anything else is ``str(value)``."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _texts(values: Iterable[object], what: str) -> list[str]:
    """A list-of-strings argument (``std::vector<std::string>`` in Triton): each element as
    ``_text`` takes it.

    Raises:
        TypeError: ``values`` is itself a ``str`` or ``bytes`` (pybind refuses those too;
            iterating would split it into characters).
    """
    if isinstance(values, str | bytes | bytearray):
        raise TypeError(f"{what} must be a list of strings, got a single {type(values).__name__}")
    return [_text(v) for v in values]


def _parameters_json(parameters: Mapping[str, object] | str | None) -> str:
    """Parameters as Triton hands them to models: a JSON object string ("{}" when none).

    A dict is checked as upstream's ``PyParametersToJSON`` checks it (pb_stub.cc): keys
    ``str``, values ``bool``, ``int`` or ``str``. A JSON string (a triton-mp extension,
    e.g. ``request.parameters()`` passed on) is taken as it is.

    Raises:
        TritonModelException: a key or a value of another type, with upstream's message
            ("Expect parameters keys to have type str, found type <class 'int'>").
    """
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        return parameters
    items = dict(parameters)
    for key, value in items.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return json.dumps(items)


class InferenceRequest:
    """One inference request, as ``execute`` receives it.

    The constructor has the signature of Triton's. ``model_name``, ``request_id`` and the
    ``requested_output_names`` may be ``str`` or UTF-8 ``bytes``, as Triton takes them.
    ``parameters`` may be a dict (keys -> bool/int/str) or a JSON string;
    ``parameters()`` returns the JSON string, as in Triton.

    Raises (from the constructor):
        TypeError: ``requested_output_names`` is a single string instead of a list.
    """

    __slots__ = (
        "_cancelled",
        "_correlation_id",
        "_flags",
        "_inputs",
        "_key",
        "_model_name",
        "_model_version",
        "_parameters",
        "_release_flags",
        "_request_id",
        "_requested_output_names",
        "_sender",
        "_sender_factory",
        "_timeout_us",
        "_trace",
    )

    def __init__(
        self,
        model_name: str | bytes = "",
        requested_output_names: Sequence[str | bytes] = (),
        inputs: Sequence[Tensor] = (),
        request_id: str | bytes = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: object = None,
        trace: object = None,
        parameters: dict[str, bool | int | str] | str | None = None,
    ) -> None:
        del preferred_memory  # NOTE: accepted for Triton's signature; host memory only
        self._trace = trace if isinstance(trace, InferenceTrace) else None
        self._model_name = _text(model_name)
        self._requested_output_names = _texts(requested_output_names, "requested_output_names")
        self._inputs = list(inputs)
        self._request_id = _text(request_id)
        self._correlation_id = correlation_id
        self._model_version = model_version
        self._flags = flags
        self._timeout_us = timeout
        self._parameters = _parameters_json(parameters)
        self._sender: InferenceResponseSender | None = None
        self._key: object = None
        """The backend's handle of a request ``execute`` received (None otherwise)."""
        self._sender_factory: Callable[[object], InferenceResponseSender] | None = None
        """Makes the response sender from ``_key`` (None: not a request ``execute`` got)."""
        self._cancelled: Callable[[object], bool] | None = None
        """Whether the request of ``_key`` is cancelled (None: never)."""
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def inputs(self) -> list[Tensor]:
        """The input tensors."""
        return self._inputs

    def get_input_tensor_by_name(self, name: str) -> Tensor | None:
        """The input named ``name``, or None."""
        for t in self._inputs:
            if t._name == name:  # NOTE: Tensor.name(), without the call (the hot path)
                return t
        return None

    def requested_output_names(self) -> set[str]:
        """The outputs the client asked for (all outputs when it named none): a new ``set``
        at each call, as 2.51's (pybind's form of pb_stub's ``std::set<std::string>``), so
        set operations work on it."""
        return set(self._requested_output_names)

    def request_id(self) -> str:
        """The client's request id ("" when it gave none)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence correlation id (0 outside sequences)."""
        return self._correlation_id

    def flags(self) -> int:
        """``TRITONSERVER_REQUEST_FLAG_*`` bits."""
        return self._flags

    def set_flags(self, flags: int) -> None:
        """Set the request flags."""
        self._flags = flags

    def timeout(self) -> int:
        """The request's timeout in microseconds (0 = none)."""
        return self._timeout_us

    def model_name(self) -> str:
        """The model the request is for."""
        return self._model_name

    def model_version(self) -> int:
        """The model version the request is for (-1 = latest)."""
        return self._model_version

    def parameters(self) -> str:
        """The request's parameters as a JSON object string."""
        return self._parameters

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request (python_backend's request cancellation):
        a gRPC call cancelled or past its deadline, a ModelStreamInfer stream closed with
        ``cancel_requests``; true inside a running ``execute`` within a few ms
        (``workers.execution_watch``) and, for a decoupled model, after it returned. An
        HTTP client closing its connection cancels too (Triton's HTTP endpoint does not).
        """
        return self._cancelled(self._key) if self._cancelled is not None else False

    def trace(self) -> InferenceTrace:
        """The request's trace: pass it as ``trace=`` to a BLS request to trace that
        request as a child of this one (an untraced request's trace carries nothing)."""
        return self._trace if self._trace is not None else InferenceTrace()

    def set_release_flags(self, flags: int) -> None:
        """How the model releases the request when ``execute`` returns:
        ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` runs it again in a later batch of the
        same sequence (``sequence_batching { iterative_sequence: true }``; a non-decoupled
        model returns None as its response), ``TRITONSERVER_REQUEST_RELEASE_ALL`` (the
        default) ends it. Stored as given, as upstream's ``SetReleaseFlags``; the backend
        acts on it after ``execute``."""
        self._release_flags = int(flags)

    def release_flags(self) -> int:
        """The release flags ``set_release_flags`` set (``RELEASE_ALL`` by default)."""
        return self._release_flags

    def get_response_sender(self) -> InferenceResponseSender:
        """The request's response sender (decoupled models: any number of responses; the
        default mode: one, and ``execute`` returns None for the request); the same object
        every call.

        Raises:
            TritonModelException: the request was not given to ``execute`` (a BLS request).
        """
        if self._sender is None:
            if self._sender_factory is None:
                raise TritonModelException(
                    "get_response_sender() is only available for the requests a model's "
                    "execute() receives",
                    TritonError.UNSUPPORTED,
                )
            self._sender = self._sender_factory(self._key)
        return self._sender

    def exec(self, decoupled: bool = False) -> Any:
        """BLS: run this request on ``model_name`` through the server's scheduler and wait.

        Returns:
            The ``InferenceResponse`` (decoupled=False); an error response for every
            failure (unknown model, the callee's error, ``timeout`` µs passed). With
            decoupled=True, an iterator over the callee's responses (the last one may be
            empty), with ``cancel()``.
        """
        if decoupled:
            return _ResponseIterator(self)
        box: list[InferenceResponse] = []
        done = threading.Event()

        def answer(response: InferenceResponse, final: bool) -> None:
            if not box:
                box.append(response)
            if final:
                done.set()

        cancel = _submit(self, False, answer)
        if not done.wait(self._timeout_s()):
            cancel()
            return self._timed_out()
        return box[0]

    async def async_exec(self, decoupled: bool = False) -> Any:
        """BLS without blocking the model's event loop (``async def execute``): as
        ``exec``; several calls may be awaited together (``asyncio.gather``)."""
        import asyncio

        if decoupled:
            return _ResponseIterator(self)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[InferenceResponse] = loop.create_future()

        def settle(response: InferenceResponse) -> None:
            if not fut.done():
                fut.set_result(response)

        def answer(response: InferenceResponse, final: bool) -> None:
            loop.call_soon_threadsafe(settle, response)

        cancel = _submit(self, False, answer)
        try:
            return await asyncio.wait_for(fut, self._timeout_s())
        except TimeoutError:
            cancel()
            return self._timed_out()

    def _timeout_s(self) -> float | None:
        """The BLS wait: ``timeout`` in seconds, None for no timeout."""
        return self._timeout_us / 1e6 if self._timeout_us > 0 else None

    def _timed_out(self) -> InferenceResponse:
        """The error response of a BLS request whose ``timeout`` passed."""
        return InferenceResponse(
            error=TritonError(
                f"BLS request to model '{self._model_name}' got no response within its "
                f"timeout of {self._timeout_us} us",
                _DEADLINE_EXCEEDED,
            )
        )


_DEADLINE_EXCEEDED = ErrorCode.DEADLINE_EXCEEDED
"""The code of a BLS response whose ``timeout`` passed (triton-mp's; Triton has none)."""

_bls_submit: Callable[[InferenceRequest, bool, Callable[[Any, bool], None]], Any] | None = None
_bls_ready: Callable[[str, int], bool] | None = None


def set_bls(
    submit: Callable[[InferenceRequest, bool, Callable[[Any, bool], None]], Any] | None,
    ready: Callable[[str, int], bool] | None = None,
) -> None:
    """Install the worker's BLS client: ``submit`` (``BlsClient.submit``) and ``ready``
    (``BlsClient.is_model_ready(name, version)``, -1 for any version, for
    ``is_model_ready``); None removes them."""
    global _bls_submit, _bls_ready  # noqa: PLW0603 - one client per worker process
    _bls_submit = submit
    _bls_ready = ready


def _submit(
    request: InferenceRequest, decoupled: bool, answer: Callable[[Any, bool], None]
) -> Callable[[], None]:
    if _bls_submit is None:
        answer(
            InferenceResponse(
                error=TritonError(
                    "BLS is only available inside a model served by triton-mp",
                    TritonError.UNSUPPORTED,
                )
            ),
            True,
        )
        return lambda: None
    cancel: Callable[[], None] = _bls_submit(request, decoupled, answer)
    return cancel


class _ResponseIterator:
    """The responses of a BLS request to a decoupled model, as they arrive."""

    def __init__(self, request: InferenceRequest) -> None:
        import queue

        self._queue: queue.Queue[InferenceResponse | None] = queue.Queue()
        self._timeout = request._timeout_s()
        self._model = request.model_name()
        self._ended = False

        def answer(response: InferenceResponse, final: bool) -> None:
            self._queue.put(response)
            if final:
                self._queue.put(None)

        self._cancel = _submit(request, True, answer)

    def __iter__(self) -> _ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        import queue

        if self._ended:
            raise StopIteration
        try:
            item = self._queue.get(timeout=self._timeout)
        except queue.Empty:
            self._ended = True
            self._cancel()
            return InferenceResponse(
                error=TritonError(
                    f"BLS request to model '{self._model}' got no response within its timeout",
                    _DEADLINE_EXCEEDED,
                )
            )
        if item is None:
            self._ended = True
            raise StopIteration
        return item

    def cancel(self) -> None:
        """Ask the callee to stop (it sees ``is_cancelled()``)."""
        self._cancel()


class InferenceResponseSender:
    """Sends the responses of one request (``request.get_response_sender()``): a decoupled
    model's, from any thread, at any time until the final one; a default-mode model's (since
    upstream's 24.07) one response from ``execute``, which then returns None for that
    request.

    Args:
        post: ``post(response_or_None, final)``; provided by the python backend.
        cancelled: ``cancelled()`` -> whether the client went away.
        decoupled: the model's transaction policy (upstream's ``UpdateStateAndCounters``
            allows a default-mode model one response, and no final flag before it).
    """

    __slots__ = ("__weakref__", "_cancelled", "_closed", "_decoupled", "_lock", "_post", "_sent")

    def __init__(
        self,
        post: Callable[[InferenceResponse | None, bool], None],
        cancelled: Callable[[], bool],
        decoupled: bool = True,
    ) -> None:
        self._post = post
        self._cancelled = cancelled
        self._closed = False
        self._lock = threading.Lock()
        self._decoupled = decoupled
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send one response, and/or end the request with
        ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (the response is optional then).

        Raises:
            TritonModelException: ``flags`` is neither 0 nor the final flag, ``response`` is
                None without the final flag (upstream's messages), the sender is closed
                already (a final response was sent), ``response`` is not an
                ``InferenceResponse``, or its outputs cannot be sent (a requested output
                missing, no room in shared memory).
        """
        # NOTE: upstream's CheckResponseSenderArguments (response_sender.cc), in its order.
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if response is None and not final:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"send() takes a pb_utils.InferenceResponse, got {type(response).__name__}"
            )
        with self._lock:
            self._count(response, final)
            self._post(response, final)

    def _count(self, response: InferenceResponse | None, final: bool) -> None:
        """Upstream's ``UpdateStateAndCounters``: its checks, in its order, then the count
        and the closing (under the lock)."""
        if not self._decoupled:
            if response is not None and self._sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response."
                )
            if response is None and final and self._sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final "
                    "before sending a response."
                )
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if response is not None:
            self._sent += 1
        if final:
            self._closed = True

    def _returned(self, response: InferenceResponse) -> None:
        """A default-mode ``execute`` returned ``response`` for this request: counted as a
        final send (upstream's ProcessReturnedResponses), so one the model already sent
        raises "... cannot send more than one response."."""
        with self._lock:
            self._count(response, True)

    def is_cancelled(self) -> bool:
        """Whether the client went away (see ``InferenceRequest.is_cancelled``)."""
        return self._cancelled()

    def is_closed(self) -> bool:
        """Whether the final response was sent (triton-mp addition)."""
        return self._closed

    def _claim(self) -> bool:
        """Close the sender without sending; True when it was open (the backend then
        sends the final response itself)."""
        with self._lock:
            was_open = not self._closed
            self._closed = True
            return was_open

    def __del__(self) -> None:
        # NOTE: a sender dropped without its final response would leave the client waiting
        # (and the request's memory held): end the request with a flags-only response.
        if not self._closed and self._claim():
            _log.warning(
                "a response sender was dropped without TRITONSERVER_RESPONSE_COMPLETE_FINAL; "
                "ending its request"
            )
            try:
                self._post(None, True)
            except Exception:  # noqa: BLE001 - nothing to report to from a finaliser
                _log.exception("could not end the request of a dropped response sender")


class InferenceResponse:
    """The answer to one request: output tensors, or an error that fails that request.

    ``parameters`` (a dict of str -> bool/int/str, or a JSON object string) go to the client
    as the response's parameters (gRPC ``ModelInferResponse.parameters``, HTTP's
    ``"parameters"`` object), as in Triton since 24.xx; ``parameters()`` returns them as a
    JSON string, also on a BLS response, where they are the called model's.

    Raises (from the constructor):
        TritonModelException: a parameter key or value of another type (upstream's words).
    """

    __slots__ = ("_error", "_output_tensors", "_parameters")

    def __init__(
        self,
        output_tensors: Iterable[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, bool | int | str] | str | None = None,
    ) -> None:
        self._output_tensors = list(output_tensors) if output_tensors is not None else []
        self._error = error
        self._parameters = "{}" if parameters is None else _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        """The output tensors."""
        return self._output_tensors

    def has_error(self) -> bool:
        """Whether the response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """The error, or None."""
        return self._error

    def parameters(self) -> str:
        """The response's parameters as a JSON object string."""
        return self._parameters


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The input of ``inference_request`` named ``name``, or None."""
    if type(inference_request) is InferenceRequest:
        # NOTE: the method's loop, inlined for pb_utils' own class (the hot path; called per
        # input per request by nearly every model).
        for t in inference_request._inputs:  # noqa: SLF001
            if t._name == name:  # noqa: SLF001
                return t
        return None
    return inference_request.get_input_tensor_by_name(name)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The output of ``inference_response`` named ``name``, or None."""
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


# ---------------------------------------------------------------------------
# Model configuration helpers
# ---------------------------------------------------------------------------


def _io_config_by_name(model_config: dict[str, Any], key: str, name: str) -> dict[str, Any] | None:
    for item in model_config.get(key) or ():
        if item.get("name") == name:
            return dict(item)
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry (a dict) of input ``name``, or None."""
    return _io_config_by_name(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry (a dict) of output ``name``, or None."""
    return _io_config_by_name(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether the config sets ``model_transaction_policy { decoupled: true }``."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


_INPUT_KEYS = frozenset({"name", "data_type", "dims", "optional"})
_OUTPUT_KEYS = frozenset({"name", "data_type", "dims"})


class ModelConfig:
    """The configuration ``auto_complete_config`` receives and returns.

    Holds Triton's JSON form of the model config (every field printed). ``as_dict()`` gives
    that dict; the setters complete it and raise ``ValueError`` on a conflict with what the
    config file already says.

    Args:
        model_config: the config as a dict or a JSON string.
    """

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        self._config: dict[str, Any] = (
            json.loads(model_config) if isinstance(model_config, str) else model_config
        )

    def _model_name(self) -> str:
        return str(self._config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        """The configuration (treat it as read-only; use the setters to change it)."""
        return self._config

    def max_batch_size(self) -> int:
        """The configuration's max_batch_size (0 when unset)."""
        return int(self._config.get("max_batch_size", 0) or 0)

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size.

        A non-zero value in the config file is kept when it does not exceed
        ``max_batch_size`` (a config may ask for less than the model allows).

        Raises:
            ValueError: not a non-negative int, or the config already has a larger non-zero
                value.
        """
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, (int, np.integer)):
            raise ValueError(f"max_batch_size must be an int, got {type(max_batch_size).__name__}")
        wanted = int(max_batch_size)
        if wanted < 0:
            raise ValueError(f"max_batch_size must be non-negative, got {wanted}")
        current = self.max_batch_size()
        if current > wanted:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._model_name()}' specified max_batch_size {wanted}"
            )
        if current == 0:
            self._config["max_batch_size"] = wanted

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher (default settings) unless the config chose it already.

        Raises:
            ValueError: the config sets sequence batching or ensemble scheduling.
        """
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._model_name()}' tries to "
                    "set scheduling_choice as 'dynamic_batching'"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's name
        """Add an input (keys name, data_type, dims, optional), or complete the one of the
        same name.

        Raises:
            ValueError: other keys, a missing required key, or a conflict with the input of
                that name in the config.
        """
        self._add_io("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output (keys name, data_type, dims), or complete the one of the same name.

        Raises:
            ValueError: other keys, a missing required key, or a conflict with the output of
                that name in the config.
        """
        self._add_io("output", output, _OUTPUT_KEYS)

    def _add_io(self, key: str, item: dict[str, Any], allowed: frozenset[str]) -> None:
        if not isinstance(item, dict):
            raise ValueError(f"{key} must be a dict, got {type(item).__name__}")
        extra = sorted(set(item) - allowed)
        if extra:
            raise ValueError(
                f"{key} of model '{self._model_name()}' has unexpected properties {extra}; "
                f"allowed: {sorted(allowed)}"
            )
        for required in ("name", "data_type", "dims"):
            if required not in item:
                raise ValueError(
                    f"{key} of model '{self._model_name()}' is missing property '{required}'"
                )
        name = str(item["name"])
        data_type = str(item["data_type"])
        dims = [int(d) for d in item["dims"]]
        entries: list[dict[str, Any]] = self._config.setdefault(key, [])
        for entry in entries:
            if entry.get("name") != name:
                continue
            have_type = entry.get("data_type", "TYPE_INVALID")
            if have_type not in ("", "TYPE_INVALID") and have_type != data_type:
                raise ValueError(
                    f"unable to add {key} '{name}' of model '{self._model_name()}': the "
                    f"configuration has data_type {have_type}, auto-complete gives {data_type}"
                )
            have_dims = [int(d) for d in entry.get("dims") or ()]
            if have_dims and have_dims != dims:
                raise ValueError(
                    f"unable to add {key} '{name}' of model '{self._model_name()}': the "
                    f"configuration has dims {have_dims}, auto-complete gives {dims}"
                )
            entry["data_type"] = data_type
            entry["dims"] = dims
            if "optional" in item:
                entry["optional"] = bool(item["optional"])
            return
        new: dict[str, Any] = {"name": name, "data_type": data_type, "dims": dims}
        if "optional" in item:
            new["optional"] = bool(item["optional"])
        entries.append(new)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set ``model_transaction_policy`` (only the ``decoupled`` key).

        Raises:
            ValueError: other keys, or the config already says otherwise.
        """
        extra = sorted(set(transaction_policy_dict) - {"decoupled"})
        if extra:
            raise ValueError(
                f"model_transaction_policy of model '{self._model_name()}' has unexpected "
                f"properties {extra}; allowed: ['decoupled']"
            )
        wanted = bool(transaction_policy_dict.get("decoupled", False))
        policy = self._config.get("model_transaction_policy")
        if policy is not None and bool(policy.get("decoupled", False)) != wanted:
            raise ValueError(
                f"configuration of model '{self._model_name()}' specified decoupled "
                f"{bool(policy.get('decoupled', False))}, auto-complete gives {wanted}"
            )
        self._config["model_transaction_policy"] = {"decoupled": wanted}


# ---------------------------------------------------------------------------
# Custom metrics
# ---------------------------------------------------------------------------


class MetricKind(IntEnum):
    """Kinds of ``MetricFamily`` (``MetricFamily.COUNTER`` ... in Triton's API)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class MetricRecord(NamedTuple):
    """One metric as the store publishes it (see ``MetricStore.publish``)."""

    labels: tuple[tuple[str, str], ...]
    """Label (name, value) pairs, sorted by name."""
    slot: int
    """Index of its first float64 slot in ``MetricStore.values``."""
    created_ns: int
    """CLOCK_MONOTONIC ns when this process created it."""
    buckets: tuple[float, ...] | None
    """Upper bounds of a histogram's buckets (+Inf implied); None for other kinds."""


class MetricFamilyRecord(NamedTuple):
    """One family as the store publishes it."""

    name: str
    kind: MetricKind
    description: str
    created_ns: int
    """CLOCK_MONOTONIC ns when this process created it."""
    metrics: tuple[MetricRecord, ...]


class MetricStore(Protocol):
    """Where this process's metric values live: an array of float64 slots that the metric
    operations write in place, and the catalog that says which slots are whose.

    The python backend installs one in shared memory (``set_metric_store``), which the
    server's metrics endpoint reads at scrape time (``ipc.memory.metric_board`` documents the
    slots of each kind). Every call is made under the registry's lock.
    """

    @property
    def values(self) -> memoryview[float]:
        """The slots: a writable memoryview of format ``"d"`` (may change after ``grow``)."""
        ...

    def grow(self, slot_count: int) -> None:
        """Make room for at least ``slot_count`` slots, keeping their values."""
        ...

    def publish(self, families: Sequence[MetricFamilyRecord]) -> None:
        """Replace the catalog: every family and its metrics."""
        ...


class _LocalStore:
    """Process-local slots (no server: unit tests, the auto-complete child)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.values = memoryview(self._buf).cast("d")

    def grow(self, slot_count: int) -> None:
        if slot_count <= len(self.values):
            return
        buf = bytearray(slot_count * 8)
        buf[: len(self._buf)] = self._buf
        self.values.release()
        self._buf = buf
        self.values = memoryview(buf).cast("d")

    def publish(self, families: Sequence[MetricFamilyRecord]) -> None:
        del families


_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_KIND_NAMES = {
    MetricKind.COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER",
    MetricKind.GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
    MetricKind.HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM",
}
_CLEARED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
    "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
    "been deleted."
)


class _FamilyState:
    """A family of the registry: what every ``MetricFamily`` of that name refers to."""

    __slots__ = ("created_ns", "description", "kind", "metrics", "name")

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.created_ns = time.monotonic_ns()
        self.metrics: dict[tuple[tuple[str, str], ...], _MetricState] = {}


class _MetricState:
    """One series of a family (one label set): its slots and how many handles share it."""

    __slots__ = ("buckets", "created_ns", "labels", "refs", "slot", "slot_count")

    def __init__(
        self, labels: tuple[tuple[str, str], ...], buckets: tuple[float, ...] | None, slot: int
    ) -> None:
        self.labels = labels
        self.buckets = buckets
        self.slot = slot
        self.slot_count = _slot_count(buckets)
        self.created_ns = time.monotonic_ns()
        self.refs = 0


def _slot_count(buckets: tuple[float, ...] | None) -> int:
    """Slots of one metric (``ipc.memory.metric_board`` has the layout): a counter or gauge 2
    (value, time of the last set), a histogram 2 + its bucket bounds (sum, then one count
    per bucket and one for +Inf)."""
    return 2 if buckets is None else 2 + len(buckets)


class _MetricRegistry:
    """This process's metric families: Triton's server-wide registry, seen from one model
    instance (each instance is one process; ``ipc.memory.metric_board`` says how the metrics
    endpoint merges them).

    Rules (Triton core ``metric_family.cc`` over prometheus-cpp): a family name is created
    once; creating it again with the same kind gives the same family (the first description
    stays), with another kind fails; families are never removed. A label set is created
    once per family; creating it again gives the same series, shared (a histogram keeps its
    first buckets). A series goes when every ``Metric`` handle on it is released, which
    happens when the ``MetricFamily`` handle that created the handle is deleted (that
    family keeps its handles, as Triton's does).

    Args:
        store_factory: makes the store on first use (None: process-local memory).
        owner: the model instance named in errors (Triton's stub names it the same way).
    """

    def __init__(
        self, store_factory: Callable[[], MetricStore] | None = None, owner: str = ""
    ) -> None:
        self.lock = threading.Lock()
        self.owner = owner
        self._factory: Callable[[], MetricStore] = store_factory or _LocalStore
        self._store: MetricStore | None = None
        self._families: dict[str, _FamilyState] = {}
        self._free: list[tuple[int, int]] = []
        """Released slot ranges (first slot, count), reused first-fit."""
        self._top = 0
        """Slots ever handed out from the end."""
        self.pending: list[tuple[_FamilyState, _MetricState]] = []
        """Releases waiting for the lock (``release_later``)."""

    @property
    def store(self) -> MetricStore:
        if self._store is None:
            self._store = self._factory()
        return self._store

    def error(self, operation: str, message: str, code: int) -> TritonModelException:
        """An error raised by the server side of an operation, worded as Triton's stub
        relays it."""
        return TritonModelException(
            f"{operation}: Failed to process the request for model '{self.owner}', "
            f"message: {message}",
            code,
        )

    def family(self, name: str, description: str, kind: MetricKind) -> _FamilyState:
        """The family ``name`` (created now unless it exists with ``kind``).

        Raises:
            TritonModelException (INVALID_ARG): an invalid name, or the name exists with
                another kind.
        """
        with self.lock:
            found = self._families.get(name)
            if found is not None:
                if found.kind is not kind:
                    raise self.error(
                        "Error when creating MetricFamily",
                        "Family name already exists with different type",
                        TritonError.INVALID_ARG,
                    )
                family = found
            elif not _METRIC_NAME.match(name) or name.startswith("__"):
                raise self.error(
                    "Error when creating MetricFamily",
                    "Invalid metric name",
                    TritonError.INVALID_ARG,
                )
            else:
                family = _FamilyState(name, description, kind)
                self._families[name] = family
                self._publish()
        self.drain()
        return family

    def add_metric(
        self,
        family: _FamilyState,
        labels: tuple[tuple[str, str], ...],
        buckets: tuple[float, ...] | None,
    ) -> _MetricState:
        """The series of ``labels`` in ``family`` (created now unless it exists), with one
        more reference.

        Raises:
            TritonModelException (INVALID_ARG): an invalid label name, or a new histogram's
                buckets are not strictly increasing.
        """
        with self.lock:
            state = family.metrics.get(labels)
            if state is None:
                for key, _ in labels:
                    if (
                        not _LABEL_NAME.match(key)
                        or key.startswith("__")
                        or (family.kind is MetricKind.HISTOGRAM and key == "le")
                    ):
                        raise self.error(
                            "Error when creating Metric",
                            "Invalid label name",
                            TritonError.INVALID_ARG,
                        )
                if buckets is not None and any(a >= b for a, b in itertools.pairwise(buckets)):
                    raise self.error(
                        "Error when creating Metric",
                        "Bucket Boundaries must be strictly sorted",
                        TritonError.INVALID_ARG,
                    )
                state = _MetricState(labels, buckets, self._alloc(_slot_count(buckets)))
                family.metrics[labels] = state
                self._publish()
            state.refs += 1
        self.drain()
        return state

    def release_later(self, family: _FamilyState, state: _MetricState) -> None:
        """Drop one reference to ``state``; the series goes (its slots are reused) at the
        last. Safe from a finaliser, which may run inside a locked section of this very
        thread (garbage collection): the release waits in ``pending`` until the lock is
        free; every operation applies what waits once it has released the lock
        (``drain``)."""
        self.pending.append((family, state))
        self.drain()

    def drain(self) -> None:
        """Apply waiting releases (called after every locked section that saw some)."""
        while self.pending and self.lock.acquire(blocking=False):
            try:
                self._apply_pending()
            finally:
                self.lock.release()

    def _apply_pending(self) -> None:
        changed = False
        while self.pending:
            family, state = self.pending.pop()
            state.refs -= 1
            if state.refs > 0 or family.metrics.get(state.labels) is not state:
                continue
            del family.metrics[state.labels]
            self._free.append((state.slot, state.slot_count))
            changed = True
        if changed:
            self._publish()

    def _alloc(self, count: int) -> int:
        """``count`` zeroed slots: a released range that fits, else new ones at the end."""
        for i, (start, n) in enumerate(self._free):
            if n >= count:
                if n == count:
                    del self._free[i]
                else:
                    self._free[i] = (start + count, n - count)
                break
        else:
            start = self._top
            self._top += count
            store = self.store
            if self._top > len(store.values):
                store.grow(max(self._top, 2 * len(store.values), 64))
        values = self.store.values
        for i in range(start, start + count):
            values[i] = 0.0
        return start

    def _publish(self) -> None:
        self.store.publish(
            [
                MetricFamilyRecord(
                    f.name,
                    f.kind,
                    f.description,
                    f.created_ns,
                    tuple(
                        MetricRecord(m.labels, m.slot, m.created_ns, m.buckets)
                        for m in f.metrics.values()
                    ),
                )
                for f in self._families.values()
            ]
        )


_metrics = _MetricRegistry()


def set_metric_store(store_factory: Callable[[], MetricStore] | None, owner: str = "") -> None:
    """Install where this process's custom metrics live (the python backend does, before it
    imports the model; ``owner`` is the instance name its errors give). Starts an empty
    registry; handles made before keep the old one. None: process-local memory."""
    global _metrics  # noqa: PLW0603 - one registry per worker process, as Triton has one
    _metrics = _MetricRegistry(store_factory, owner)


def _number(value: object) -> float:
    """A metric operation's argument (a C++ ``double`` in Triton).

    Raises:
        TypeError: not a real number (strings included, which pybind refuses too).
    """
    if isinstance(value, str | bytes | bytearray):
        raise TypeError(f"a metric value must be a number, got {type(value).__name__}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(f"a metric value must be a number, got {type(value).__name__}") from None


class Metric:
    """One series of a ``MetricFamily`` (``family.Metric(labels=..., buckets=...)``).

    Operations by kind, as Triton allows them: counter ``increment`` (by non-negative
    values) and ``value``; gauge ``increment`` (any sign), ``set`` and ``value``; histogram
    ``observe``. The others raise ``TritonModelException``. Values are doubles.

    Across instances: this process's series with the same family name and labels are one
    (shared by every handle); the metrics endpoint adds up the series of every instance of
    every model with that name and labels (``ipc.memory.metric_board``), but ``value()`` is this
    instance's own part.
    """

    __slots__ = ("__weakref__", "_cleared", "_family", "_registry", "_state")

    def __init__(
        self, registry: _MetricRegistry, family: _FamilyState, state: _MetricState
    ) -> None:
        self._registry = registry
        self._family = family
        self._state = state
        self._cleared = False

    def _refusal(self, operation: str, verb: str, allowed: bool) -> TritonModelException | None:
        """Why ``verb`` may not run now (the family was deleted, or ``allowed`` is False
        for this kind), else None. Called under the registry's lock."""
        if self._cleared:
            return TritonModelException(f"{operation}: {_CLEARED}")
        if allowed:
            return None
        return self._registry.error(
            operation,
            f"{_KIND_NAMES[self._family.kind]} does not support {verb}",
            TritonError.UNSUPPORTED,
        )

    def increment(self, value: float) -> None:
        """Add ``value`` (counters: non-negative only; gauges: either sign).

        Raises:
            TritonModelException: a histogram, a negative counter increment, or the
                ``MetricFamily`` that made this metric was deleted.
            TypeError: ``value`` is not a number.
        """
        operation = "Failed to increment metric value"
        v = _number(value)
        registry = self._registry
        with registry.lock:
            error = self._refusal(
                operation, "Increment", self._family.kind is not MetricKind.HISTOGRAM
            )
            if error is None and self._family.kind is MetricKind.COUNTER and v < 0.0:
                error = registry.error(
                    operation,
                    "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically "
                    "by non-negative values.",
                    TritonError.INVALID_ARG,
                )
            if error is None:
                registry.store.values[self._state.slot] += v
        if registry.pending:
            registry.drain()
        if error is not None:
            raise error

    def set(self, value: float) -> None:
        """Set a gauge to ``value``.

        Raises:
            TritonModelException: not a gauge, or the ``MetricFamily`` was deleted.
            TypeError: ``value`` is not a number.
        """
        v = _number(value)
        registry = self._registry
        with registry.lock:
            error = self._refusal(
                "Failed to set metric value", "Set", self._family.kind is MetricKind.GAUGE
            )
            if error is None:
                values = registry.store.values
                values[self._state.slot] = v
                values[self._state.slot + 1] = float(time.monotonic_ns())
        if registry.pending:
            registry.drain()
        if error is not None:
            raise error

    def observe(self, value: float) -> None:
        """Count ``value`` in a histogram: its sum, and the first bucket whose bound is
        >= ``value`` (NaN and values above every bound: the +Inf bucket).

        Raises:
            TritonModelException: not a histogram, or the ``MetricFamily`` was deleted.
            TypeError: ``value`` is not a number.
        """
        v = _number(value)
        registry = self._registry
        with registry.lock:
            error = self._refusal(
                "Failed to observe metric value",
                "Observe",
                self._family.kind is MetricKind.HISTOGRAM,
            )
            if error is None:
                buckets = self._state.buckets or ()
                index = len(buckets) if math.isnan(v) else bisect.bisect_left(buckets, v)
                values = registry.store.values
                values[self._state.slot] += v
                values[self._state.slot + 1 + index] += 1.0
        if registry.pending:
            registry.drain()
        if error is not None:
            raise error

    def value(self) -> float:
        """The counter's or gauge's value (this instance's part, see the class doc).

        Raises:
            TritonModelException: a histogram, or the ``MetricFamily`` was deleted.
        """
        registry = self._registry
        result = 0.0
        with registry.lock:
            error = self._refusal(
                "Failed to get metric value", "Value", self._family.kind is not MetricKind.HISTOGRAM
            )
            if error is None:
                result = float(registry.store.values[self._state.slot])
        if registry.pending:
            registry.drain()
        if error is not None:
            raise error
        return result

    def _clear(self) -> None:
        """Release the series (once): its family handle is going away."""
        if not self._cleared:
            self._cleared = True
            self._registry.release_later(self._family, self._state)


_MetricHandle = Metric


def _release_metrics(metrics: list[Metric]) -> None:
    """A ``MetricFamily`` handle was deleted: its metrics go with it (Triton's stub)."""
    for metric in metrics:
        metric._clear()  # noqa: SLF001 - the family owns its metrics' lifetime
    metrics.clear()


def _metric_kind(kind: object) -> MetricKind:
    if isinstance(kind, MetricKind):
        return kind
    if isinstance(kind, int) and not isinstance(kind, bool) and kind in (0, 1, 2):
        return MetricKind(kind)
    raise TypeError(
        "kind must be MetricFamily.COUNTER, MetricFamily.GAUGE or MetricFamily.HISTOGRAM, "
        f"got {kind!r}"
    )


class MetricFamily:
    """A named family of custom metrics, shown on the server's ``/metrics`` endpoint.

    ``MetricFamily(name, description, kind)`` with ``kind`` one of ``MetricFamily.COUNTER``,
    ``GAUGE``, ``HISTOGRAM``; ``family.Metric(labels={...}, buckets=[...])`` makes one series
    (``buckets``: the upper bounds of a histogram's buckets, required for histograms only).
    Rules are Triton's (see ``_MetricRegistry``). Deleting the family deletes the metrics it
    made; a ``Metric`` used after that raises.

    Raises (from the constructor):
        TritonModelException: an invalid name (Prometheus: ``[a-zA-Z_:][a-zA-Z0-9_:]*``,
            not starting with ``__``), or the name exists with another kind.
        TypeError: ``kind`` is not one of the three.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    __slots__ = ("__weakref__", "_metrics", "_registry", "_state")

    def __init__(self, name: str | bytes, description: str | bytes, kind: MetricKind) -> None:
        self._registry = _metrics
        self._state = self._registry.family(_text(name), _text(description), _metric_kind(kind))
        self._metrics: list[Metric] = []
        weakref.finalize(self, _release_metrics, self._metrics)

    def Metric(  # noqa: N802 - Triton's name
        self,
        labels: dict[str, str] | None = None,
        buckets: list[float] | None = None,
    ) -> _MetricHandle:
        """A metric of this family with ``labels`` (string to string; None: no labels).

        Raises:
            TritonModelException: labels not a dict or with non-string values or invalid
                names; buckets not a list, given to a counter or gauge, missing for a
                histogram, or not strictly increasing.
        """
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        pairs = []
        for key, val in (labels or {}).items():
            if not isinstance(val, str):
                raise self._registry.error(
                    "Error when creating Metric",
                    f"label '{key}' has a {type(val).__name__} value; label values are strings",
                    TritonError.INVALID_ARG,
                )
            pairs.append((str(key), val))
        kind = self._state.kind
        bounds: tuple[float, ...] | None = None
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if kind is not MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = tuple(_number(b) for b in buckets)
        elif kind is MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        state = self._registry.add_metric(self._state, tuple(sorted(pairs)), bounds)
        metric = _MetricHandle(self._registry, self._state, state)
        self._metrics.append(metric)
        return metric


# ---------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------


class LogLevel:
    """Levels of ``Logger.log``."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


class Logger:
    """The model's logger: lines go to the server's log (logger ``triton_mp.model``).

    Usable as the class (``pb_utils.Logger.log_info(...)``) or an instance. Verbose lines
    appear with ``--log-verbose`` > 0. As in Triton, the levels are also attributes of the
    class (``logger.log("msg", logger.WARNING)``, ``Logger.LogLevel.ERROR``); messages may
    be ``str`` or UTF-8 ``bytes``.
    """

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str | bytes, level: int = LogLevel.INFO) -> None:
        """Log ``message`` at ``level`` (a ``LogLevel`` value; others log at INFO)."""
        _log.log(_LEVELS.get(level, logging.INFO), "%s", _text(message))

    @staticmethod
    def log_info(message: str | bytes) -> None:
        """Log at INFO."""
        _log.info("%s", _text(message))

    @staticmethod
    def log_warn(message: str | bytes) -> None:
        """Log at WARNING."""
        _log.warning("%s", _text(message))

    @staticmethod
    def log_error(message: str | bytes) -> None:
        """Log at ERROR."""
        _log.error("%s", _text(message))

    @staticmethod
    def log_verbose(message: str | bytes) -> None:
        """Log at DEBUG (Triton's verbose)."""
        _log.debug("%s", _text(message))


class PreferredMemory:
    """Where BLS outputs should be placed: ``PreferredMemory(preferred_memory_type,
    preferred_device_id=0)`` with ``TRITONSERVER_MEMORY_CPU`` or ``_GPU``, as in Triton
    (accepted for ``InferenceRequest(preferred_memory=...)``; host memory is used)."""

    def __init__(
        self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0
    ) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace (``request.trace()``), to pass on to BLS requests as Triton's
    examples do: a BLS request made with the trace of a traced request is traced too, as
    its child (``parent_id`` in the trace file).

    Args:
        level: the parent's trace level bits (0: the parent is not traced).
        parent: the worker's key of the parent request (where the child's trace goes).
    """

    __slots__ = ("level", "parent")

    def __init__(self, level: int = 0, parent: object = None) -> None:
        self.level = level
        self.parent = parent

    def get_context(self) -> str | None:
        """The OpenTelemetry context of the trace (Triton's); None: it is not exposed."""
        return None


# ---------------------------------------------------------------------------
# The model's place and other models
# ---------------------------------------------------------------------------

_model_dir = ""


def set_model_dir(model_dir: str) -> None:
    """Record the directory ``get_model_dir`` gives (the python backend, before it imports
    model.py; the auto-complete child likewise)."""
    global _model_dir  # noqa: PLW0603 - one model per process
    _model_dir = model_dir


def get_model_dir() -> str:
    """The directory of the model's ``model.py`` (its version directory), as Triton gives
    it during ``auto_complete_config`` and ``initialize``."""
    return _model_dir


_control_load: Callable[[str, str, dict[str, bytes]], None] | None = None
_control_unload: Callable[[str, bool], None] | None = None
_instance_name = ""


def set_model_control(
    load: Callable[[str, str, dict[str, bytes]], None] | None,
    unload: Callable[[str, bool], None] | None,
    instance_name: str = "",
) -> None:
    """Install the worker's model control (``workers.bls.model_control_client``: ``load(name,
    config, files)`` and ``unload(name, unload_dependents)``, raising ``TritonMPError``) and
    the instance's name (upstream's messages name it); None removes them."""
    global _control_load, _control_unload, _instance_name  # noqa: PLW0603 - one per process
    _control_load, _control_unload, _instance_name = load, unload, instance_name


def _control_error(what: str, message: str, code: int) -> TritonModelException:
    """Upstream's wording of a failed request to the parent process (pb_stub.h
    ``SendMessage``, model_loader.cc): "<what>: Failed to process the request for model
    '<instance>', message: <the core's message>"."""
    return TritonModelException(
        f"{what}: Failed to process the request for model '{_instance_name}', message: {message}",
        code,
    )


_STOL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _version_number(version_text: str) -> int:
    """``model_version`` read as upstream's ``GetModelVersionFromString`` (``std::stol``:
    leading blanks, a sign, the longest run of digits; -1 when empty).

    Raises:
        TritonModelException: no number, one outside int64, or a negative one, with
            upstream's message.
    """
    if not version_text:
        return -1
    prefix = (
        "Failed to check model readiness",
        f"failed to get model version from specified version string '{version_text}'",
    )
    match = _STOL.match(version_text)
    version = int(match.group(1)) if match else None
    if version is None or not -(2**63) <= version < 2**63:
        raise _control_error(
            prefix[0], f"{prefix[1]} (details: stol), version should be an integral value > 0",
            TritonError.INTERNAL,
        )  # fmt: skip
    if version < 0:
        raise _control_error(
            prefix[0], f"{prefix[1]}, version should be an integral value > 0",
            TritonError.INTERNAL,
        )  # fmt: skip
    return version


def is_model_ready(model_name: str | bytes, model_version: str | bytes = "") -> bool:
    """Whether the server serves ``model_name`` (``model_version``: a version number as a
    string; "" for the latest), as far as this model's BLS sees the server's models, and the
    model's own ``is_ready()`` (every instance's, when it has one) says so, as core
    ``ModelIsReady``; an unknown model is not ready (as Triton 2.51 answers).

    Raises:
        TritonModelException: ``model_version`` is not a non-negative number (upstream's
            "Failed to check model readiness: ... version should be an integral value > 0"),
            or this is not a model served by triton-mp (no BLS).
    """
    version = _version_number(_text(model_version))
    if _bls_ready is None:
        raise TritonModelException(
            "is_model_ready is only available inside a model served by triton-mp",
            TritonError.UNSUPPORTED,
        )
    return _bls_ready(_text(model_name), version)


def load_model(
    model_name: str | bytes, config: str = "", files: dict[str, bytes] | None = None
) -> None:
    """Load (or reload) ``model_name`` through the server's model control, as Triton's
    RepositoryModelLoad: ``config`` a JSON ModelConfig used instead of config.pbtxt ("":
    none), ``files`` ``{"file:<version>/<name>": bytes}`` model files (they need
    ``config``). Returns once the model is loaded. Explicit model control mode only.

    Raises:
        TritonModelException: ``files`` is not a dict (upstream's message), or the load
            failed: "Failed to load model: Failed to process the request for model
            '<this instance>', message: <the client API's message>" (e.g. "explicit model
            load / unload is not allowed if polling is enabled").
    """
    name = _text(model_name)
    contents: dict[str, bytes] = {}
    if files is not None:
        if not isinstance(files, dict):
            raise TritonModelException(
                f"failed to load model '{name}', files should be a dictionary of file paths "
                "and file contents"
            )
        for key, value in files.items():
            if not isinstance(value, bytes | bytearray):
                raise TypeError(
                    f"Unable to cast Python instance of type {type(value)} to C++ type "
                    "'pybind11::bytes'"
                )
            contents[_text(key)] = bytes(value)
    if _control_load is None:
        raise TritonModelException(
            "load_model is only available inside a model served by triton-mp",
            TritonError.UNSUPPORTED,
        )
    try:
        _control_load(name, _text(config), contents)
    except Exception as e:  # noqa: BLE001 - the server's refusal, in upstream's words
        raise _control_error(
            "Failed to load model", getattr(e, "message", str(e)), _code_of(e)
        ) from None


def unload_model(model_name: str | bytes, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` through the server's model control, as Triton's
    RepositoryModelUnload (``unload_dependents``: the ensembles that use it too). Returns
    once the unload began (it finishes when the model's in-flight requests are answered).
    Explicit model control mode only.

    Raises:
        TritonModelException: "Failed to unload model: Failed to process the request for
            model '<this instance>', message: <the client API's message>".
    """
    if _control_unload is None:
        raise TritonModelException(
            "unload_model is only available inside a model served by triton-mp",
            TritonError.UNSUPPORTED,
        )
    try:
        _control_unload(_text(model_name), bool(unload_dependents))
    except Exception as e:  # noqa: BLE001 - the server's refusal, in upstream's words
        raise _control_error(
            "Failed to unload model", getattr(e, "message", str(e)), _code_of(e)
        ) from None


def _code_of(exc: Exception) -> int:
    """The error code a ``TritonMPError`` carries (INTERNAL for anything else); upstream's
    exception is a plain ``TritonModelException`` either way."""
    code = getattr(exc, "code", None)
    return int(code) if isinstance(code, int) else TritonError.INTERNAL
