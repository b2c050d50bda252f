"""The one submit path of the frontend: a request in, a ``Ticket`` out, whatever the model.

Imported by the frontend only; no transport. ``Inference.submit`` takes a transport-free
``InferenceRequest`` (gRPC ModelInfer, a gRPC stream, HTTP), resolves its model, validates it
(``frontend.validation``), copies the inputs into one block of the frontend's arena (the one
host copy of the request path), registers it with the pending table and sends its
``InferRequest`` descriptor to the scheduler (``frontend.request_sender``: or to an idle
instance); the returned ``Ticket`` yields the answers, for
unary and decoupled models alike. Requests submitted one after another reach the scheduler
in that order (what a stream of sequence requests relies on).

The drain lives here too: ``start_draining`` refuses new requests (UNAVAILABLE, Triton's
message) and ``wait_drained`` awaits the moment the last accepted one is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Container, Hashable, Sequence
from dataclasses import dataclass
from typing import cast

from triton_mp.common.errors import ErrorCode, InvalidRequest, ModelUnavailable
from triton_mp.frontend.cache.response import Hit, ResponseCacheStep, cache_enabled, cacheable
from triton_mp.frontend.classification import Classify, classification
from triton_mp.frontend.dispatch.direct import DirectRoutes
from triton_mp.frontend.dispatch.inputs import region_ids, write_inputs
from triton_mp.frontend.dispatch.known_lane import KnownLane, patched_record
from triton_mp.frontend.dispatch.known_records import Form, Template
from triton_mp.frontend.dispatch.known_requests import KnownRequest, Raw, write_known
from triton_mp.frontend.dispatch.pending import Answer, PendingTable, holding_sink
from triton_mp.frontend.dispatch.ticket import Ticket
from triton_mp.frontend.dispatch.wakes import HeldWakes
from triton_mp.frontend.metrics.latency import FirstResponseHistograms, first_response_sink
from triton_mp.frontend.model_table import Model, ModelTable
from triton_mp.frontend.request import InferenceRequest
from triton_mp.frontend.request_sender import RequestSender
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.frontend.tracing.tracer import Trace
from triton_mp.frontend.validation.inputs import RefusedByBackend
from triton_mp.frontend.validation.request import ValidRequest, validate_request
from triton_mp.frontend.validation.signature import SignatureCache
from triton_mp.ipc import ArenaAllocator, BlockRef, SegmentCache, TensorRef, encode
from triton_mp.ipc.protocol.messages import (
    ReplyTo,
    Requester,
    RequestRefused,
)

KnownSent = Callable[[Hashable, KnownRequest, str, str], None]
"""Told of a known request sent on the patched lane: (key, known request, client id, the
input block's segment) (``Inference.teach_with``)."""

STOPPING_MESSAGE = (
    "Server is stopping, scheduler for model has stopped accepting new inference requests"
)
"""Triton's answer (UNAVAILABLE) to an inference that arrives while the server drains."""


@dataclass(frozen=True, slots=True)
class Target:
    """The model and concrete version a request was admitted for (``Inference.admit``)."""

    model: Model
    version: int


class Inference:
    """Submission of inference requests, and the drain.

    Args:
        frontend_id: this frontend's index (every request descriptor's ``reply_to``).
        models: the model table.
        shm: the registered client shared-memory regions.
        arena: this frontend's input arena allocator.
        cache: attached arenas (ours and the workers').
        pending: the table of requests waiting for answers.
        send_scheduler: pushes encoded bytes to the scheduler (raises TritonMPError
            UNAVAILABLE when the ring stays full, ``RecordTooLarge`` for an oversized one).
        clock_ns: the monotonic clock stamping ``arrival_ns``.
        response_cache: the response cache step (``frontend.cache.response``); None when
            the server has no cache.
        direct: the routes to idle instances (``frontend.dispatch.direct``); None hands nothing
            directly.
        latency: the first-response histograms (``--metrics-config
            histogram_latencies=true``, ``frontend.metrics.latency``); None: off.
        wakes: requests' sends whose wakes ``wakes_held`` holds (``frontend.dispatch.wakes``,
            over the same ring as ``send_scheduler``); None: a wake per request.

    Attributes:
        draining: set by ``start_draining``: new requests are refused (UNAVAILABLE).
    """

    def __init__(
        self,
        *,
        frontend_id: int,
        models: ModelTable,
        shm: SystemShmRegistry,
        arena: ArenaAllocator,
        cache: SegmentCache,
        pending: PendingTable,
        send_scheduler: Callable[[bytes], None],
        clock_ns: Callable[[], int] = time.monotonic_ns,
        response_cache: ResponseCacheStep | None = None,
        direct: DirectRoutes | None = None,
        latency: FirstResponseHistograms | None = None,
        wakes: HeldWakes | None = None,
    ) -> None:
        self._latency = latency
        self._models = models
        self._shm = shm
        self._arena = arena
        self._cache = cache
        self._pending = pending
        send = (lambda data, _bit: send_scheduler(data)) if wakes is None else wakes.send
        reply_to = ReplyTo(Requester.FRONTEND, frontend_id)
        self._sender = RequestSender(reply_to, pending, send, clock_ns, direct)
        self._wakes = wakes
        self._send_scheduler = send_scheduler
        self._clock_ns = clock_ns
        self._response_cache = response_cache
        self._signatures = SignatureCache()
        """Request signatures that passed validation (keyed by the ``Model`` object)."""
        self._lane = KnownLane(models, shm)
        """Requests that passed, by their transport's key (``submit_known``)."""
        self._known_sent: KnownSent | None = None
        self._unteach: Callable[[], None] | None = None
        self.draining = False

    @property
    def shm(self) -> SystemShmRegistry:
        """The client regions requests name (``hold`` / ``release`` their uses)."""
        return self._shm

    def teach_with(self, sent: KnownSent, unteach: Callable[[], None]) -> None:
        """A producer that submits known calls itself learns from this path
        (``frontend.native.known_teach``): ``sent`` gets every known request sent on the
        patched lane (key, known request, client id, input block's segment); ``unteach``
        is called when the drain starts or a known key is dropped."""
        self._known_sent = sent
        self._unteach = unteach
        self._lane.on_forget(unteach)

    @property
    def pending(self) -> PendingTable:
        """The requests awaiting answers (their sinks release answers' blocks through it)."""
        return self._pending

    @property
    def cache(self) -> SegmentCache:
        """The attached arenas (answers' outputs are read from them)."""
        return self._cache

    def close(self) -> None:
        """Unlink the first-response histograms' board (the frontend is stopping)."""
        if self._latency is not None:
            self._latency.close()

    def wakes_held(self) -> contextlib.AbstractContextManager[None]:
        """The requests submitted inside wake the scheduler once, when it ends (a
        transport that took several requests at once: ``frontend.native.handoff``)."""
        return contextlib.nullcontext() if self._wakes is None else self._wakes.held()

    # ------------------------------------------------------------------ admission
    def check_accepting(self) -> None:
        """Refuse new inferences while the server drains.

        Raises:
            ModelUnavailable: UNAVAILABLE "Server is stopping, ...".
        """
        if self.draining:
            raise ModelUnavailable(STOPPING_MESSAGE)

    def admit(self, name: str, version: str, *, decoupled_message: str | None = None) -> Target:
        """The model and concrete version a request names, if the server takes it now.

        A transport that must refuse a request before reading all of it (HTTP reads the
        body after this) calls this first and passes the target on to ``submit``.

        Args:
            name: the model; ``version``: as sent ("" = the latest ready one).
            decoupled_message: the UNSUPPORTED text for a decoupled model on a transport
                that answers once per request; None when decoupled models are served.

        Raises:
            TritonMPError: UNAVAILABLE while draining; NOT_FOUND, UNAVAILABLE or INVALID_ARG
                from ``ModelTable.resolve``; UNSUPPORTED ``decoupled_message``.
        """
        self.check_accepting()
        model, v = self._models.resolve(name, version)
        if decoupled_message is not None:
            self._refuse_decoupled(model, decoupled_message)
        return Target(model, v)

    @staticmethod
    def _refuse_decoupled(model: Model, message: str) -> None:
        if model.decoupled:
            raise InvalidRequest(message, ErrorCode.UNSUPPORTED)

    # ------------------------------------------------------------------ submission
    def submit(
        self,
        request: InferenceRequest,
        *,
        decoupled_message: str | None = None,
        target: Target | None = None,
        trace: Trace | None = None,
        known_key: Hashable = None,
    ) -> Ticket:
        """Validate ``request``, write its inputs, send it; its ticket yields the answers.

        Args:
            request: the request, from any transport.
            decoupled_message: the UNSUPPORTED text for a decoupled model (it names the
                transport's endpoint, as Triton's does); None serves decoupled models.
            target: what ``admit`` returned for this request (its checks are not repeated
                unless the model table changed meanwhile).
            trace: the request's trace when it was sampled (``frontend.tracing.tracer``).
            known_key: the transport's name for the request without its tensor bytes and
                id (``frontend.dispatch.known_requests``); when it passes and qualifies, later
                requests with this key may go through ``submit_known``. Only one
                transport endpoint may use a key space (the key stands for its
                ``decoupled_message`` too).

        Raises:
            TritonMPError: every validation failure (triton.md §4.9), in Triton's order:
                UNAVAILABLE while draining, the model's resolution, the request's own
                rules, then UNSUPPORTED for a decoupled model; UNAVAILABLE when the arena
                or the ring to the scheduler is full; INVALID_ARG for a descriptor over the
                ring's record limit.
        """
        start_ns = self._clock_ns()
        target, valid = self._validate(request, decoupled_message, target)
        model = target.model
        # NOTE: the cache is one small step of its own: a hit answers here, without the
        # arena, the pending table or the scheduler; a miss inserts on its way back.
        step, miss = self._response_cache, None
        if step is not None and cache_enabled(model.config) and cacheable(valid):
            key, lookup_ns, hit = step.lookup(valid, start_ns)
            if hit is not None:
                if self._latency is not None:  # NOTE: core observes a cached response too
                    self._latency.observe(model.config, target.version, start_ns)
                return self._hit_ticket(request, target, hit)
            miss = (key, lookup_ns)
        block, refs = write_inputs(self._arena, valid)
        classify = classification(request, model)
        ticket = self._ticket(model, target.version, request.id, trace, classify)
        sink: Callable[[Answer], None] = ticket.deliver
        if miss is not None and step is not None:
            sink = step.inserting_sink(sink, valid, *miss)
        held = region_ids(valid)
        self._enqueue(ticket.request_id, request.id, valid, block, refs, sink, trace, held)
        if known_key is not None and trace is None and miss is None:
            self._lane.remember(known_key, request, valid, classify, held)
        return ticket

    @property
    def known_keys(self) -> Container[Hashable]:
        """The keys ``submit_known`` may take requests for (it may still decline one)."""
        return self._lane.keys

    def submit_known(
        self,
        key: Hashable,
        client_id: str,
        raw: Sequence[bytes | memoryview],
        in_task: bool = True,
    ) -> Ticket | None:
        """``submit`` for a request whose key passed before (``frontend.dispatch.known_requests``),
        straight from its raw input bytes: no request object, no validation.

        Args:
            key: the request's ``known_key``; ``client_id``: its id; ``raw``: its
                ``raw_input_contents``.
            in_task: whether the caller awaits the ticket in a task; False (answered from
                the ticket's callback) is declined for a model that preserves ordering
                (``dynamic_batching.preserve_ordering``): the pending table releases its
                answers in order, and the calls awaiting them in tasks reply a loop pass
                later, so a callback's reply would overtake theirs.

        Returns:
            The ticket, or None when the key is not known or the request needs the full
            path (a byte size that differs, the model or the registered shared-memory
            regions changed, the server draining):
            the caller then calls ``submit``, which answers as for any request.

        Raises:
            TritonMPError: UNAVAILABLE when the arena or the ring to the scheduler is
                full; INVALID_ARG for a descriptor over the ring's record limit.
        """
        known = self._lane.entry(key, raw, in_task, self.draining)
        if known is None:
            return None
        valid = known.valid
        block, refs = write_known(self._arena, known, raw)
        ticket = self._ticket(known.model, valid.version, client_id, None, None)
        rid, sink = ticket.request_id, ticket.deliver
        self._enqueue(rid, client_id, valid, block, refs, sink, None, known.held, known.templates)
        return ticket

    def submit_known_to(
        self,
        key: Hashable,
        client_id: str,
        raw: Raw,
        sink: Callable[[Answer], None],
    ) -> tuple[int, Model, int] | None:
        """``submit_known`` without a ticket, for a caller answered from its callback
        (``in_task`` False): ``sink`` gets the request's one answer (an ``InferResponse``,
        whose blocks it releases through the pending table, or a ``RequestFailed``).
        ``raw`` may still lie in the receive buffers (``InBuffers``: copied from there
        straight into the input block).

        Returns:
            (request id, model, version), for ``cancel``; None as ``submit_known``.

        Raises:
            TritonMPError: as ``submit_known``.
        """
        known = self._lane.entry(key, raw, False, self.draining)
        if known is None:
            return None
        valid = known.valid
        block, refs = write_known(self._arena, known, raw)
        pending = self._pending
        rid = pending.new_id()
        model = known.model
        record = None
        plain = self._latency is None  # NOTE: no histogram to feed
        if plain:
            record = patched_record(known, rid, client_id, self._clock_ns(), block, refs)
        if record is None:
            args = (rid, client_id, valid, block, refs, sink, None, known.held, known.templates)
            self._enqueue(*args)
            if plain and self._known_sent is not None:
                # NOTE: taught from this call's template, just kept: a native lesson serves
                # any id, so a client with a new id on every call is taught too (and a
                # request naming client regions, held here)
                self._known_sent(key, known, client_id, block.segment)
            return rid, model, valid.version
        # NOTE: ``_enqueue`` and ``RequestSender.send`` for what a known call mostly is.
        pending.copied_bytes["in"] += sum(known.sizes)
        pending.add_request(rid, block, sink, streaming=model.decoupled)
        if not self._sender.hand(rid, valid, record[0]):
            self._sender.push(rid, client_id, valid, *record)
        if self._known_sent is not None:
            self._known_sent(key, known, client_id, block.segment)
        return rid, model, valid.version

    def _validate(
        self, request: InferenceRequest, decoupled_message: str | None, target: Target | None
    ) -> tuple[Target, ValidRequest]:
        """``submit``'s checks, in Triton's order (its Raises)."""
        self.check_accepting()
        if target is None or not self._models.is_current(target.model):
            target = self.admit(request.model_name, request.model_version)
            valid = self._checked(request, target)
            if decoupled_message is not None:
                self._refuse_decoupled(target.model, decoupled_message)
            return target, valid
        return target, self._checked(request, target)

    def _checked(self, request: InferenceRequest, target: Target) -> ValidRequest:
        """``validate_request``; a refusal Triton's backend would have made is counted as
        the model's failure (``RefusedByBackend``)."""
        start_ns = self._clock_ns()
        try:
            return validate_request(
                request, target.model, target.version, self._shm, self._signatures
            )
        except RefusedByBackend:
            took = self._clock_ns() - start_ns
            refused = RequestRefused(
                model=target.model.name, version=target.version, request_ns=took
            )
            self._send_scheduler(encode(refused))
            raise

    def _ticket(
        self,
        model: Model,
        version: int,
        client_id: str,
        trace: Trace | None,
        classify: Classify | None,
    ) -> Ticket:
        """A new request id and its ticket."""
        rid = self._pending.new_id()
        return Ticket(
            request_id=rid,
            model=model.name,
            version=version,
            client_id=client_id,
            decoupled=model.decoupled,
            cancel_request=lambda: self.cancel(rid, model.name, version),
            cache=self._cache,
            pending=self._pending,
            trace=trace,
            classify=classify,
        )

    def _enqueue(
        self,
        rid: int,
        client_id: str,
        valid: ValidRequest,
        block: BlockRef,
        refs: tuple[TensorRef, ...],
        sink: Callable[[Answer], None],
        trace: Trace | None,
        held: tuple[int, ...],
        templates: dict[Form, Template] | None = None,
    ) -> None:
        """Hold the client regions the request names (``held``: their ``region_id`` s),
        register it with the pending table and send its descriptor (the input block is
        freed and the regions released when the send fails); ``templates``: a known
        request's records (``RequestSender.send``)."""
        model = valid.model
        if self._latency is not None:
            sink = first_response_sink(sink, self._latency, model.config, valid.version)
        if held:
            # NOTE: Triton refuses to unregister a region while a request uses it.
            shm = self._shm
            shm.hold(held)
            sink = holding_sink(sink, lambda: shm.release(held), model.decoupled)
        pending = self._pending
        pending.copied_bytes["in"] += sum(r.nbytes for r in refs if not r.region_id)
        order = (model.name, valid.version) if model.preserve_ordering else None
        try:
            pending.add_request(rid, block, sink, order=order, streaming=model.decoupled)
            self._sender.send(rid, client_id, valid, block, refs, trace, templates)
        except BaseException:
            if held:
                self._shm.release(held)
            raise

    def _hit_ticket(self, request: InferenceRequest, target: Target, hit: Hit) -> Ticket:
        """A ticket that already holds the cached answer (its outputs are in the entry)."""
        ticket = Ticket(
            request_id=0,
            model=target.model.name,
            version=target.version,
            client_id=request.id,
            decoupled=False,
            cancel_request=lambda: None,
            cache=cast(SegmentCache, hit.segments),
            pending=self._pending,
            classify=classification(request, target.model),
        )
        ticket.deliver(hit.response)
        return ticket

    def cancel(self, rid: int, model: str, version: int) -> None:
        """Tell the scheduler to drop request ``rid`` (a queued one is never run)."""
        self._sender.cancel(rid, model, version)

    # ----------------------------------------------------------------------- drain
    def start_draining(self) -> None:
        """Refuse new requests from now on (accepted ones are still answered)."""
        self.draining = True
        if self._unteach is not None:
            self._unteach()

    async def wait_drained(self, timeout_s: float) -> bool:
        """Wait until every accepted request has been answered, up to ``timeout_s``.

        Returns:
            True when none is left, False when the timeout ran out first.
        """
        if not len(self._pending):
            return True
        try:
            await asyncio.wait_for(self._pending.wait_idle(), max(0.0, timeout_s))
        except TimeoutError:
            return False
        return True
