"""Ensemble requests inside the scheduler: the pure ensemble policy's actions as messages.

Imported by ``scheduler.core``. An ensemble version's generation holds an
``policies.ensemble.EnsembleScheduler``; this module feeds it the ensemble's requests and its
steps' answers and turns its actions into messages:

- ``Call``: a composing ``InferRequest`` addressed ``ReplyTo(Requester.ENSEMBLE, 0)``,
  handed to the composing model's own generation through the core (its dynamic batcher,
  priority levels, queue policy, sequence batcher and instances), inheriting the ensemble
  request's client id, correlation ID and sequence flags, priority, timeout and parameters.
  Its inputs are the ``TensorRef`` s the previous steps' workers wrote (or the requester's
  inputs): the worker of the next step reads them where they are; no frontend sees them.
  ``composing_request`` is the one place such a request is made (a tracing hook). Before
  it is sent it is checked as Triton's core checks it (``step_inputs``: a tensor's batch
  dimension added or taken away between models that batch and models that do not, then
  the step model's input count, datatypes and shapes): a step that fails is never sent, and
  the ensemble request fails with that message.
- ``Release``: the scheduler frees a worker's output block (``outbox.Free``).
- ``Complete``: an ``InferResponse`` to the requester whose outputs point into the steps'
  blocks (``block`` and ``extra_blocks``: the requester frees them after copying; a block
  sibling responses share is in ``shared_blocks`` and freed after its ``Handoff``). Its
  outputs come in Triton's order (its ``unordered_map`` of the ensemble's outputs); one no
  step produced is left out; each one's batch dimension follows the ensemble's config
  (``step_inputs.reshape_dims``).
- ``Fail``: a ``RequestFailed`` ("in ensemble '<name>', ..."), with the handoffs of the
  shared blocks of responses sent before.

Statistics follow Triton (``ensemble_scheduler.cc`` ``RequestTracker``): each composing
request counts on its own model as any request does; the ensemble counts one success (or
one failure, reason ``OTHER``) per request once every composing request has been accounted
for (its ``BatchDone``, or its failure by the scheduler), with the compute durations summed
over its steps, plus one execution of the request's batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import msgspec

from triton_mp.common.errors import ErrorCode, InvalidRequest
from triton_mp.ipc.protocol.messages import (
    QUEUED_ORIGIN,
    CancelRequest,
    ChildTrace,
    InferRequest,
    InferResponse,
    OutputRegion,
    ReplyTo,
    Requester,
    RequestFailed,
    SequenceFlags,
    TensorRef,
    TensorTrace,
    TraceContext,
    TraceRecord,
)
from triton_mp.ipc.protocol.specs import EnsembleStepSpec
from triton_mp.ipc.tensor_pool import SharedBlocks, response_blocks
from triton_mp.scheduler.ensemble_tensors import (
    Blocks,
    Value,
    ensemble_outputs,
    flat,
    handoffs_of,
    output_regions,
    refs_of,
    reshaped_input,
    step_inputs,
)
from triton_mp.scheduler.instances import Generation
from triton_mp.scheduler.outbox import Outbox
from triton_mp.scheduler.policies.ensemble import (
    Action,
    Call,
    Complete,
    EnsembleScheduler,
    Fail,
    Release,
)
from triton_mp.scheduler.rules.step_inputs import StepInput, check_step
from triton_mp.scheduler.stats import StatsBook

ENSEMBLE_REPLY = ReplyTo(Requester.ENSEMBLE, 0)
"""Where the workers answer composing requests: the scheduler itself."""

RequestKey = tuple[ReplyTo, int]


def _sequence_parameters(req: InferRequest) -> str:
    """An ensemble response's parameters as 2.51 sends them: its request's correlation ID and
    START / END flags (``sequence_id`` 0, false, false for a request without them)."""
    flags = req.sequence_flags
    return msgspec.json.encode(
        {
            "sequence_id": req.sequence_id,
            "sequence_start": bool(flags & SequenceFlags.START),
            "sequence_end": bool(flags & SequenceFlags.END),
        }
    ).decode()


@dataclass(eq=False)
class _Parent:
    """One ensemble request while it runs."""

    req: InferRequest
    gen: Generation
    start_ns: int
    label: str
    """Its ``[request id: <id>] `` prefix (core ``LogRequest``)."""
    unaccounted: int = 0
    """Composing requests whose execution (or failure) is not counted yet."""
    compute: tuple[int, int, int] = (0, 0, 0)
    ended: bool = False
    failed: bool = False
    counted: bool = False
    """Its success or failure is in the ensemble's statistics (once)."""
    end_ns: int = 0
    child_traces: list[ChildTrace] = field(default_factory=list)
    """A traced ensemble request: the finished traces of its composing requests."""
    steps: tuple[Generation | None, ...] = ()
    """Per step, the generation its model's version had when the request started (None:
    none served), pinned until the request ends (``Generation.pins``)."""


