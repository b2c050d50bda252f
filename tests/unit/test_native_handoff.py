"""The Python side of the native handoff (``frontend.native.handoff.Handoff``), without a
native server: a fake extension queues entries as ``handoff.cc`` does and records what
Python writes and replies; a fake servicer stands in for ``InferenceServicer``."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from itertools import pairwise
from typing import Any

import grpc
import pytest

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.dispatch.polling_loop import PollingSelector
from triton_mp.frontend.grpc.wire import MALFORMED, WireInferRequest
from triton_mp.frontend.native.handoff import CALL, END, GONE, LOST, MESSAGE, OPEN, Handoff
from triton_mp.ipc import ChannelTimeout


class FakeNative:
    """``_native``'s handoff functions: ``queue`` what take() returns next; ``sent`` holds
    every write ("write", id, bytes), reply ("reply", id, code, details, bytes) and kick
    ("kick",); ``answers`` the writes and replies alone."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK)
        self.items: list[tuple[int, int, bytes | None, Any]] = []
        self.sent: list[tuple[Any, ...]] = []

    def queue(self, *items: tuple[int, int, bytes | None, Any]) -> None:
        self.items.extend(items)
        os.eventfd_write(self.fd, 1)

    @property
    def answers(self) -> list[tuple[Any, ...]]:
        return [s for s in self.sent if s[0] != "kick"]

    def handoff_fd(self) -> int:
        return self.fd

    def known_log(self, on: bool) -> bool:
        return True

    def take(self) -> list[tuple[int, int, bytes | None, Any, Any]]:
        out, self.items = self.items, []
        return [(*item, None) for item in out]  # NOTE: no native split: Python scans

    def reply(self, call_id: int, code: int, details: str, data: bytes) -> bool:
        self.sent.append(("reply", call_id, code, details, bytes(data)))
        return True

    def write(self, call_id: int, data: bytes) -> bool:
        self.sent.append(("write", call_id, bytes(data)))
        return True

    def kick(self) -> None:
        self.sent.append(("kick",))


def response(rid: str) -> pb.ModelStreamInferResponse:
    return pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=rid))


