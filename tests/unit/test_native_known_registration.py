"""Known calls the native side submits itself (``KNOWN`` entries of the handoff), without
processes: the real ``Handoff``, ``KnownCalls`` and ``PendingTable`` over a fake extension
that queues entries as ``handoff.cc`` does. What is checked: the ids Python hands the native
side (``PendingTable.reserve``) are never given again, a KNOWN entry is registered before
anything else of its pass (so a cancel that follows it finds it), and an answer read before
its call was taken is not freed as an orphan (``PendingTable.on_unknown`` pulls the queue)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import grpc
import msgspec
import pytest

from triton_mp.common.errors import ErrorCode
from triton_mp.common.process.log import apply_log_settings, current_log_settings
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.grpc.messages import ResponseHeads
from triton_mp.frontend.native.handoff import ACCEPTED, CALL, GONE, KNOWN, Handoff
from triton_mp.frontend.native.known_calls import KnownCalls, Lesson
from triton_mp.ipc.protocol.messages import ErrorInfo, InferResponse, RequestFailed
from triton_mp.ipc.tensor_pool import SegmentGone


class GoneCache:
    """No arena is attached: every free is a no-op (``PendingTable._free_one``); ``asked``
    records the segments frees went to."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def get(self, name: str) -> Any:
        self.asked.append(name)
        raise SegmentGone(name)


class FakeNative:
    """``_native``'s handoff functions: ``queue`` entries (id, kind, data, metadata) as the
    completion-queue thread does (the eventfd written on an empty queue only)."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK)
        self.items: list[tuple[int, int, Any, Any, Any]] = []
        self.replies: list[tuple[int, int, str, bytes]] = []
        self.logging: list[bool] = []
        """Each ``known_log`` call's flag, in order."""

    def queue(self, *items: tuple[int, int, Any, Any]) -> None:
        if not self.items:
            os.eventfd_write(self.fd, 1)
        self.items.extend((*item, None) for item in items)

    def handoff_fd(self) -> int:
        return self.fd

    def known_log(self, on: bool) -> bool:
        self.logging.append(on)
        return True

    def take(self) -> list[tuple[int, int, Any, Any, Any]]:
        out, self.items = self.items, []
        return out

    def reply(self, call_id: int, code: int, details: str, data: Any) -> bool:
        joined = data if isinstance(data, bytes) else b"".join(data)
        self.replies.append((call_id, code, details, joined))
        return True

    def write(self, call_id: int, data: bytes) -> bool:
        raise AssertionError("no stream here")

    def kick(self) -> None:
        pass


class FakeInference:
    def __init__(self, pending: PendingTable, cache: GoneCache) -> None:
        self.pending = pending
        self.cache = cache
        self.known_keys: set[bytes] = set()
        self.cancelled: list[tuple[int, str, int]] = []

    def cancel(self, rid: int, model: str, version: int) -> None:
        self.cancelled.append((rid, model, version))


