"""The ensemble scheduler: Triton's ``EnsembleScheduler`` as a pure, event-driven state machine.

One ``EnsembleScheduler`` per ensemble version (``scheduler.registry`` entry ``ensemble``).
It never sees a descriptor's insides: tensors are opaque *values* (the caller's
``TensorRef``) and each value lives in an opaque *block* (the arena allocation of the
response that wrote it; None for the ensemble request's own inputs, which the requester
frees). A value of None is Triton's placeholder (``AddTensor(nullptr)``): an output a step's
response left out, or an optional ensemble input the request left out. It satisfies the
steps that consume it, which get no such input (their model's input check decides), and an
ensemble output that is None is left out of the response. The caller
(``scheduler.ensembles``) turns its actions into messages:

- ``Call``: send one composing request (a step whose inputs all exist now). Independent
  branches are called at once; a step waits only for its own inputs.
- ``Release``: free a block: every consumer of every tensor in it has finished.
- ``Complete``: one response of the ensemble request (its outputs, and the blocks that
  travel with it to the requester, who frees them); ``final`` ends the request.
- ``Fail``: the request fails, once none of its composing requests is in flight any more
  (Triton's ``FinishEnsemble``), with ``in ensemble '<name>', <message>``.

Reference counts (``ensemble_scheduler.cc`` ``remaining_reference_count_``): a tensor set in
a context holds its block once per step of that context that consumes it and has not
finished, plus once while it is an ensemble output not yet handed out. A block is released
when its count falls to zero. A decoupled step's every response forks the context (Triton's
per-response iteration): the child copies the parent's tensors (and holds their blocks
again for its own consumers), so each response drives the downstream steps once.

A response's block no one else holds goes with it (``Complete.blocks``). One still held
when a response names it (an ensemble output written upstream of a decoupled step: each
sibling response names it) is *shared*: the responses name it in ``Complete.shared`` and,
when the last hold ends, a ``handoff`` (block, responses that named it) tells the requester
to free it once it has released that many (``ipc.tensor_pool.SharedBlocks``). So a block
is freed by exactly one party, after everyone is done with it.

``max_inflight_requests`` bounds the composing requests in flight per step over all the
ensemble's requests; a step over the bound waits in that step's FIFO (back-pressure; nothing
is dropped). Pure: no ipc, no clock (``tests/unit/test_layering.py``). The steps and
actions are ``policies.ensemble_actions`` (re-exported here); which steps a request that asks
for some outputs leaves out, ``policies.ensemble_graph``.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from triton_mp.common.errors import ErrorCode
from triton_mp.scheduler.policies.ensemble_actions import (
    Action,
    Call,
    Complete,
    Fail,
    Release,
    Step,
)
from triton_mp.scheduler.policies.ensemble_graph import StepGraph
from triton_mp.scheduler.policies.policy import (
    Batch,
    IterativeSteps,
    LevelSnapshot,
    Queued,
    Rejection,
)

__all__ = ["Action", "Call", "Complete", "EnsembleScheduler", "Fail", "Release", "Step"]


@dataclass(eq=False)
class _Context:
    """One set of tensors of a request (the root, or a decoupled response's fork)."""

    values: dict[str, tuple[Any, Hashable]]
    """Ensemble tensor -> (value, block)."""
    dispatched: set[int]
    """Steps called (or finished, or pruned) in this context."""
    outputs: tuple[str, ...]
    """The ensemble outputs the request asked for (its response waits for these only)."""
    done_steps: set[int] = field(default_factory=set)
    """Steps whose call in this context has finished, or that were pruned."""
    inflight: int = 0
    sent: bool = False
    """Its output set was handed out."""


@dataclass(eq=False)
class _Request:
    key: Hashable
    label: str
    contexts: list[_Context]
    inflight: int = 0
    error: tuple[ErrorCode, str] | None = None
    responses: int = 0
    ended: bool = False
    handoffs: list[tuple[Hashable, int]] = field(default_factory=list)
    """Shared blocks no step holds any more, not yet handed to the requester."""


class EnsembleScheduler:
    """The ensemble scheduler of one ensemble version (see the module docstring).

    Args:
        name: the ensemble's name (error prefixes).
        steps: its steps, in config order.
        outputs: the ensemble's output tensors.
        decoupled: the ensemble is decoupled (a decoupled model on its data path): a request
            may end with no response (only the final flag) instead of a deadlock error.
        max_inflight_requests: per step, composing requests in flight at most (0 = no bound).
    """

    iterative_steps: IterativeSteps | None = None

    def __init__(
        self,
        name: str,
        steps: Iterable[Step],
        outputs: Iterable[str],
        decoupled: bool = False,
        max_inflight_requests: int = 0,
    ) -> None:
        self.name = name
        self.steps = tuple(steps)
        self.outputs = tuple(outputs)
        self.decoupled = decoupled
        self.max_inflight = max_inflight_requests
        self._graph = StepGraph(self.steps, self.outputs)
        self._consumers = self._graph.consumers
        self._requests: dict[Hashable, _Request] = {}
        self._calls: dict[int, tuple[_Request, _Context, int]] = {}
        self._refs: dict[Hashable, int] = {}
        self._shared: dict[Hashable, tuple[_Request, int]] = {}
        """Block named by responses while still held -> (its request, responses naming it)."""
        self._next_call = 1
        self.step_inflight = [0] * len(self.steps)
        """Composing requests in flight per step (``triton-mp stat``)."""
        self._waiting: list[collections.deque[tuple[_Request, _Context]]] = [
            collections.deque() for _ in self.steps
        ]
        self._out: list[Action] = []

    # ----------------------------------------------------------------- events
    def start(
        self,
        key: Hashable,
        inputs: dict[str, Any],
        label: str = "",
        outputs: Iterable[str] = (),
    ) -> list[Action]:
        """A new ensemble request with its input tensors (values whose block is the
        requester's) and the outputs it asks for (none named: all): calls every step whose
        inputs are all given. Steps no requested output depends on are pruned (never
        called), as Triton's ``EnsembleContext`` prunes them."""
        req = _Request(key, label, [])
        self._requests[key] = req
        wanted = set(outputs) or set(self.outputs)
        pruned = self.pruned(wanted)
        kept = tuple(t for t in self.outputs if t in wanted)
        ctx = _Context({}, set(pruned), kept, set(pruned))
        req.contexts.append(ctx)
        for name, value in inputs.items():
            self._set(ctx, name, value, None)
        self._advance(req, ctx)
        self._maybe_end(req)
        return self._take()

    def respond(
        self,
        call_id: int,
        outputs: dict[str, Any] | None,
        block: Hashable,
        final: bool,
        error: tuple[ErrorCode, str] | None = None,
    ) -> list[Action]:
        """A response to a composing request: its outputs (composing output name -> value,
        all in ``block``; None: no response, only the final flag), or an error; ``final``
        when no more follow for the call. A step output the response leaves out is set to
        None (Triton's placeholder)."""
        entry = self._calls.get(call_id)
        if entry is None:
            if block is not None:
                self._out.append(Release(block))
            return self._take()
        req, ctx, index = entry
        step = self.steps[index]
        if error is not None and req.error is None:
            req.error = error
        if outputs is not None and req.error is None:
            target = self._fork(req, ctx, index) if step.decoupled else ctx
            for out_name, tensor in step.outputs:
                value = outputs.get(out_name)
                self._set(target, tensor, value, None if value is None else block)
            # NOTE: a block none of whose tensors has a consumer is released at once.
            self._drop(block, 0)
            if target is not ctx:
                self._advance(req, target)
        elif block is not None:
            self._out.append(Release(block))
        if final:
            self._finish_call(req, ctx, index, call_id)
        return self._take()

    def abort(self, key: Hashable, code: ErrorCode, message: str) -> tuple[list[int], list[Action]]:
        """The request is cancelled (or its deadline passed): no more steps are called.

        Returns:
            The calls still in flight (to be cancelled where they wait), and what follows
            now (a request with nothing in flight fails at once).
        """
        req = self._requests.get(key)
        if req is None:
            return [], []
        if req.error is None:
            req.error = (code, message)
        for queue in self._waiting:
            for entry in [e for e in queue if e[0] is req]:
                queue.remove(entry)
                entry[1].inflight -= 1
                req.inflight -= 1
                self._maybe_finish_context(req, entry[1])
        self._maybe_end(req)
        return [cid for cid, (r, _, _) in self._calls.items() if r is req], self._take()

    # ----------------------------------------------------------------- queries
    def pruned(self, wanted: set[str]) -> frozenset[int]:
        """The steps a request asking only for ``wanted`` outputs never calls
        (``StepGraph.pruned``)."""
        return self._graph.pruned(wanted)

    def request_count(self) -> int:
        """Ensemble requests not finished."""
        return len(self._requests)

    def live_blocks(self) -> int:
        """Blocks held (tests: zero once every request ended)."""
        return len(self._refs) + len(self._shared)

    def waiting(self) -> list[int]:
        """Per step, calls held back by ``max_inflight_requests``."""
        return [len(q) for q in self._waiting]

    # ----------------------------------------------------------------- internals
    def _take(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    def _set(self, ctx: _Context, tensor: str, value: Any, block: Hashable) -> None:
        """Set a tensor of ``ctx``; its block is held by every consumer still to come."""
        ctx.values[tensor] = (value, block)
        holds = sum(1 for s in self._consumers.get(tensor, ()) if s not in ctx.done_steps)
        holds += tensor in ctx.outputs
        self._hold(block, holds)

    def _hold(self, block: Hashable, n: int) -> None:
        if block is not None:
            self._refs[block] = self._refs.get(block, 0) + n

    def _drop(self, block: Hashable, n: int) -> None:
        if block is None:
            return
        left = self._refs.get(block, 0) - n
        if left > 0:
            self._refs[block] = left
            return
        self._refs.pop(block, None)
        shared = self._shared.pop(block, None)
        if shared is None:
            self._out.append(Release(block))
        else:
            # NOTE: responses sent before still name it: the requester frees it after them.
            req, uses = shared
            req.handoffs.append((block, uses))

    def _fork(self, req: _Request, parent: _Context, index: int) -> _Context:
        """A decoupled step's response: a child context in which step ``index`` is done."""
        child = _Context({}, set(parent.dispatched), parent.outputs, {*parent.done_steps, index})
        for tensor, (value, block) in parent.values.items():
            self._set(child, tensor, value, block)
        req.contexts.append(child)
        return child

    def _advance(self, req: _Request, ctx: _Context) -> None:
        """Call every step of ``ctx`` whose inputs all exist; end the context when nothing
        more can happen in it."""
        if req.error is None:
            for index, step in enumerate(self.steps):
                if index in ctx.dispatched:
                    continue
                if all(tensor in ctx.values for _, tensor in step.inputs):
                    ctx.dispatched.add(index)
                    ctx.inflight += 1
                    req.inflight += 1
                    if self.max_inflight and self.step_inflight[index] >= self.max_inflight:
                        self._waiting[index].append((req, ctx))
                    else:
                        self._call(req, ctx, index)
        self._maybe_finish_context(req, ctx)

    def _call(self, req: _Request, ctx: _Context, index: int) -> None:
        step = self.steps[index]
        call_id = self._next_call
        self._next_call += 1
        self._calls[call_id] = (req, ctx, index)
        self.step_inflight[index] += 1
        inputs = tuple((name, ctx.values[tensor][0]) for name, tensor in step.inputs)
        outputs = tuple(name for name, _ in step.outputs)
        self._out.append(Call(call_id, req.key, index, inputs, outputs))

    def _finish_call(self, req: _Request, ctx: _Context, index: int, call_id: int) -> None:
        del self._calls[call_id]
        self.step_inflight[index] -= 1
        waiting = self._waiting[index]
        if waiting:
            wreq, wctx = waiting.popleft()
            self._call(wreq, wctx, index)
        ctx.inflight -= 1
        req.inflight -= 1
        ctx.done_steps.add(index)
        for _, tensor in self.steps[index].inputs:
            value = ctx.values.get(tensor)
            if value is not None:
                self._drop(value[1], 1)
        self._advance(req, ctx)
        self._maybe_end(req)

    def _maybe_finish_context(self, req: _Request, ctx: _Context) -> None:
        """Hand out a context's complete output set once its calls are done; a context with
        nothing in flight and nothing callable lets go of every block it still holds."""
        if ctx.inflight or ctx not in req.contexts:
            return
        if req.error is None and not ctx.sent and all(t in ctx.values for t in ctx.outputs):
            ctx.sent = True
            self._out.append(self._response(req, ctx))
        self._let_go(ctx)
        req.contexts.remove(ctx)

    def _response(self, req: _Request, ctx: _Context) -> Complete:
        """The response of a context's complete output set. Each output's hold ends; a block
        no one else holds or named goes with the response, one still held (or named by
        responses before) is shared, and the last holder's end is its handoff."""
        outputs = {t: ctx.values[t][0] for t in ctx.outputs}
        used: list[Hashable] = []
        for t in ctx.outputs:
            block = ctx.values[t][1]
            if block is not None:
                self._refs[block] = self._refs.get(block, 0) - 1
                if block not in used:
                    used.append(block)
        blocks: list[Hashable] = []
        shared: list[Hashable] = []
        for block in used:
            _, uses = self._shared.get(block, (req, 0))
            if self._refs[block] > 0:
                self._shared[block] = (req, uses + 1)
                shared.append(block)
                continue
            del self._refs[block]
            if uses:
                del self._shared[block]
                shared.append(block)
                req.handoffs.append((block, uses + 1))
            else:
                blocks.append(block)
        handoffs, req.handoffs = tuple(req.handoffs), []
        req.responses += 1
        return Complete(req.key, outputs, tuple(blocks), False, tuple(shared), handoffs)

    def _let_go(self, ctx: _Context) -> None:
        """Drop the holds of consumers that will never run in ``ctx`` (and of outputs not
        handed out)."""
        for tensor, (_, block) in ctx.values.items():
            holds = sum(1 for s in self._consumers.get(tensor, ()) if s not in ctx.done_steps)
            holds += tensor in ctx.outputs and not ctx.sent
            if holds:
                self._drop(block, holds)

    def _maybe_end(self, req: _Request) -> None:
        """The request ends once nothing of it is in flight (Triton's ``FinishEnsemble``)."""
        if req.ended or req.inflight or req.contexts:
            return
        req.ended = True
        del self._requests[req.key]
        if req.error is not None:
            code, message = req.error
            handoffs = self._drop_completes(req)
            self._out.append(Fail(req.key, code, f"in ensemble '{self.name}', {message}", handoffs))
            return
        if req.responses == 0 and not self.decoupled:
            self._out.append(
                Fail(
                    req.key,
                    ErrorCode.INVALID_ARG,
                    f"in ensemble '{self.name}', {req.label}unexpected deadlock, at least one "
                    "output is not set while no more ensemble steps can be made",
                )
            )
            return
        self._mark_final(req)

    def _mark_final(self, req: _Request) -> None:
        """The last response of the request carries the final flag (or a bare final)."""
        # NOTE: handoffs made since its last response (the holds of contexts that sent
        # nothing) go with the final one: every response naming them comes before.
        late, req.handoffs = tuple(req.handoffs), []
        for i in range(len(self._out) - 1, -1, -1):
            action = self._out[i]
            if isinstance(action, Complete) and action.request == req.key:
                self._out[i] = Complete(
                    action.request,
                    action.outputs,
                    action.blocks,
                    True,
                    action.shared,
                    action.handoffs + late,
                )
                return
        self._out.append(Complete(req.key, {}, (), True, (), late))

    def _drop_completes(self, req: _Request) -> tuple[tuple[Hashable, int], ...]:
        """A failed request hands out no outputs decided in the same step: free them.

        Returns:
            The handoffs the failure carries: shared blocks still named by responses sent
            before (blocks named only by the dropped responses are released).
        """
        keep: list[Action] = []
        dropped: dict[Hashable, int] = {}
        handoffs = list(req.handoffs)
        req.handoffs = []
        for action in self._out:
            if isinstance(action, Complete) and action.request == req.key:
                keep.extend(Release(b) for b in action.blocks)
                for block in action.shared:
                    dropped[block] = dropped.get(block, 0) + 1
                handoffs.extend(action.handoffs)
            else:
                keep.append(action)
        self._out = keep
        carried: list[tuple[Hashable, int]] = []
        for block, uses in handoffs:
            sent = uses - dropped.get(block, 0)
            if sent > 0:
                carried.append((block, sent))
            else:
                self._out.append(Release(block))
        return tuple(carried)

    # --------------------------------------------------- the Policy protocol
    # NOTE: an ensemble has no instances and no queue: the core hands its requests to
    # ``start`` (``scheduler.ensembles``), never to ``offer``.
    def offer(self, item: Queued, now_ns: int) -> Rejection | None:
        return Rejection(ErrorCode.INTERNAL, "an ensemble takes requests through start()")

    def instance_idle(self, instance_id: int, now_ns: int = 0) -> None:
        return None

    def instance_gone(self, instance_id: int) -> None:
        return None

    def regroup(self, added: Sequence[int], leaving: Sequence[int]) -> None:
        return None

    def holds(self, instance_id: int) -> bool:
        return False

    def expire(self, now_ns: int) -> list[tuple[Queued, Rejection]]:
        return []

    def pop_ready(self, now_ns: int) -> list[Batch]:
        return []

    def next_deadline_ns(self) -> int | None:
        return None

    def due_batch(self) -> tuple[int, int] | None:
        return None

    def forming_room(self) -> tuple[int, int] | None:
        return None

    def drain_queue(self) -> list[Queued]:
        return []

    def cancel(self, key: Hashable) -> Queued | None:
        return None

    def queue_depth(self) -> int:
        return 0

    def levels(self) -> list[LevelSnapshot]:
        return []
