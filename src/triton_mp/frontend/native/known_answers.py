"""The answer of a known unary call the native side submitted, served by C++
(``known_answer.h``) without the event loop.

Imported by ``frontend.native.public_port``. Once started, the gRPC thread keeps each known
call it submits (the handoff's *owned* calls, ``handoff.h``) instead of queueing it for
``KnownCalls.register``, and a C++ thread reads the frontend's inbox in the event loop's place
(``answer_thread.h``, ``frontend.native.answer_thread``): a worker's answer whose every
response is an owned call's, plain (no error, no trace, outputs in arenas, its block handed
over whole) and of a form whose response head Python taught for the call's lesson, is served
there: the head and each output's bytes copied once from the worker's arena (a large output
sent in place), the output and input blocks freed, and the calls handed to gRPC from that
thread, without the GIL. Every other record reaches Python through the thread's queue, in
ring order, and is decoded and applied as always (``InboxHandler.read_through``). Where the
thread cannot start (an inbox woken by a semaphore), the loop's inbox drain hands every
record to C++ first instead (``InboxHandler.serve_answers_with``), which serves the same set
and ends the calls at the pass's kick.

Python keeps every rule and word: an owned call is handed to Python as the ``KNOWN`` entry
it would have been (``release``, which queues every owned call) whenever Python must see it:
an answer Python reads that names a request it does not know (an error, a ``RequestFailed``,
a form with no head yet: ``PendingTable.on_unknown`` -> ``Handoff.pull_known``), a client
that abandons the call (``handoff.cc`` Withdraw queues it before its cancel), and every
un-teaching (``known_teach.NativeKnown.forget``: the drain then counts it). Python answers
those as before and teaches the head of each answer it builds for a lesson's call
(``teach``), so the next call of that form is served natively.

Statistics stay exact: the tensor bytes of the calls served natively are added to
``PendingTable.copied_bytes`` after each drain of the thread's queue (before the records it
gave are applied, so before any ``StatsReply`` read after those answers), or after each loop
drain that served some (``settle``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from triton_mp.frontend.dispatch.inbox import AnswerSource
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.native.answer_thread import AnswerQueue
from triton_mp.frontend.native.answer_thread import Native as ThreadNative
from triton_mp.frontend.native.known_teach import IDS_LOW
from triton_mp.ipc.protocol.messages import InferResponse

log = logging.getLogger(__name__)


class Native(ThreadNative, Protocol):
    """The extension's ``known_answer*`` functions (``known_answer_py.cc``) and the answer
    thread's (``answer_thread_py.cc``)."""

    def known_answer(self, decode: Callable[[Any], Any], record: memoryview, /) -> Any: ...
    def known_answer_own(self, on: bool, /) -> bool: ...
    def known_release(self) -> int: ...
    def known_answer_teach(
        self,
        lesson_id: int,
        version: int,
        parameters_json: str,
        outputs: tuple[tuple[str, str, tuple[int, ...]], ...],
        head: bytes,
        /,
    ) -> bool: ...
    def known_answer_take_bytes(self) -> tuple[int, int, int]: ...


class Inbox(Protocol):
    """``InboxHandler``'s ways to read the inbox."""

    def serve_answers_with(
        self,
        serve: Callable[[Callable[[Any], Any], memoryview], Any] | None,
        settle: Callable[[], None] = ...,
    ) -> None: ...
    def fifo(self) -> tuple[str, tuple[str, ...]] | None: ...
    def read_through(self, queue: AnswerSource | None, settle: Callable[[], None]) -> None: ...
    @property
    def decode_buffer(self) -> Callable[[Any], Any]: ...


class NativeAnswers:
    """The answer side of the native known calls (module docstring).

    Args:
        native: the extension module.
        pending: the frontend's pending table (``copied_bytes``).
        answered: kicks the native side at the pass end (``Handoff.answered``).
        refill: hands C++ more request ids when few are left (``NativeKnown.refill``).
    """

    def __init__(
        self,
        native: Native,
        pending: PendingTable,
        answered: Callable[[], None],
        refill: Callable[[], None],
    ) -> None:
        self._native = native
        self._copied = pending.copied_bytes
        self._answered = answered
        self._refill = refill
        self._pending = pending
        self._inbox: Inbox | None = None
        self.queue: AnswerQueue | None = None
        """The answer thread's queue while it runs (``start``)."""

    def start(self, inbox: Inbox) -> bool:
        """Own the calls the gRPC thread submits from now on, and read the inbox's records
        first: on the answer thread where the inbox has a FIFO wake-up, else in the loop's
        drain. False: no native server (nothing changed)."""
        native = self._native
        if not native.known_answer_own(False):
            return False
        fifo = inbox.fifo()
        if fifo is not None:
            try:
                self.queue = AnswerQueue.start(
                    native, *fifo, IDS_LOW, inbox.decode_buffer, self._pending.__len__
                )
            except OSError:
                log.exception("the native answer thread did not start; the loop reads the inbox")
        self._inbox = inbox
        if self.queue is not None:
            inbox.read_through(self.queue, self.settle_counts)
        else:
            inbox.serve_answers_with(native.known_answer, self.settle)
        native.known_answer_own(True)
        return True

    def stop(self) -> None:
        """Own nothing more: stop the answer thread (what it queued is applied, the loop
        reads the rings again), and hand every owned call to Python."""
        if self._inbox is not None:
            if self.queue is not None:
                self.queue.stop()
                self.queue = None
                self._inbox.read_through(None, lambda: None)
            else:
                self._inbox.serve_answers_with(None)
            self._inbox = None
            self._native.known_answer_own(False)
            self.release()

    def release(self) -> int:
        """Queue every owned call for Python as its ``KNOWN`` entry; how many."""
        return self._native.known_release()

    def settle(self) -> None:
        """After a loop drain that served answers natively: count their tensor bytes, kick
        at the pass end, and refill the request ids C++ took."""
        self._count()
        self._answered()
        self._refill()

    def settle_counts(self) -> None:
        """Count the tensor bytes of the calls served natively since the last settle, and
        refill the request ids C++ took (after every drain of the answer thread's queue:
        the thread hands its answers to gRPC itself)."""
        self._count()
        self._refill()

    def _count(self) -> None:
        bytes_in, bytes_out, in_place = self._native.known_answer_take_bytes()
        if bytes_in or bytes_out or in_place:
            copied = self._copied
            copied["in"] += bytes_in
            copied["out"] += bytes_out
            copied["out_in_place"] += in_place

    def teach(self, lesson_id: int, answer: InferResponse, head: bytes) -> None:
        """Python answered a call of lesson ``lesson_id`` with ``head`` (its response
        without the outputs' bytes): C++ serves the next answers of that form."""
        forms = tuple((t.name, t.datatype, t.shape) for t in answer.outputs)
        self._native.known_answer_teach(
            lesson_id, answer.version, answer.parameters_json, forms, head
        )