@dataclass(eq=False)
class _Child:
    """One composing request in flight."""

    parent: _Parent
    call_id: int
    req: InferRequest
    batch: int
    """Its batch size, 0 when its model does not batch (its outputs' ``Value.batch``)."""
    answered: bool = False
    """Its final response (or failure) arrived."""
    accounted: bool = False
    """Its execution (or failure) is counted towards the parent."""
    stamps: list[tuple[str, int]] | None = None
    """A traced ensemble's step: its trace's timestamps so far (REQUEST_START here, the
    worker's QUEUE_START and COMPUTE_* from its answer, REQUEST_END here); else None."""


class Ensembles:
    """Every running ensemble request (see the module docstring).

    Args:
        out: the core's outbox.
        stats: the books the ensembles count in.
        submit: hands a composing request to its model's generation (``core._on_request``).
        cancel: cancels a composing request where it waits (``core._on_cancel``).
        latest: the newest active version of a model, or None (``model_version: -1``).
        generation: the active generation of a (model, version), or None.
    """

    def __init__(
        self,
        out: Outbox,
        stats: StatsBook,
        submit: Callable[[InferRequest, int], None],
        cancel: Callable[[CancelRequest, int], None],
        latest: Callable[[str], int | None],
        generation: Callable[[tuple[str, int]], Generation | None],
    ) -> None:
        self._out = out
        self._stats = stats
        self._submit = submit
        self._cancel = cancel
        self._latest = latest
        self._generation = generation
        self._parents: dict[RequestKey, _Parent] = {}
        self._children: dict[int, _Child] = {}
        self._shared = SharedBlocks()
        """Nested ensembles' shared blocks (``on_response``)."""
        self._next_id = 1
        self.now_ns = 0
        """The time of the message being handled (the core sets it)."""
        out.loopback = self._on_failed

    # ----------------------------------------------------------------- inbound
    def start(self, req: InferRequest, gen: Generation, now_ns: int) -> None:
        """An ensemble request arrived (its inputs validated by the frontend)."""
        policy = cast(EnsembleScheduler, gen.policy)
        known = {t.name for t in gen.spec.inputs}
        label = f"[request id: {req.client_id or '<id_unknown>'}] "
        for ref in req.inputs:
            if ref.name not in known:
                message = (
                    f"in ensemble '{gen.spec.model}', {label}unexpected input '{ref.name}' in "
                    "request header that does not map to any ensemble inputs"
                )
                self._out.fail(req, ErrorCode.INVALID_ARG, message, now_ns)
                return
        key = (req.reply_to, req.request_id)
        parent = self._parents[key] = _Parent(req, gen, now_ns, label)
        parent.steps = self._pin_steps(gen)
        batch = req.batch_size if gen.spec.max_batch_size > 0 else 0
        values: dict[str, Value | None] = {
            t.name: Value(reshaped_input(gen.spec, t), batch) for t in req.inputs
        }
        for t in gen.spec.inputs:
            if t.optional and t.name not in values:
                values[t.name] = None  # NOTE: core's placeholder for an optional input
        self._act(policy, policy.start(key, values, label, req.outputs), now_ns)

    def on_response(self, msg: InferResponse, now_ns: int) -> None:
        """A worker answered a composing request."""
        child = self._children.get(msg.request_id)
        if child is None:
            for ref in response_blocks(msg):
                self._out.free(ref)
            return
        policy = cast(EnsembleScheduler, child.parent.gen.policy)
        error = (msg.error.code, msg.error.message) if msg.error is not None else None
        outputs = (
            None if msg.empty or error else {t.name: Value(t, child.batch) for t in msg.outputs}
        )
        block: object = msg.block
        if msg.extra_blocks:
            # NOTE: a nested ensemble's answer: its outputs lie in all of its blocks.
            block = Blocks(response_blocks(msg))
        if msg.shared_blocks or msg.handoffs:
            # NOTE: a nested ensemble that forks shares blocks among its responses; the
            # scheduler cannot hand such a block on: the request fails instead.
            for ref in (*self._shared.arrived(msg), *self._shared.released(msg)):
                self._out.free(ref)
            block, outputs = None, None
            error = error or (
                ErrorCode.UNSUPPORTED,
                f"a response of ensemble '{child.req.model}' shares tensors with its other "
                "responses, which an outer ensemble cannot take yet",
            )
        if child.stamps is not None:
            self._trace_step(child, msg.trace, msg.final, now_ns)
        if msg.final:
            child.answered = True
            self._forget(child)
        actions = policy.respond(child.call_id, outputs, block, msg.final, error)
        self._act(policy, actions, now_ns)

    @staticmethod
    def _trace_step(child: _Child, record: TraceRecord | None, final: bool, now_ns: int) -> None:
        """A traced step answered: take its events; with the final answer its trace is a
        child trace of the ensemble's (``parent_id`` in the file)."""
        assert child.stamps is not None
        tensors: tuple[TensorTrace, ...] = ()
        children: tuple[ChildTrace, ...] = ()
        if record is not None:
            child.stamps.extend(record.stamps)
            tensors, children = record.tensors, record.children
        if not final:
            return
        child.stamps.append(("REQUEST_END", now_ns))
        req = child.req
        child.parent.child_traces.append(
            ChildTrace(
                req.model, req.version, req.client_id, tuple(child.stamps), tensors, children
            )
        )
        child.stamps = None

    def on_executed(self, request_id: int, compute: tuple[int, int, int], now_ns: int) -> None:
        """The batch of a composing request ran (its ``BatchDone``): count its compute
        durations (ns: input, infer, output) towards its ensemble request."""
        child = self._children.get(request_id)
        if child is None or child.accounted:
            return
        child.accounted = True
        parent = child.parent
        c_in, c_infer, c_out = parent.compute
        parent.compute = (c_in + compute[0], c_infer + compute[1], c_out + compute[2])
        parent.unaccounted -= 1
        self._forget(child)
        self._maybe_count(parent)

    def cancel(self, gen: Generation, msg: CancelRequest, now_ns: int) -> None:
        """The requester of an ensemble request went away: its waiting steps are dropped and
        its queued composing requests cancelled."""
        parent = self._parents.get((msg.reply_to, msg.request_id))
        if parent is None:
            return
        policy = cast(EnsembleScheduler, gen.policy)
        calls, actions = policy.abort(
            (msg.reply_to, msg.request_id), ErrorCode.CANCELLED, "Request was cancelled"
        )
        for child in [c for c in self._children.values() if c.parent is parent]:
            if child.call_id in calls:
                creq = child.req
                self._cancel(
                    CancelRequest(
                        request_id=creq.request_id,
                        reply_to=ENSEMBLE_REPLY,
                        model=creq.model,
                        version=creq.version,
                    ),
                    now_ns,
                )
        self._act(policy, actions, now_ns)

    def in_flight(self) -> int:
        """Ensemble requests not finished (``SchedulerCore.idle``)."""
        return len(self._parents)

    def counting(self) -> bool:
        """Whether a composing request's compute is still to count (``on_executed``)."""
        return bool(self._children)

    # ----------------------------------------------------------------- actions
    def _act(self, policy: EnsembleScheduler, actions: list[Action], now_ns: int) -> None:
        for action in actions:
            if isinstance(action, Call):
                self._call(policy, action, now_ns)
            elif isinstance(action, Release):
                for ref in refs_of(action.block):
                    self._out.free(ref)
            elif isinstance(action, Complete):
                self._complete(action, now_ns)
            elif isinstance(action, Fail):
                self._fail(action, now_ns)

    def composing_request(
        self,
        parent: InferRequest,
        inputs: tuple[TensorRef, ...],
        outputs: tuple[str, ...],
        model: str,
        version: int,
        batch_size: int,
        regions: tuple[OutputRegion | None, ...],
        now_ns: int,
    ) -> InferRequest:
        """The composing request of one step call, inheriting the ensemble request's id,
        correlation ID and flags, priority, timeout and parameters.

        NOTE: the one place composing requests are made: a traced ensemble request's
        steps are traced at its level (its child traces).
        """
        request_id = self._next_id
        self._next_id += 1
        return InferRequest(
            request_id=request_id,
            reply_to=ENSEMBLE_REPLY,
            model=model,
            version=version,
            batch_size=batch_size,
            inputs=inputs,
            outputs=outputs,
            block=parent.block,
            arrival_ns=now_ns,
            priority=parent.priority,
            timeout_us=parent.timeout_us,
            client_id=parent.client_id,
            parameters_json=parent.parameters_json,
            output_regions=regions if any(r is not None for r in regions) else (),
            sequence_id=parent.sequence_id,
            sequence_flags=parent.sequence_flags,
            trace=None if parent.trace is None else TraceContext(parent.trace.level),
        )

    def _step_generation(self, step: EnsembleStepSpec) -> Generation | None:
        """The generation a step's call goes to now: its version's (``model_version``, or
        the newest active one for -1); None when none is active."""
        version = step.version if step.version >= 0 else self._latest(step.model)
        return self._generation((step.model, version)) if version is not None else None

    def _pin_steps(self, gen: Generation) -> tuple[Generation | None, ...]:
        """The generations of ``gen``'s steps now, each pinned (core ``EnsembleContext``
        takes a handle on every step's model when the request starts: a step unloaded
        while the request runs still serves it)."""
        steps = tuple(self._step_generation(s) for s in gen.spec.ensemble.steps)  # type: ignore[union-attr]
        for g in steps:
            if g is not None:
                g.pins += 1
        return steps

    def _call(self, policy: EnsembleScheduler, call: Call, now_ns: int) -> None:
        parent = self._parents[cast(RequestKey, call.request)]
        step = parent.gen.spec.ensemble.steps[call.step]  # type: ignore[union-attr]
        gen = self._step_generation(step)
        if gen is None and parent.steps:
            # NOTE: unloaded since the request started: its pinned generation, retiring,
            # still serves it (core._on_request finds it), as 2.51's handle on the model.
            gen = parent.steps[call.step]
        version = gen.key[1] if gen is not None else None
        if gen is None:
            # NOTE: the frontend's words (core ModelLifeCycle::GetModel) for a step whose
            # model stopped serving the version, or every version, since the ensemble loaded.
            error = (
                (
                    ErrorCode.UNAVAILABLE,
                    f"Request for unknown model: '{step.model}' version {step.version} is not "
                    "at ready state",
                )
                if step.version >= 0
                else (
                    ErrorCode.NOT_FOUND,
                    f"Request for unknown model: '{step.model}' has no available versions",
                )
            )
            self._act(policy, policy.respond(call.call_id, None, None, True, error), now_ns)
            return
        assert version is not None
        inputs = step_inputs(gen.spec, call)
        batched = gen.spec.max_batch_size > 0
        try:
            spec = gen.spec
            given = [StepInput(t.name, t.datatype, t.shape) for t in inputs]
            batch = check_step(spec.model, spec.max_batch_size, spec.inputs, given, parent.label)
        except InvalidRequest as e:
            # NOTE: Triton's InitStep fails the same way: the step is never sent, nothing
            # counts on its model, and the ensemble request fails.
            error = (e.code, e.message)
            self._act(policy, policy.respond(call.call_id, None, None, True, error), now_ns)
            return
        regions = output_regions(parent.req, step.output_map, call.outputs)
        creq = self.composing_request(
            parent.req,
            inputs,
            call.outputs,
            step.model,
            version,
            batch if batched else 1,
            regions,
            now_ns,
        )
        child = _Child(parent, call.call_id, creq, batch)
        if creq.trace is not None:
            child.stamps = [("REQUEST_START", now_ns)]
        self._children[creq.request_id] = child
        parent.unaccounted += 1
        self._submit(creq, now_ns)

    def _complete(self, action: Complete, now_ns: int) -> None:
        parent = self._parents[cast(RequestKey, action.request)]
        req = parent.req
        blocks = flat(action.blocks)
        handoffs = handoffs_of(action.handoffs)
        if not action.outputs:
            msg = InferResponse(
                request_id=req.request_id,
                version=req.version,
                final=action.final,
                empty=True,
                handoffs=handoffs,
            )
        else:
            outputs = ensemble_outputs(parent.gen.spec, parent.req.outputs, action.outputs)
            msg = InferResponse(
                request_id=req.request_id,
                version=req.version,
                outputs=outputs,
                block=blocks[0] if blocks else None,
                extra_blocks=blocks[1:],
                final=action.final,
                shared_blocks=flat(action.shared),
                handoffs=handoffs,
                parameters_json=_sequence_parameters(req),
            )
        if action.final and req.trace is not None:
            record = TraceRecord(
                stamps=(("QUEUE_START", req.trace.queue_ns),),
                children=tuple(parent.child_traces),
            )
            msg = msgspec.structs.replace(msg, trace=record)
        if req.reply_to.kind is Requester.ENSEMBLE:
            # NOTE: a nested ensemble answers its outer ensemble inside the scheduler; its
            # end accounts for it there as a worker's BatchDone would.
            self.on_response(msg, now_ns)
            if action.final:
                self._end(parent, now_ns, failed=False)
                self.on_executed(req.request_id, parent.compute, now_ns)
            return
        self._out.reply(req.reply_to, msg)
        if action.final:
            self._end(parent, now_ns, failed=False)

    def _fail(self, action: Fail, now_ns: int) -> None:
        parent = self._parents[cast(RequestKey, action.request)]
        # NOTE: a started ensemble's failure is its response's error in Triton (QUEUED_ORIGIN).
        handoffs = handoffs_of(action.handoffs)
        self._out.end(parent.req, action.code, action.message, handoffs, QUEUED_ORIGIN)
        self._end(parent, now_ns, failed=True)

    def _end(self, parent: _Parent, now_ns: int, failed: bool) -> None:
        parent.ended, parent.failed, parent.end_ns = True, failed, now_ns
        self._parents.pop((parent.req.reply_to, parent.req.request_id), None)
        for g in parent.steps:
            if g is not None:
                g.pins -= 1
        parent.steps = ()
        self._maybe_count(parent)

    def _maybe_count(self, parent: _Parent) -> None:
        """Count the ensemble request once it ended and every composing request is counted."""
        if not parent.ended or parent.unaccounted or parent.counted:
            return
        # NOTE: a step the scheduler fails ends the request and is accounted for in the
        # same event (``_on_failed``), which asks again.
        parent.counted = True
        req, (model, version) = parent.req, parent.gen.key
        if parent.failed:
            self._stats.record_failure(model, version, req.arrival_ns, parent.end_ns, "OTHER")
            return
        c_in, c_infer, c_out = parent.compute
        self._stats.record_execution(
            (model, version),
            1,
            req.arrival_ns,
            parent.start_ns,
            req.batch_size,
            max(1, req.batch_size),
            c_in,
            c_infer,
            c_out,
            parent.end_ns,
        )

    # --------------------------------------------------------------- loopback
    def _forget(self, child: _Child) -> None:
        if child.answered and child.accounted:
            self._children.pop(child.req.request_id, None)

    def _on_failed(self, to: ReplyTo, msg: RequestFailed) -> None:
        """The scheduler failed a composing request (rejected, timed out, cancelled, its
        instance died). No ``BatchDone`` counts a request the scheduler fails before it
        ran, so it is counted here; an open decoupled request it ends was counted."""
        for ref in self._shared.arrived(msg):
            self._out.free(ref)
        child = self._children.get(msg.request_id)
        if child is None or child.answered:
            return
        child.answered = True
        if child.stamps is not None:
            self._trace_step(child, None, True, self.now_ns)
        if not child.accounted:
            child.accounted = True
            child.parent.unaccounted -= 1
        self._forget(child)
        error = (msg.error.code, msg.error.message)
        policy = cast(EnsembleScheduler, child.parent.gen.policy)
        actions = policy.respond(child.call_id, None, None, True, error)
        self._act(policy, actions, self.now_ns)
        self._maybe_count(child.parent)