class FakeServicer:
    """Serves a plain unary call in its handler (``handled``)."""

    def __init__(self) -> None:
        self.handled: list[bytes] = []

    def parse_split(self, data: bytes, split: Any) -> Any:
        return data

    def submit_known(self, request: Any, in_task: bool = True) -> None:
        return None

    def wakes_held(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    async def ModelInfer(self, request: Any, context: Any) -> bytes:  # noqa: N802
        self.handled.append(request)
        return b"handled"


class Gate:
    def known_allowed(self) -> bool:
        return True


class Rig:
    """A started handoff with real known calls over a real pending table."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.cache = GoneCache()
        self.pending = PendingTable(self.cache)  # type: ignore[arg-type]
        self.inference = FakeInference(self.pending, self.cache)
        self.native = FakeNative()
        self.servicer = FakeServicer()
        made: list[KnownCalls] = []

        def known_calls(reply: Any) -> KnownCalls:
            made.append(KnownCalls(self.inference, ResponseHeads(), Gate(), reply))  # type: ignore[arg-type]
            return made[0]

        self.handoff = Handoff(self.native, self.servicer, known_calls)  # type: ignore[arg-type]
        self.known = made[0]
        self.handoff.start(loop)
        self.lesson = self.known.learn(Lesson("m", 3, "r1", "/arena", 16))

    def sent(self, call_id: int, rid: int, offset: int = 128) -> tuple[int, int, Any, Any]:
        """A KNOWN entry: the native side sent request ``rid`` for ``call_id``."""
        return (call_id, KNOWN, (rid, self.lesson, offset, 7), None)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def failed(rid: int) -> RequestFailed:
    return RequestFailed(request_id=rid, error=ErrorInfo(ErrorCode.UNAVAILABLE, "no instance"))


UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


def test_reserved_ids_are_never_given_again() -> None:
    pending = PendingTable(GoneCache(), first_id=5)  # type: ignore[arg-type]
    assert pending.new_id() == 5
    first = pending.reserve(100)
    assert first == 6
    later = [pending.new_id() for _ in range(10)]
    assert later == list(range(first + 100, first + 110))
    assert pending.reserve(1) == first + 110


def test_a_known_entry_is_registered_first_and_answered_through_its_call() -> None:
    async def go() -> Rig:
        rig = Rig(asyncio.get_running_loop())
        rid = rig.pending.reserve(4)
        # NOTE: a plain call before it in the same take: KNOWN is still registered first.
        rig.native.queue((1, CALL, b"plain", ()), rig.sent(2, rid))
        await settle()
        assert len(rig.pending) == 1
        assert rig.pending.copied_bytes["in"] == 16
        rig.pending.deliver([failed(rid)])
        await settle()
        rig.handoff.stop()
        return rig

    rig = asyncio.run(go())
    assert rig.servicer.handled == [b"plain"]
    assert (2, UNAVAILABLE, "no instance", b"") in rig.native.replies
    assert len(rig.pending) == 0
    assert rig.cache.asked == ["/arena"]  # NOTE: its input block freed after its answer


def test_a_cancel_taken_with_its_known_entry_cancels_it() -> None:
    async def go() -> tuple[Rig, int]:
        rig = Rig(asyncio.get_running_loop())
        rid = rig.pending.reserve(1)
        rig.native.queue(rig.sent(9, rid), (9, GONE, None, None))
        await settle()
        late = InferResponse(request_id=rid, version=3)
        rig.pending.deliver([late])  # NOTE: the scheduler ran it anyway: freed, no reply
        rig.handoff.stop()
        return rig, rid

    rig, rid = asyncio.run(go())
    assert rig.inference.cancelled == [(rid, "m", 3)]
    assert rig.native.replies == []
    assert 9 not in rig.known.calls


def test_an_answer_read_before_its_call_was_taken_reaches_the_call() -> None:
    """The inbox is read before the handoff's eventfd in the same pass: the answer's miss
    pulls the handoff queue (registering the call), and the entries behind it wait for the
    handoff's own wake-up, in order."""

    async def go() -> Rig:
        rig = Rig(asyncio.get_running_loop())
        rid = rig.pending.reserve(2)
        rig.native.queue(rig.sent(3, rid), (4, CALL, b"after", ()), rig.sent(5, rid + 1))
        rig.pending.deliver([failed(rid), failed(rid + 1)])  # NOTE: before the loop runs
        assert [r[0] for r in rig.native.replies] == [3, 5]
        assert rig.servicer.handled == []
        await settle()  # NOTE: the eventfd is still readable: the CALL is served
        rig.handoff.stop()
        return rig

    rig = asyncio.run(go())
    assert rig.servicer.handled == [b"after"]
    assert len(rig.pending) == 0
    assert rig.cache.asked == ["/arena", "/arena"]


def test_an_answer_nobody_submitted_is_still_an_orphan() -> None:
    async def go() -> Rig:
        rig = Rig(asyncio.get_running_loop())
        orphan = InferResponse(request_id=777, version=3)
        rig.pending.deliver([orphan])
        rig.handoff.stop()
        return rig

    rig = asyncio.run(go())
    assert rig.native.replies == []
    assert rig.pending.on_unknown is None  # NOTE: stop unhooks it


def test_a_pass_that_registered_known_calls_says_so_once() -> None:
    """``KnownCalls.on_registered`` (the teacher's id refill) runs once per ``register``
    that registered some, never for a pass of other entries only."""

    async def go() -> tuple[Rig, list[int]]:
        rig = Rig(asyncio.get_running_loop())
        told: list[int] = []
        rig.known.on_registered = lambda: told.append(len(rig.pending))
        rid = rig.pending.reserve(3)
        rig.native.queue(rig.sent(1, rid), rig.sent(2, rid + 1))
        await settle()
        rig.native.queue((3, CALL, b"plain", ()))
        await settle()
        rig.handoff.stop()
        return rig, told

    rig, told = asyncio.run(go())
    assert told == [2]
    assert rig.servicer.handled == [b"plain"]


class Registry:
    """``SystemShmRegistry``'s ``hold`` / ``release``: the uses of each region id."""

    def __init__(self) -> None:
        self.uses: dict[int, int] = {}

    def hold(self, ids: Any) -> None:
        for i in ids:
            self.uses[i] = self.uses.get(i, 0) + 1

    def release(self, ids: Any) -> None:
        for i in ids:
            self.uses[i] -= 1


def test_a_known_call_naming_regions_moves_its_holds_to_the_registry_until_answered() -> None:
    """A lesson whose calls name client regions: registering a call the native side sent
    holds them in the registry, then ends the native side's holds (``release_held``), in
    the same pass; the registry's holds end with the call's answer."""
    released: list[tuple[int, ...]] = []

    async def go() -> tuple[Rig, Registry, list[dict[int, int]]]:
        rig = Rig(asyncio.get_running_loop())
        shm = Registry()
        rig.inference.shm = shm  # type: ignore[attr-defined]
        rig.known.release_held = released.append
        rig.lesson = rig.known.learn(Lesson("m", 3, "r1", "/arena", 0, (11, 12)))
        rid = rig.pending.reserve(4)
        seen = []
        rig.native.queue(rig.sent(2, rid))
        await settle()
        seen.append(dict(shm.uses))
        rig.pending.deliver([failed(rid)])
        await settle()
        seen.append(dict(shm.uses))
        rig.handoff.stop()
        return rig, shm, seen

    rig, shm, seen = asyncio.run(go())
    assert seen == [{11: 1, 12: 1}, {11: 0, 12: 0}]
    assert released == [(11, 12)]
    assert (2, UNAVAILABLE, "no instance", b"") in rig.native.replies


def test_accepted_entries_word_the_per_request_debug_line_while_debug_is_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """--log-verbose 1 on the native path: the native side queues an ACCEPTED entry for each
    call it submitted while its flag is on; the flag follows DEBUG (set at start and at each
    change of the log settings, off again after the handoff stops), and Python words the line
    ``Inference`` writes for the calls it accepts itself, from the call's lesson."""
    quiet, root_level = current_log_settings(), logging.getLogger().level
    rigs: list[Rig] = []

    async def go() -> None:
        rig = Rig(asyncio.get_running_loop())
        rigs.append(rig)
        lesson = rig.known.learn(Lesson("m", 3, "r1", "/arena", 16, (), 4))
        apply_log_settings(msgspec.structs.replace(quiet, verbose=1))
        rid = rig.pending.reserve(2)
        rig.native.queue((9, ACCEPTED, (rid, lesson, 128, 7), None))
        await settle()
        assert len(rig.pending) == 0, "an ACCEPTED entry registers nothing"
        rig.handoff.stop()
        apply_log_settings(msgspec.structs.replace(quiet, verbose=0))

    try:
        asyncio.run(go())
    finally:
        apply_log_settings(quiet)
        logging.getLogger().setLevel(root_level)
    (rig,) = rigs
    assert rig.native.logging == [False, True], "off at start, on with DEBUG, then unwatched"
    lines = [r.getMessage() for r in caplog.records if "accepted for" in r.getMessage()]
    rid = lines and int(lines[0].split()[1])
    assert lines == [f"request {rid} accepted for 'm' version 3 (batch size 4)"]