class FakeTicket:
    """``Ticket``'s unary face: ``answer`` delivers an answer (bytes, or an error)."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.notify: Any = None
        self.queue: list[bytes | TritonMPError] = []
        self.cancelled = False

    def answer(self, value: bytes | TritonMPError) -> None:
        self.queue.append(value)
        if self.notify is not None:
            self.notify(self)

    def on_answer(self, notify: Any) -> None:
        self.notify = notify
        if self.queue:
            notify(self)

    def take_result(self) -> bytes:
        value = self.queue.pop(0)
        if isinstance(value, TritonMPError):
            raise value
        return value

    def cancel(self) -> None:
        self.cancelled = True


class FakeServicer:
    """Answers each stream request with one response per ``repeat`` parameter (default 1)
    carrying its id, "abort" aborts the stream, "boom" raises; ``seen`` records what the
    stream handler got (ids, or MALFORMED) and whether it was cancelled.

    A unary request ``known:...`` parses to a ``WireInferRequest`` with that key, which
    ``submit_known`` takes (``tickets``; ``known:full`` raises UNAVAILABLE, ``known:no``
    declines it to the handler); ``log`` records submissions and held wakes in order."""

    def __init__(self) -> None:
        self.seen: list[object] = []
        self.metadata: list[object] = []
        self.tickets: list[FakeTicket] = []
        self.log: list[object] = []

    def parse_split(self, data: bytes, split: Any) -> Any:
        assert split is None
        if data.startswith(b"known:"):
            return WireInferRequest(None, [], head=data, key=data)
        return data

    def submit_known(self, request: WireInferRequest, in_task: bool = True) -> FakeTicket | None:
        assert request.key is not None
        assert not in_task  # NOTE: the handoff answers from the ticket's callback
        self.log.append(request.key)
        if request.key == b"known:full":
            raise TritonMPError("the arena is full", ErrorCode.UNAVAILABLE)
        if request.key == b"known:no":
            return None
        self.tickets.append(FakeTicket(request.key))
        return self.tickets[-1]

    def response_bytes(self, result: bytes) -> bytes:
        return b"answer:" + result

    @contextlib.contextmanager
    def wakes_held(self) -> Iterator[None]:
        self.log.append("held")
        yield
        self.log.append("wake")

    async def ModelInfer(self, request: Any, context: Any) -> bytes:  # noqa: N802
        if isinstance(request, WireInferRequest):
            return b"handler:" + request.key  # type: ignore[operator]
        return b"answer:" + request

    async def ModelStreamInfer(  # noqa: N802
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        self.metadata.append(tuple(context.invocation_metadata()))
        try:
            async for request in request_iterator:
                if request is MALFORMED:
                    self.seen.append(MALFORMED)
                    break
                self.seen.append(request.id)
                if request.id == "abort":
                    await context.abort(grpc.StatusCode.INTERNAL, "stopped")
                if request.id == "boom":
                    raise ValueError("boom")
                if request.id == "slow":
                    await asyncio.sleep(60)
                repeat = request.parameters["repeat"].int64_param or 1
                for _ in range(repeat):
                    yield response(request.id)
        except asyncio.CancelledError:
            self.seen.append("cancelled")
            raise


def request(rid: str, repeat: int = 0) -> bytes:
    req = pb.ModelInferRequest(model_name="m", id=rid)
    if repeat:
        req.parameters["repeat"].int64_param = repeat
    return bytes(req.SerializeToString())


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def run(native: FakeNative, servicer: FakeServicer, *batches: list[Any]) -> None:
    handoff = Handoff(native, servicer)
    handoff.start(asyncio.get_running_loop())
    try:
        for batch in batches:
            native.queue(*batch)
            await settle()
    finally:
        handoff.stop()


def writes(native: FakeNative, call_id: int) -> list[str]:
    return [
        pb.ModelStreamInferResponse.FromString(s[2]).infer_response.id
        for s in native.sent
        if s[0] == "write" and s[1] == call_id
    ]


def test_a_streams_messages_are_served_in_order_then_its_end() -> None:
    native, servicer = FakeNative(), FakeServicer()
    asyncio.run(
        run(
            native,
            servicer,
            [(7, OPEN, None, (("triton_grpc_error", "true"),)), (7, MESSAGE, request("a"), None)],
            [(7, MESSAGE, request("b", repeat=3), None), (7, MESSAGE, request("c"), None)],
            [(7, END, None, None)],
        )
    )
    assert servicer.metadata == [(("triton_grpc_error", "true"),)]
    assert servicer.seen == ["a", "b", "c"]
    assert writes(native, 7) == ["a", "b", "b", "b", "c"]
    assert native.answers[-1] == ("reply", 7, 0, "", b"")
    # every answer is followed by a kick in the same pass, one per pass
    assert native.sent[-1] == ("kick",)
    assert ("kick",) not in [a for a, b in pairwise(native.sent) if a == b]


class SelectSpy(PollingSelector):
    """A ``PollingSelector`` that says whether a ``select`` is running (``inside``)."""

    inside = False

    def select(self, timeout: float | None = None) -> Any:
        self.inside = True
        try:
            return super().select(timeout)
        finally:
            self.inside = False


def test_on_the_frontends_selector_each_pass_ends_with_one_kick() -> None:
    """On the frontend's loop (a ``PollingSelector``) the kick runs at the pass end, from
    the selector, not from a ``call_soon`` pass of its own: the answers are the same and
    each is followed by a kick."""
    selector = SelectSpy()
    kicks: list[bool] = []

    class Native(FakeNative):
        def kick(self) -> None:
            kicks.append(selector.inside)
            super().kick()

    native, servicer = Native(), FakeServicer()
    batches = (
        [(7, OPEN, None, ()), (7, MESSAGE, request("a", repeat=2), None)],
        [(7, END, None, None)],
    )
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector)) as runner:
        runner.run(run(native, servicer, *batches))
    assert writes(native, 7) == ["a", "a"]
    assert native.answers[-1] == ("reply", 7, 0, "", b"")
    assert native.sent[-1] == ("kick",)
    assert ("kick",) not in [a for a, b in pairwise(native.sent) if a == b]
    assert kicks
    assert all(kicks)


def test_a_stream_waits_for_its_half_close() -> None:
    native, servicer = FakeNative(), FakeServicer()
    asyncio.run(run(native, servicer, [(1, OPEN, None, ()), (1, MESSAGE, request("a"), None)]))
    assert writes(native, 1) == ["a"]
    assert [s for s in native.sent if s[0] == "reply"] == []
    assert native.sent[-1] == ("kick",)


def test_two_streams_are_kept_apart() -> None:
    native, servicer = FakeNative(), FakeServicer()
    asyncio.run(
        run(
            native,
            servicer,
            [(1, OPEN, None, ()), (2, OPEN, None, ()), (2, MESSAGE, request("x"), None)],
            [(1, MESSAGE, request("y"), None), (2, END, None, None), (1, END, None, None)],
        )
    )
    assert (writes(native, 1), writes(native, 2)) == (["y"], ["x"])
    assert {s[1] for s in native.sent if s[0] == "reply"} == {1, 2}


@pytest.mark.parametrize(
    ("rid", "code", "details"),
    [
        ("abort", grpc.StatusCode.INTERNAL.value[0], "stopped"),
        ("boom", grpc.StatusCode.UNKNOWN.value[0], "Unexpected <class 'ValueError'>: boom"),
    ],
)
def test_a_streams_status_is_the_handlers(rid: str, code: int, details: str) -> None:
    native, servicer = FakeNative(), FakeServicer()
    asyncio.run(run(native, servicer, [(3, OPEN, None, ()), (3, MESSAGE, request(rid), None)]))
    assert native.answers == [("reply", 3, code, details, b"")]


def test_a_message_that_does_not_parse_reaches_the_handler_as_malformed() -> None:
    native, servicer = FakeNative(), FakeServicer()
    asyncio.run(
        run(
            native,
            servicer,
            [(4, OPEN, None, ()), (4, MESSAGE, b"\x0a\x05ab", None)],
            [(4, MESSAGE, request("late"), None)],
        )
    )
    assert servicer.seen == [MALFORMED]
    assert native.answers == [("reply", 4, 0, "", b"")]


def test_a_gone_stream_cancels_its_handler_and_replies_nothing() -> None:
    native, servicer = FakeNative(), FakeServicer()
    asyncio.run(
        run(
            native,
            servicer,
            [(5, OPEN, None, ()), (5, MESSAGE, request("slow"), None)],
            [(5, GONE, None, None), (5, MESSAGE, request("late"), None)],
        )
    )
    assert servicer.seen == ["slow", "cancelled"]
    assert native.answers == []


def test_a_unary_call_is_answered() -> None:
    native, servicer = FakeNative(), FakeServicer()
    asyncio.run(run(native, servicer, [(9, CALL, b"q", ())]))
    assert native.answers == [("reply", 9, 0, "", b"answer:q")]


def test_known_calls_taken_at_once_are_submitted_under_one_wake_and_answered_in_turn() -> None:
    native, servicer = FakeNative(), FakeServicer()

    async def go() -> None:
        handoff = Handoff(native, servicer)
        handoff.start(asyncio.get_running_loop())
        native.queue((1, CALL, b"known:a", ()), (2, CALL, b"known:b", ()))
        await settle()
        assert servicer.log == ["held", b"known:a", b"known:b", "wake"]
        assert native.answers == []  # NOTE: nothing before the answers arrive
        servicer.tickets[1].answer(b"B")
        servicer.tickets[0].answer(TritonMPError("the model failed", ErrorCode.INTERNAL))
        await settle()
        handoff.stop()

    asyncio.run(go())
    assert native.answers == [
        ("reply", 2, 0, "", b"answer:B"),
        ("reply", 1, grpc.StatusCode.INTERNAL.value[0], "the model failed", b""),
    ]
    assert native.sent[-1] == ("kick",)


def test_a_known_call_that_submit_refuses_gets_its_status_and_a_declined_one_the_handler() -> None:
    native, servicer = FakeNative(), FakeServicer()
    asyncio.run(run(native, servicer, [(3, CALL, b"known:full", ()), (4, CALL, b"known:no", ())]))
    assert native.answers == [
        ("reply", 3, grpc.StatusCode.UNAVAILABLE.value[0], "the arena is full", b""),
        ("reply", 4, 0, "", b"handler:known:no"),
    ]


def test_a_lost_known_call_fails_unavailable_in_the_words_of_a_full_ring() -> None:
    """A known call whose direct handoff C++ lost (a lease taken, then the ring to the
    scheduler full past its timeout) fails as Python's hand fails it: UNAVAILABLE with the
    ring's ``ChannelTimeout`` words; the handler never sees it."""
    native, servicer = FakeNative(), FakeServicer()
    words = "ring /triton_mp_fe0_sched full for 10.0s"

    async def go() -> None:
        handoff = Handoff(native, servicer)
        handoff.lost = lambda: ChannelTimeout(words)
        handoff.start(asyncio.get_running_loop())
        native.queue((6, LOST, None, None))
        await settle()
        handoff.stop()

    asyncio.run(go())
    assert native.answers == [("reply", 6, grpc.StatusCode.UNAVAILABLE.value[0], words, b"")]
    assert servicer.log == ["held", "wake"]


