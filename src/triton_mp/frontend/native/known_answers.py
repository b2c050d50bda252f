"""The answer of a known unary call the native side submitted, served by C++
(``known_answer.h``) without the event loop's per-call work.

Imported by ``frontend.native.public_port``. Once started, the gRPC thread keeps each known
call it submits (the handoff's *owned* calls, ``handoff.h``) instead of queueing it for
``KnownCalls.register``. The inbox's drain hands every record to C++ first
(``InboxHandler.serve_answers_with``): a worker's answer whose every response is an owned
call's, plain (no error, no trace, outputs in arenas, its block handed over whole) and of a
form whose response head Python taught for the call's lesson, is served there: the head and
each output's bytes copied once from the worker's arena, the output and input blocks freed,
the call ended at the pass's kick. Everything else is decoded by Python as always.

Python keeps every rule and word: an owned call is handed to Python as the ``KNOWN`` entry
it would have been (``release``, which queues every owned call) whenever Python must see it:
an answer Python reads that names a request it does not know (an error, a ``RequestFailed``,
a form with no head yet: ``PendingTable.on_unknown`` -> ``Handoff.pull_known``), a client
that abandons the call (``handoff.cc`` Withdraw queues it before its cancel), and every
un-teaching (``known_teach.NativeKnown.forget``: the drain then counts it). Python answers
those as before and teaches the head of each answer it builds for a lesson's call
(``teach``), so the next call of that form is served natively.

Statistics stay exact: the tensor bytes of the calls served natively are added to
``PendingTable.copied_bytes`` after each drain that served some (``settle``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.ipc.protocol.messages import InferResponse


class Native(Protocol):
    """The extension's ``known_answer*`` functions (``known_answer_py.cc``)."""

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
    ) -> None: ...
    def known_answer_take_bytes(self) -> tuple[int, int, int]: ...


class Inbox(Protocol):
    """``InboxHandler.serve_answers_with``."""

    def serve_answers_with(
        self,
        serve: Callable[[Callable[[Any], Any], memoryview], Any] | None,
        settle: Callable[[], None] = ...,
    ) -> None: ...


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
        self._inbox: Inbox | None = None

    def start(self, inbox: Inbox) -> bool:
        """Own the calls the gRPC thread submits from now on, and read the inbox's records
        first. False: no native server (nothing changed)."""
        if not self._native.known_answer_own(True):
            return False
        self._inbox = inbox
        inbox.serve_answers_with(self._native.known_answer, self.settle)
        return True

    def stop(self) -> None:
        """Own nothing more; hand every owned call to Python."""
        if self._inbox is not None:
            self._inbox.serve_answers_with(None)
            self._inbox = None
            self._native.known_answer_own(False)
            self.release()

    def release(self) -> int:
        """Queue every owned call for Python as its ``KNOWN`` entry; how many."""
        return self._native.known_release()

    def settle(self) -> None:
        """After a drain that served answers natively: count their tensor bytes, kick at
        the pass end, and refill the request ids C++ took."""
        bytes_in, bytes_out, in_place = self._native.known_answer_take_bytes()
        copied = self._copied
        copied["in"] += bytes_in
        copied["out"] += bytes_out
        copied["out_in_place"] += in_place
        self._answered()
        self._refill()

    def teach(self, lesson_id: int, answer: InferResponse, head: bytes) -> None:
        """Python answered a call of lesson ``lesson_id`` with ``head`` (its response
        without the outputs' bytes): C++ serves the next answers of that form."""
        forms = tuple((t.name, t.datatype, t.shape) for t in answer.outputs)
        self._native.known_answer_teach(
            lesson_id, answer.version, answer.parameters_json, forms, head
        )
