"""``frontend.native.known_answers.NativeAnswers`` and the inbox's reader hook, without a
server: a fake extension serves some records itself (None) and decodes the rest; a drain
that served some counts their tensor bytes into ``PendingTable.copied_bytes``, kicks once
and refills the ids; a drain that served none does neither; teaching passes each output's
form; stopping hands every owned call to Python and reads with the decoder again."""

from __future__ import annotations

from typing import Any

from triton_mp.frontend.dispatch.inbox import InboxHandler
from triton_mp.frontend.native.known_answers import NativeAnswers
from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.protocol.messages import InferResponse, TensorRef


class FakeNative:
    def __init__(self) -> None:
        self.own: list[bool] = []
        self.taught: list[tuple[Any, ...]] = []
        self.released = 0
        self.bytes = (0, 0)

    def known_answer(self, decode: Any, record: memoryview) -> Any:
        return None if bytes(record).startswith(b"native") else decode(record)

    def known_answer_own(self, on: bool) -> bool:
        self.own.append(on)
        return True

    def known_release(self) -> int:
        self.released += 1
        return 3

    def known_answer_teach(self, *args: Any) -> None:
        self.taught.append(args)

    def known_answer_take_bytes(self) -> tuple[int, int, int]:
        out, self.bytes = self.bytes, (0, 0, 0)
        return out


class FakeInbox:
    """``ipc.Inbox``: drains its records through ``read`` (or its decoder). Its wake-up is
    a semaphore: no answer thread reads it, the loop's drain hands records to C++ first."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.wakeup = Wakeup("semaphore", "/fake")

    def decode_buffer(self, record: memoryview) -> Any:
        return ("decoded", bytes(record))

    def drain(self, read: Any = None) -> list[Any]:
        dec = self.decode_buffer if read is None else read
        out, self.records = [dec(memoryview(r)) for r in self.records], []
        return out


class Pending:
    def __init__(self) -> None:
        self.copied_bytes = {"in": 0, "out": 0, "out_in_place": 0}
        self.delivered: list[Any] = []

    def deliver(self, msgs: Any) -> None:
        self.delivered.extend(msgs)


def rig() -> tuple[NativeAnswers, FakeNative, FakeInbox, InboxHandler, Pending, list[str]]:
    native, inbox, pending, events = FakeNative(), FakeInbox(), Pending(), []
    handler = InboxHandler(inbox, pending, None, None, None)  # type: ignore[arg-type]
    answers = NativeAnswers(
        native, pending, lambda: events.append("kick"), lambda: events.append("refill"),  # type: ignore[arg-type]
    )  # fmt: skip
    return answers, native, inbox, handler, pending, events


def test_a_drain_that_served_answers_counts_kicks_and_refills_once() -> None:
    answers, native, inbox, handler, pending, events = rig()
    assert answers.start(handler)
    assert native.own[-1] is True
    assert answers.queue is None
    inbox.records = [b"native 1", b"native 2"]
    native.bytes = (256, 128, 1 << 20)
    handler.on_wakeup()
    assert pending.copied_bytes == {"in": 256, "out": 128, "out_in_place": 1 << 20}
    assert events == ["kick", "refill"]
    assert pending.delivered == []
    events.clear()
    handler.on_wakeup()  # NOTE: nothing drained: nothing settled
    assert events == []


def test_records_it_does_not_serve_are_decoded_and_stopping_reads_with_the_decoder() -> None:
    answers, native, inbox, handler, pending, events = rig()
    answers.start(handler)
    response = InferResponse(request_id=1, version=1)
    inbox.decode_buffer = lambda record: response  # type: ignore[method-assign]
    handler.serve_answers_with(native.known_answer, answers.settle)
    inbox.records = [b"python"]
    handler.on_wakeup()
    assert pending.delivered == [response]
    assert events == []
    answers.stop()
    assert native.own[-1] is False
    assert native.released == 1
    inbox.records = [b"native but not any more"]
    handler.on_wakeup()
    assert pending.delivered == [response, response]


def test_teaching_passes_each_outputs_form() -> None:
    answers, native, *_ = rig()
    t = TensorRef("OUT", "FP32", (1, 16), "/w", 64, 64)
    answers.teach(
        7, InferResponse(request_id=1, version=3, outputs=(t,), parameters_json="{}"), b"H"
    )
    assert native.taught == [(7, 3, "{}", (("OUT", "FP32", (1, 16)),), b"H")]
