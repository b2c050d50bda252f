"""Known unary ModelInfer calls of the handoff, submitted and answered without a ticket.

Imported by ``frontend.native.handoff``. A unary call the native server split
(``request_split.cc``) whose wire key the frontend knows (``dispatch.known_requests``: the
checks passed for that key before) and that nothing per call sends the full way (no
tracing, no forwarded headers) is submitted straight from its split
(``Inference.submit_known_to``): no ``WireInferRequest``, no ``Ticket``, no
``InferResult``. Its one answer goes to its ``KnownCall`` (the pending table's sink), which
replies at once: the serialized ModelInferResponse (the cached head,
``grpc.messages.ResponseHeads``, and each output, ``grpc.wire.infer_response_parts``: a
view of the worker's arena that ``_native.reply`` copies once, straight into the gRPC
slice it sends, before the block is freed), or the status of its error, in the words
``ModelInfer`` answers with (``native.reply_status``). A call the client abandons is
cancelled as a ticket is (``KnownCall.cancel``): the scheduler drops the request, and an
answer that still arrives is freed.

Anything else (an unknown key, a declined request: a byte size that differs, a changed
model or region, draining, a model that preserves ordering) is left to the caller, which
serves it as before (``Handoff._call``).

A known call the native side submitted itself (``KNOWN``: its request already in the
scheduler's ring) is only registered here (``register``), from the ``Lesson`` it was
submitted by: the pending table's entry and its ``KnownCall``, answered and cancelled as
the others. A lesson's call that names client regions (``Lesson.held``) was counted in use
by C++ (``known_regions.h``) from its submission; registering it moves its holds to the
registry (``SystemShmRegistry.hold``, released at its answer as ``Inference._enqueue``'s
are), then ends C++'s (``release_held``), with no event-loop pass in between.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from triton_mp.common.errors import TritonMPError
from triton_mp.frontend.dispatch.known_requests import InBuffers, Raw, Received
from triton_mp.frontend.dispatch.pending import Answer, PendingTable, holding_sink
from triton_mp.frontend.grpc.messages import ResponseHeads
from triton_mp.frontend.grpc.wire import Split, infer_response_parts
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.native.reply_status import failed, unexpected
from triton_mp.ipc import BlockRef, SegmentCache
from triton_mp.ipc.protocol.messages import InferResponse

log = logging.getLogger(__name__)

ACCEPTED_LINE = "request %d accepted for '%s' version %d (batch size %d)"
"""The DEBUG line of each request accepted (``--log-verbose 1``): ``Inference._push``'s words,
for the calls the native side submitted (request id, model, version, batch size)."""

Reply = Callable[[int, int, str, "bytes | Sequence[bytes | memoryview]"], None]
"""Ends call ``call_id`` with (status code, details, serialized response: bytes, or the
parts of it, concatenated and copied before the reply returns)."""


KNOWN_KIND = 5
"""``handoff.h`` ItemKind::kKnown (``handoff.KNOWN``): a call the native side submitted."""
LESSONS_KEPT = 4096
"""Lessons kept for registration (the oldest go first: a call queued by a lesson is taken
within one event-loop pass, long before 4096 newer lessons were taught)."""

KnownSent = tuple[int, int, int, int]
"""What the native side sent for a KNOWN call: (request id, lesson id, input block offset,
block generation)."""


class Lesson(NamedTuple):
    """What the native side was taught to submit, as the call's registration needs it.

    Attributes:
        model, version: where its requests go; ``client_id``: the request ``id`` the
            record template was made for (C++ serves the lesson's calls with any id, each
            registered with its own: ``register``); ``segment``: the input arena its blocks are in;
        copied: raw input bytes copied per request (``PendingTable.copied_bytes["in"]``);
        held: the client regions each call names (``dispatch.inputs.region_ids``).
    """

    model: str
    version: int
    client_id: str
    segment: str
    copied: int
    held: tuple[int, ...] = ()
    batch_size: int = 1
    """The request's batch size (its form's: every call of the lesson has it)."""


class Gate(Protocol):
    """Whether a known call may skip the handler now (``InferenceServicer.known_allowed``)."""

    def known_allowed(self) -> bool: ...


class KnownCall:
    """One known call in flight: the pending table's sink for its request's answer.

    Attributes:
        call_id: the handoff's id of the call; ``client_id``: the request's ``id``.
        request_id: the frontend's id of the request; ``model``, ``version``: where it went.
    """

    __slots__ = (
        "_calls", "call_id", "client_id", "closed", "lesson_id", "model", "request_id", "version"
    )  # fmt: skip

    def __init__(self, calls: KnownCalls, call_id: int, client_id: str) -> None:
        self._calls = calls
        self.call_id = call_id
        self.client_id = client_id
        self.request_id = 0
        self.model = ""
        self.version = 0
        self.lesson_id = 0
        """The lesson the native side submitted it by (0: submitted by Python)."""
        self.closed = False
        """Answered or cancelled: an answer that arrives is freed."""

    def __call__(self, answer: Answer) -> None:
        if self.closed:
            if isinstance(answer, InferResponse):
                self._calls.pending.release(answer)
            return
        self.closed = True
        self._calls.answer(self, answer)

    def cancel(self) -> None:
        """The client abandoned the call: unless answered, the scheduler drops it."""
        if not self.closed:
            self.closed = True
            self._calls.inference.cancel(self.request_id, self.model, self.version)


class KnownCalls:
    """Submits and answers the handoff's known unary calls (module docstring).

    Args:
        inference: the frontend's submit path.
        heads: the servicer's response heads.
        gate: says whether tracing or header forwarding sends every call the full way.
        reply: ends a call (``Handoff._reply``).
    """

    def __init__(
        self,
        inference: Inference,
        heads: ResponseHeads,
        gate: Gate,
        reply: Reply,
    ) -> None:
        self.inference = inference
        self.pending: PendingTable = inference.pending
        self._cache: SegmentCache = inference.cache
        self._heads = heads
        self._gate = gate
        self._reply = reply
        self._known = inference.known_keys
        self.calls: dict[int, KnownCall] = {}
        """Calls submitted and not answered, by call id (``cancel``)."""
        self._lessons: dict[int, Lesson] = {}
        self._next_lesson = 1
        self.on_head: Callable[[int, InferResponse, bytes], None] | None = None
        """Called with (lesson id, answer, head) after a call the native side submitted was
        answered here (``known_answers.NativeAnswers.teach``)."""
        self.on_registered: Callable[[], None] | None = None
        """Called after ``register`` registered some: the native side may be short of
        request ids (``known_teach.NativeKnown.refill``)."""
        self.release_held: Callable[[tuple[int, ...]], None] | None = None
        """Ends the native side's holds of a call it sent (``_native.known_regions_release``),
        once ``register`` moved them to the registry."""

    def learn(self, lesson: Lesson) -> int:
        """Keep ``lesson`` for the registration of the calls the native side submits by it:
        its id (never 0)."""
        lesson_id = self._next_lesson
        self._next_lesson += 1
        lessons = self._lessons
        if len(lessons) >= LESSONS_KEPT:
            del lessons[next(iter(lessons))]
        lessons[lesson_id] = lesson
        return lesson_id

    def register(self, items: Iterable[tuple[int, int, Any, Any, Any]]) -> int:
        """Register every KNOWN entry of ``items`` (``_native.take``'s; its last item the
        call's request id, str or None: a lesson serves any id): its request in the
        pending table (its sink a ``KnownCall``, its input block freed after its answer) and
        its call. Returns how many."""
        n = 0
        pending = self.pending
        for call_id, kind, sent, _metadata, client_id in items:
            if kind != KNOWN_KIND:
                continue
            rid, lesson_id, offset, generation = sent
            lesson = self._lessons[lesson_id]
            call = KnownCall(self, call_id, client_id or "")  # NOTE: the call's own id
            call.request_id = rid
            call.lesson_id = lesson_id
            call.model = lesson.model
            call.version = lesson.version
            pending.copied_bytes["in"] += lesson.copied
            block = BlockRef(lesson.segment, offset, generation)
            if lesson.held:
                pending.add_request(rid, block, self._holding(call, lesson.held))
            else:
                pending.add_request(rid, block, call)
            self.calls[call_id] = call
            n += 1
        if n and self.on_registered is not None:
            self.on_registered()
        return n

    def log_accepted(self, sent: KnownSent) -> None:
        """An ACCEPTED entry (``sent``: what the native side sent for the call): the DEBUG line
        ``Inference`` writes for each request it accepts, in its words, from the call's
        lesson (one forgotten since, a call thousands of lessons old, goes unlogged)."""
        rid, lesson_id = sent[0], sent[1]
        lesson = self._lessons.get(lesson_id)
        if lesson is not None:
            log.debug(ACCEPTED_LINE, rid, lesson.model, lesson.version, lesson.batch_size)

    def _holding(self, call: KnownCall, held: tuple[int, ...]) -> Callable[[Answer], None]:
        """``call`` as the sink of a request holding ``held``: the holds move from the
        native side to the registry now, and end at its answer."""
        shm = self.inference.shm
        shm.hold(held)
        if self.release_held is not None:
            self.release_held(held)
        return holding_sink(call, lambda: shm.release(held), False)

    def submit(self, call_id: int, data: bytes | Received, split: Split | None) -> bool:
        """Submit call ``call_id`` (``data``: its request, bytes or as received; ``split``:
        the native split of it) if it is known. False: it is not taken (nothing was done).

        Raises:
            TritonMPError: as ``Inference.submit_known`` (the call fails with its status).
        """
        if split is None:
            return False
        _head, key, id_value, spans = split
        if key not in self._known or not self._gate.known_allowed():
            return False
        client_id = ""
        if id_value is not None:
            try:
                client_id = str(id_value, "utf-8")
            except UnicodeDecodeError:
                return False  # NOTE: the full way refuses it, in protobuf's words
        raw: Raw
        if type(data) is bytes:
            buf = memoryview(data)
            raw = [buf[at : at + n] for at, n in spans]
        else:  # NOTE: large entries stay in gRPC's slices until copied into the block
            raw = InBuffers(data, spans)  # type: ignore[arg-type]
        call = KnownCall(self, call_id, client_id)
        sent = self.inference.submit_known_to(key, client_id, raw, call)
        if sent is None:
            return False
        call.request_id, model, call.version = sent
        call.model = model.name
        self.calls[call_id] = call
        return True

    def cancel(self, call_id: int) -> bool:
        """The client abandoned call ``call_id``: cancel it. False: it is not a known call
        in flight."""
        call = self.calls.pop(call_id, None)
        if call is None:
            return False
        call.cancel()
        return True

    def answer(self, call: KnownCall, answer: Answer) -> None:
        """``call``'s one answer: reply with its response, or its error's status."""
        self.calls.pop(call.call_id, None)
        call_id = call.call_id
        error = answer.error
        if error is not None:
            if isinstance(answer, InferResponse):
                self.pending.release(answer)
            self._reply(call_id, *failed(TritonMPError(error.message, error.code)), b"")
            return
        assert isinstance(answer, InferResponse)
        try:
            try:
                parts = self._response_parts(call, answer)
            except TritonMPError as e:
                self._reply(call_id, *failed(e), b"")
            except Exception as e:  # noqa: BLE001 - grpc.aio's answer to a handler's exception
                self._reply(call_id, *unexpected(e), b"")
            else:
                # NOTE: the reply copies the parts (views of the answer's blocks) at once.
                self._reply(call_id, 0, "", parts)
                if call.lesson_id and self.on_head is not None:
                    self.on_head(call.lesson_id, answer, bytes(parts[0]))
        finally:
            self.pending.release(answer)

    def _response_parts(self, call: KnownCall, answer: InferResponse) -> list[bytes | memoryview]:
        """The serialized ModelInferResponse of ``answer`` in parts: the
        ``grpc.messages.infer_response_bytes`` of its ``InferResult``, its outputs views of
        the answer's blocks (valid until ``answer`` is released)."""
        outputs = answer.outputs
        head = self._heads.head(
            call.model, answer.version, call.client_id, answer.parameters_json, outputs
        )
        cache = self._cache
        views: list[memoryview | None] = []
        copied = 0
        for ref in outputs:
            if ref.region_id:
                views.append(None)
                continue
            if not ref.nbytes:  # NOTE: an all-empty group names no block (segment "")
                views.append(memoryview(b""))
                continue
            at = ref.offset
            views.append(memoryview(cache.get(ref.segment).buf)[at : at + ref.nbytes])
            copied += ref.nbytes
        self.pending.copied_bytes["out"] += copied
        return infer_response_parts(head, views)
