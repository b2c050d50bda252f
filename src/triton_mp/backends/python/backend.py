"""The python backend: runs a Triton ``model.py`` (class ``TritonPythonModel``) unchanged.

Imported only by worker processes (through ``backends.registry``); how ``model.py`` is
imported is ``backends.python.model_module``'s, how what ``execute`` returns becomes results is
``backends.python.responses``'.

Lifecycle, as in Triton's python backend (shared/reference/triton.md §7): our ``pb_utils``
becomes ``triton_python_backend_utils``; ``model.py`` is imported under a unique module name
with its version directory and model directory on ``sys.path``; ``TritonPythonModel()`` is
constructed and ``initialize(args)`` called with Triton's ``args`` keys; each batch the
scheduler forms is passed to ``execute`` as a list of ``pb_utils.InferenceRequest``, one per
client request (never a merged tensor); ``finalize()`` runs at close.

Results: ``execute`` must return one ``InferenceResponse`` per request. A response with an
error fails that request only, with the ``TritonError`` code (same numbers as ``ErrorCode``).
A wrong number of responses, or ``execute`` raising, fails every request of the batch with
INTERNAL and Triton's message; the worker goes on. Only requested outputs are returned.

Inputs are not copied: fixed-size inputs are numpy views over the frontend's shared-memory
arena, valid during the ``execute`` call only (a model that keeps data must copy it, as
Triton's documentation also requires).

Sequence models: ``InferenceRequest.correlation_id()`` and ``flags()`` give the request's
correlation ID and ``TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`` / ``_END`` bits, and each
control input is one more input tensor of the request (shape ``[1, 1]`` when the model
batches, ``[1]`` otherwise). Only real requests reach ``execute``: the null rows of the
Direct strategy do not. Implicit state (``sequence_batching.state``) is not supported by
Triton's python backend, and a model that declares it fails to load here too.

Decoupled models (``model_transaction_policy { decoupled: true }``): each request has a
``pb_utils.InferenceResponseSender`` (``request.get_response_sender()``) that sends zero or
more responses then a final one (``TRITONSERVER_RESPONSE_COMPLETE_FINAL``), from any thread,
during or after ``execute``, which returns None. Each response goes to the client as it is
sent (``workers.worker.Worker.respond``); the instance takes its next batch when ``execute``
returns, as in Triton. The inputs of a decoupled model's requests are copies (the model may
read them from its threads after ``execute`` returned). When ``execute`` raises (or returns
something other than None), every request whose sender is still open ends with that error. A
request whose sender the model never asked for by the time ``execute`` returns, or whose
sender is dropped unclosed, ends with a flags-only final response, so no client waits forever.
Request rescheduling (``set_release_flags(RELEASE_RESCHEDULE)``, iterative sequence batching)
reports ``RESCHEDULED`` for the request. A default-mode model may answer a request through
its response sender instead of returning its response (upstream since 24.07), once.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from triton_mp.backends.base import (
    RESCHEDULED,
    RESPONDED,
    BackendRequest,
    PhaseTimes,
    Responder,
    Result,
    SequenceBatch,
    to_backend_shape,
)
from triton_mp.backends.python import pb_utils
from triton_mp.backends.python.model_module import (
    describe_exception,
    describe_execute_failure,
    describe_load_failure,
    import_model_module,
    install_pb_utils,
    missing_execute,
    model_class,
)
from triton_mp.backends.python.request_rules import (
    WithoutInputs,
    check_inputs,
    own_step_inputs,
    refuse_without_inputs,
)
from triton_mp.backends.python.responses import (
    NOT_RESCHEDULABLE,
    ResponseReader,
    returned_list_refusal,
)
from triton_mp.common.errors import ConfigError, ErrorCode, TritonMPError
from triton_mp.ipc.protocol.messages import ErrorInfo, InferRequest, ReplyTo, Requester
from triton_mp.ipc.protocol.specs import InstanceSpec, ModelVersionSpec

try:
    # NOTE: the C twin of _pb_requests' plain case (backends/python/native/pb_requests.cc);
    # mypy sees the extension only where it is built: either ignore may be unused.
    from triton_mp.backends.python import _pb_requests as native_requests  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # NOTE: not built (setup.py): _pb_requests builds every batch
    native_requests = None  # type: ignore[assignment,unused-ignore]
else:
    native_requests.configure(
        pb_utils.Tensor,
        pb_utils.InferenceRequest,
        BackendRequest,
        InferRequest,
        pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL,
        ReplyTo,
        int(Requester.ENSEMBLE),  # NOTE: its requests' inputs are copied (own_step_inputs)
    )

try:
    # NOTE: the C twin of _returned_results' plain case (backends/python/native/pb_results.cc);
    # either ignore may be unused, as above.
    from triton_mp.backends.python import _pb_results as native_results  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # NOTE: not built (setup.py): _returned_results reads every batch
    native_results = None  # type: ignore[assignment,unused-ignore]
else:
    native_results.configure(
        pb_utils.InferenceRequest,
        pb_utils.InferenceResponse,
        pb_utils.Tensor,
        BackendRequest,
        pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    )

log = logging.getLogger(__name__)

_INSTANCE_KINDS = {"KIND_CPU": "CPU", "KIND_GPU": "GPU", "KIND_MODEL": "MODEL"}


class PythonBackend:
    """One instance of a Triton python model.

    Raises (from the constructor):
        ConfigError (UNSUPPORTED): the model declares implicit state.
        TritonMPError: model.py cannot be imported, defines no ``TritonPythonModel`` or no
            ``execute``, or its constructor or ``initialize`` raised (the traceback is
            logged; the message says which exception).
    """

    def __init__(self, model: ModelVersionSpec, instance: InstanceSpec) -> None:
        self._spec = model
        self._instance_name = instance.name
        self._origin = f"worker {instance.name}"
        config = json.loads(model.config_json)
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self._responder: Responder | None = None
        self._cancelled: Callable[[object], bool] = lambda token: False
        if model.sequence is not None and model.sequence.states:
            names = ", ".join(f"'{st.input_name}'" for st in model.sequence.states)
            raise ConfigError(
                f"implicit state is not supported by the python backend: model "
                f"'{model.model}' declares sequence_batching state {names}; keep the state in "
                "the model instance, keyed by request.correlation_id()",
                ErrorCode.UNSUPPORTED,
            )
        self._batched = model.max_batch_size > 0
        self._iterative = model.sequence is not None and model.sequence.iterative
        self._captured: dict[int, pb_utils.InferenceResponse] = {}
        """Default mode: responses sent through requests' senders during ``execute``."""
        self._input_reshape = {t.name: t.reshape for t in model.inputs if t.reshape is not None}
        self._result = ResponseReader(model, self._origin).result
        self._plain_result = not any(t.reshape is not None for t in model.outputs)
        """No output of the model is reshaped: ``_returned_results`` reads a plain response
        (outputs only) itself."""
        install_pb_utils()
        model_file = Path(model.model_file)
        try:
            module = import_model_module(model_file, model.model)
        except Exception as exc:
            log.exception("importing %s failed", model_file)
            raise TritonMPError(describe_load_failure(exc)) from None
        cls = model_class(module, model_file)
        args = {
            "model_config": model.config_json,
            "model_instance_kind": _INSTANCE_KINDS.get(instance.kind, "CPU"),
            "model_instance_name": instance.name,
            "model_instance_device_id": str(max(instance.gpu_id, 0)),
            "model_repository": str(model_file.resolve().parent.parent),
            "model_version": str(model.version),
            "model_name": model.model,
        }
        try:
            self._model = cls()
            initialize = getattr(self._model, "initialize", None)
            if initialize is not None:
                initialize(args)
        except Exception as exc:
            log.exception("initialize of model '%s' failed", model.model)
            raise TritonMPError(describe_load_failure(exc)) from None
        execute = getattr(self._model, "execute", None)
        if execute is None:
            execute = missing_execute(model.model_file)  # NOTE: 2.51 loads it, fails batches
        self._execute: Callable[[list[pb_utils.InferenceRequest]], Any] = execute
        # NOTE: ``async def execute`` runs on one event loop per instance, made on first use.
        self._loop: asyncio.AbstractEventLoop | None = None

        # NOTE: bound once: each request of a batch gets these, not closures of its own.
        self._sender_for: Callable[[object], pb_utils.InferenceResponseSender] = (
            self._new_sender if self._decoupled else self._default_sender
        )
        self._request_cancelled: Callable[[object], bool] = lambda r: self._cancelled(
            cast(BackendRequest, r).token
        )
        self._is_async = inspect.iscoroutinefunction(execute)
        self._bind_native()
        self.has_ready_check = callable(getattr(self._model, "is_ready", None))
        """The model defines ``is_ready()`` (python_be.cc: checked once, after initialize)."""
        log.info("python model %s initialized", model_file)

    def _bind_native(self) -> None:
        """The C twins of ``_pb_requests`` and ``_returned_results`` where they are built,
        the result reader only for a model with no reshaped output that is not iterative
        (None: the Python loops; tests set them to None for the twins)."""
        self._native_requests = native_requests.build if native_requests is not None else None
        self._native_results = (
            native_results.results
            if native_results is not None and self._plain_result and not self._iterative
            else None
        )

    def check_ready(self) -> tuple[bool, str]:
        """Call the model's ``is_ready()`` (``async def`` too, on a loop of its own) as
        upstream's ``ProcessUserModelReadinessRequest`` does: ``(ready, why not)``.
        Not a bool, or raising, is not ready, with upstream's message or the exception's;
        False is not ready with ``TRITONBACKEND_ModelInstanceReady``'s message. Runs on
        the worker's readiness thread (``workers.readiness``)."""
        try:
            result = self._model.is_ready()
            if inspect.iscoroutine(result):
                loop = asyncio.new_event_loop()
                try:
                    result = loop.run_until_complete(result)
                finally:
                    loop.close()
        except Exception as exc:  # noqa: BLE001 - the model's fault: not ready
            return False, describe_exception(exc)
        if not isinstance(result, bool):
            return False, "is_ready() must return a boolean value"
        if not result:
            return False, (
                f"Model '{self._instance_name}' is not ready (user-defined check failed)."
            )
        return True, ""

    def bind_responder(self, responder: Responder, cancelled: Callable[[object], bool]) -> None:
        """Take the worker's ``respond`` and ``is_cancelled`` (decoupled models' senders)."""
        self._responder = responder
        self._cancelled = cancelled

    def execute(
        self, requests: Sequence[BackendRequest], sequence: SequenceBatch | None = None
    ) -> tuple[list[Result], PhaseTimes]:
        """Hand the batch to ``TritonPythonModel.execute`` as a list of requests.

        With ``sequence`` each request also gets its rows of the control tensors as inputs;
        null rows are not passed to the model.
        """
        clock = time.perf_counter_ns  # NOTE: as Stopwatch's laps, without the object
        t0 = clock()
        try:
            pb_requests = self._pb_requests(requests, sequence)
        except WithoutInputs as e:
            return refuse_without_inputs(requests, e.indices, self.execute, self._origin)
        t1 = clock()
        t_input = t1 - t0
        try:
            responses = self._execute(pb_requests)
            # NOTE: a list (the common return) is no coroutine: one type test, no call.
            if self._is_async or (type(responses) is not list and inspect.iscoroutine(responses)):
                responses = self._run_coroutine(responses)
        except Exception as exc:  # noqa: BLE001 - the model's fault fails this batch only
            log.exception("execute of model '%s' raised", self._spec.model)
            info = ErrorInfo(
                ErrorCode.INTERNAL,
                f"Failed to process the request(s) for model '{self._instance_name}', "
                f"message: {describe_execute_failure(exc)}",
                self._origin,
            )
            if self._decoupled:
                return self._end_decoupled(requests, pb_requests, info), PhaseTimes(
                    t_input, clock() - t1
                )
            return [info] * len(requests), PhaseTimes(t_input, clock() - t1)
        if self._decoupled:
            if responses is None:
                return self._end_decoupled(requests, pb_requests, None), PhaseTimes(
                    t_input, clock() - t1
                )
            info = ErrorInfo(
                ErrorCode.INTERNAL,
                f"Failed to process the request(s) for model '{self._instance_name}', "
                f"message: Python model '{self._instance_name}' is using the decoupled mode "
                "and the execute function must return None.",
                self._origin,
            )
            return self._end_decoupled(requests, pb_requests, info), PhaseTimes(
                t_input, clock() - t1
            )
        return self._returned_results(requests, pb_requests, responses), PhaseTimes(
            t_input, clock() - t1
        )

    def _returned_results(
        self,
        requests: Sequence[BackendRequest],
        pb_requests: Sequence[pb_utils.InferenceRequest],
        responses: object,
    ) -> list[Result]:
        """A default-mode ``execute``'s results as upstream's ProcessReturnedResponses takes
        them: None (every response went through a response sender) or one entry per request,
        None for a request answered through its sender or rescheduled; a response returned
        for a request already answered, or for a rescheduled one, fails the whole batch."""
        captured = self._captured
        if captured:  # NOTE: an empty one serves the next batch as it is
            self._captured = {}
        if responses is None:
            responses = [None] * len(requests)
        refused = returned_list_refusal(responses, len(requests))
        if refused is not None:
            return self._failed_batch(refused, len(requests))
        returned = cast("Sequence[object]", responses)  # NOTE: a list of len(requests), checked
        if self._native_results is not None and not captured:
            # NOTE: both loops below in one C call for a batch of plain responses
            # (backends/python/native/pb_results.cc); None: one is not, and they read it.
            read = self._native_results(requests, pb_requests, returned)
            if read is not None:
                return read  # type: ignore[no-any-return]
        try:
            iterative = self._iterative
            for pb, resp in zip(pb_requests, returned, strict=True):
                # NOTE: _check_returned has nothing to check for a response returned for a
                # request without a sender outside iterative sequences (the hot path: one
                # call per request saved).
                if resp is not None and (
                    iterative
                    or pb._sender is not None  # noqa: SLF001
                    or type(resp) is not pb_utils.InferenceResponse
                ):
                    self._check_returned(pb, resp)
        except pb_utils.TritonModelException as e:
            return self._failed_batch(str(e), len(requests))
        results: list[Result] = []
        reschedule = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
        plain = self._plain_result
        response_type, tensor_type = pb_utils.InferenceResponse, pb_utils.Tensor
        for r, pb, resp in zip(requests, pb_requests, returned, strict=True):
            # NOTE: _rescheduling's first test, inlined (the hot path).
            if pb._release_flags != reschedule or not self._rescheduling(pb):  # noqa: SLF001
                if captured:
                    resp = captured.get(id(r), resp)
                if (
                    plain
                    and type(resp) is response_type
                    and resp._error is None  # noqa: SLF001
                    and resp._parameters == "{}"  # noqa: SLF001
                ):
                    # NOTE: ResponseReader.result's plain case, inlined (one call per
                    # request saved): pb_utils.Tensor outputs, no reshape, no parameters.
                    outputs: dict[str, Any] = {}
                    wanted = r.outputs
                    for t in resp._output_tensors:  # noqa: SLF001
                        if type(t) is not tensor_type:
                            break  # NOTE: a subclass or no tensor: ResponseReader decides
                        if t._name in wanted:  # noqa: SLF001
                            outputs[t._name] = t._array  # noqa: SLF001
                    else:
                        results.append(outputs)
                        continue
                results.append(self._result(r, resp))
            elif self._iterative:
                results.append(RESCHEDULED)
            else:
                # NOTE: python_be.cc drops the response of a request released with
                # RESCHEDULE and the core then refuses the flag, which leaves the client
                # without an answer; here it gets the core's refusal instead.
                results.append(ErrorInfo(ErrorCode.INVALID_ARG, NOT_RESCHEDULABLE, self._origin))
        return results

    def _failed_batch(self, message: str, n: int) -> list[Result]:
        """``n`` results of one INTERNAL error, in upstream's words for a batch whose
        returned responses it refuses (``message``: why)."""
        info = ErrorInfo(
            ErrorCode.INTERNAL,
            f"Failed to process the request(s) for model '{self._instance_name}', "
            f"message: {message}",
            self._origin,
        )
        return [info] * n

    def _check_returned(self, request: pb_utils.InferenceRequest, response: object) -> None:
        """pb_stub.cc's checks of one returned entry (its messages; the typo kept).

        Raises:
            TritonModelException: a response for a rescheduled request, an entry that is no
                InferenceResponse (either fails the whole batch, as in 2.51), or a response
                for a request whose response sender already sent one.
        """
        if response is None:
            return
        if self._iterative and self._rescheduling(request):
            raise pb_utils.TritonModelException(
                "Expected a None object in the execute function return list for reschduled "
                f"request, found type '{type(response)}'."
            )
        if not isinstance(response, pb_utils.InferenceResponse):
            raise pb_utils.TritonModelException(
                "Expected an 'InferenceResponse' object in the execute function return list, "
                f"found type '{type(response)}'."
            )
        sender = request._sender  # noqa: SLF001 - the backend owns the request's plumbing
        if sender is not None:
            sender._returned(response)  # noqa: SLF001

    def _rescheduling(self, request: pb_utils.InferenceRequest) -> bool:
        """Whether the model released ``request`` with ``RELEASE_RESCHEDULE``. Only
        ``iterative_sequence`` runs it again; otherwise the core refuses the flag
        (``NOT_RESCHEDULABLE``, infer_request.cc), which python_be.cc logs as "Failed to
        release request: ..." before it releases the request with ``RELEASE_ALL``, as here."""
        if request.release_flags() != pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            return False
        if not self._iterative:
            log.error("Failed to release request: %s", NOT_RESCHEDULABLE)
        return True

    def _end_decoupled(
        self,
        requests: Sequence[BackendRequest],
        pb_requests: Sequence[pb_utils.InferenceRequest],
        error: ErrorInfo | None,
    ) -> list[Result]:
        """After a decoupled ``execute``: with ``error``, every request whose sender is
        still open ends with it; without, a request whose sender was never asked for ends
        with a flags-only final response. Open senders stay with the model's threads."""
        results: list[Result] = []
        for r, req in zip(requests, pb_requests, strict=True):
            sender = req._sender  # noqa: SLF001 - the backend owns the request's plumbing
            req._sender_factory = None  # noqa: SLF001
            if error is not None:
                if sender is None or sender._claim():  # noqa: SLF001
                    results.append(error)
                else:
                    results.append(RESPONDED)
                continue
            if self._rescheduling(req) and self._iterative:
                # NOTE: the request goes on with a new sender in its next execution; this
                # one must not end it when it is dropped.
                if sender is not None:
                    sender._claim()  # noqa: SLF001
                results.append(RESCHEDULED)
                continue
            if sender is None:
                assert self._responder is not None
                self._responder(r.token, None, True)
            results.append(RESPONDED)
        return results

    def close(self) -> None:
        """Call ``finalize()`` when the model defines it (errors are logged, not raised)."""
        finalize = getattr(self._model, "finalize", None)
        try:
            if finalize is not None:
                finalize()
        except Exception:  # noqa: BLE001 - the instance is going away anyway
            log.exception("finalize of model '%s' raised", self._spec.model)
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def _run_coroutine(self, coro: Any) -> Any:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def _controls_of(self, sequence: SequenceBatch, row: int, count: int) -> list[pb_utils.Tensor]:
        """One request's rows of the control tensors (``[count, 1]``; ``[1]`` unbatched)."""
        if not self._batched:
            return [pb_utils.Tensor(name, arr) for name, arr in sequence.controls.items()]
        return [
            pb_utils.Tensor(name, arr[row : row + count]) for name, arr in sequence.controls.items()
        ]

    def _pb_requests(
        self, requests: Sequence[BackendRequest], sequence: SequenceBatch | None
    ) -> list[pb_utils.InferenceRequest]:
        """The ``InferenceRequest`` of each request, as ``execute`` hands them to the model
        (one loop per batch, what it reads of the backend read once: the hot path)."""
        model, version = self._spec.model, self._spec.version
        sender_for, cancelled = self._sender_for, self._request_cancelled
        plain = not self._decoupled and not self._input_reshape
        if plain and sequence is None and self._native_requests is not None:
            # NOTE: the batch's requests in one C call (untraced BackendRequests of
            # InferRequests), an ensemble step's inputs copied as own_step_inputs copies
            # them; None: one is not, and the loop below builds all.
            built = self._native_requests(
                requests if type(requests) is list else list(requests),
                model,
                version,
                sender_for,
                cancelled,
            )
            if built is not None:
                return built  # type: ignore[no-any-return]
        if self._batched and sequence is None:
            check_inputs(requests)  # NOTE: the C twin declines a request without inputs
        make = pb_utils._backend_request  # noqa: SLF001 - the backend builds pb_utils' requests
        new_tensor = pb_utils.Tensor.__new__
        tensor_type = pb_utils.Tensor
        out = []
        for i, r in enumerate(requests):
            if plain:
                inputs = []
                for name, arr in r.inputs.items():
                    # NOTE: pb_utils._input_tensor, inlined (one call per input saved).
                    t = new_tensor(tensor_type)
                    t._name = name  # noqa: SLF001
                    t._array = arr  # noqa: SLF001
                    inputs.append(t)
            else:
                inputs = self._inputs_of(r)
            if sequence is not None:
                inputs.extend(self._controls_of(sequence, sequence.slots[i], r.batch_size))
            pb_request = make(  # NOTE: as pb_utils.InferenceRequest(...) makes it
                model,
                list(r.outputs),
                inputs,
                r.request_id,
                r.sequence_id,
                version,
                r.sequence_flags,
                r.timeout_us,
                r.parameters_json,
                r,
                sender_for,
                cancelled,
            )
            trace = getattr(r.token, "trace", None)
            if trace is not None:
                key = (r.token.reply_to, r.token.request_id)  # type: ignore[attr-defined]
                pb_request._trace = pb_utils.InferenceTrace(trace.level, key)  # noqa: SLF001
            out.append(pb_request)
        return own_step_inputs(requests, out)

    def _inputs_of(self, r: BackendRequest) -> list[pb_utils.Tensor]:
        """A request's inputs, copied for a decoupled model (its threads may read them after
        ``execute`` returned, the shared memory reused) and reshaped as the config says."""
        inputs = []
        reshapes = self._input_reshape
        for name, arr in r.inputs.items():
            if self._decoupled:
                arr = arr.copy()
            reshape = reshapes.get(name)
            if reshape is not None:
                arr = to_backend_shape(arr, reshape, self._batched)
            inputs.append(pb_utils._input_tensor(name, arr))  # noqa: SLF001
        return inputs

    def _default_sender(self, key: object) -> pb_utils.InferenceResponseSender:
        """The response sender of one request of a default-mode model (``key``: its
        ``BackendRequest``): its one response is kept as that request's result when
        ``execute`` returns (``_returned_results``)."""
        r = cast(BackendRequest, key)

        def post(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            if response is not None:
                self._captured[id(r)] = response

        return pb_utils.InferenceResponseSender(
            post, lambda: self._cancelled(r.token), decoupled=False
        )

    def _new_sender(self, key: object) -> pb_utils.InferenceResponseSender:
        """The response sender of one request of a decoupled model (``key``: its
        ``BackendRequest``)."""
        r = cast(BackendRequest, key)
        responder = self._responder
        if responder is None:
            raise pb_utils.TritonModelException(
                "this instance cannot send responses (no worker bound)",
                pb_utils.TritonError.INTERNAL,
            )

        def post(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            result = None if response is None else self._result(r, response)
            try:
                responder(r.token, result, final)
            except TritonMPError as e:
                raise pb_utils.TritonModelException(e.message, int(e.code)) from None

        return pb_utils.InferenceResponseSender(post, lambda: self._cancelled(r.token))