def test_a_gone_known_call_cancels_its_ticket_and_replies_nothing() -> None:
    native, servicer = FakeNative(), FakeServicer()
    asyncio.run(run(native, servicer, [(5, CALL, b"known:a", ())], [(5, GONE, None, None)]))
    assert servicer.tickets[0].cancelled
    servicer.tickets[0].answer(b"late")  # NOTE: a real ticket drops it once cancelled
    assert native.answers == []


class FakeKnownCalls:
    """``KnownCalls``' face: takes calls whose data starts with ``fast:`` (``fast:full``
    raises UNAVAILABLE); ``answer`` replies one through the handoff's reply."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.taken: list[int] = []
        self.cancelled: list[int] = []
        self.pending = type("Pending", (), {"on_unknown": None})()

    def register(self, items: list[Any]) -> int:
        return 0

    def submit(self, call_id: int, data: bytes, split: Any) -> bool:
        if data == b"fast:full":
            raise TritonMPError("the arena is full", ErrorCode.UNAVAILABLE)
        if not data.startswith(b"fast:"):
            return False
        self.taken.append(call_id)
        return True

    def cancel(self, call_id: int) -> bool:
        if call_id not in self.taken:
            return False
        self.cancelled.append(call_id)
        return True


def test_known_calls_take_their_calls_first_and_the_rest_go_on_as_before() -> None:
    native, servicer = FakeNative(), FakeServicer()
    fast: list[FakeKnownCalls] = []

    def known_calls(reply: Any) -> FakeKnownCalls:
        fast.append(FakeKnownCalls(reply))
        return fast[0]

    async def go() -> None:
        handoff = Handoff(native, servicer, known_calls)  # type: ignore[arg-type]
        handoff.start(asyncio.get_running_loop())
        batch = [(1, CALL, b"fast:a", ()), (2, CALL, b"known:b", ()), (3, CALL, b"fast:full", ())]
        native.queue(*batch, (4, CALL, b"fast:c", ()))
        await settle()
        assert fast[0].taken == [1, 4]
        assert servicer.log == ["held", b"known:b", "wake"]  # NOTE: one wake for all
        native.queue((4, GONE, None, None))
        await settle()
        assert fast[0].cancelled == [4]
        fast[0].reply(1, 0, "", b"fast answer")
        await settle()
        handoff.stop()

    asyncio.run(go())
    assert native.answers == [
        ("reply", 3, grpc.StatusCode.UNAVAILABLE.value[0], "the arena is full", b""),
        ("reply", 1, 0, "", b"fast answer"),
    ]
    assert native.sent[-1] == ("kick",)
