"""The direct handoff of a known call on the gRPC thread (``frontend/native/direct_handoff.h``)
against its Python twin (``frontend.dispatch.direct.DirectRoutes.hand``), without a server:
the process's ``KnownSubmit`` over an arena and a ring to the scheduler of its own
(``test_known_submit.Rig``), and real instance routes (a lease semaphore, a shared-memory
ring into the worker's inbox, its wake-up semaphore) opened in both by ``DirectRoutes.mirror``.
Each case runs the C++ submit and then Python's hand of the same REQUEST record on the same
routes, and checks that the two agree: whether a lease is taken and whose, the DirectSent
left for the scheduler and the BatchAssign pushed to the worker byte for byte, the wake-ups
posted, and where a call that is not handed goes (the scheduler's ring, with its lease
untouched)."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import Any

import msgspec
import posix_ipc
import pytest

from tests.unit.test_known_submit import Rig, message, native
from triton_mp.frontend.dispatch.direct import DirectRoutes
from triton_mp.frontend.native import input_arena_type
from triton_mp.frontend.native.shared_ring import attach_shared
from triton_mp.ipc import Ring
from triton_mp.ipc.direct import DirectRoute, Lease, create_lease
from triton_mp.ipc.memory.notify import create_wakeup
from triton_mp.ipc.memory.shm import unlink_quietly
from triton_mp.ipc.protocol.messages import BatchAssign, DirectSent, direct_batch_id
from triton_mp.ipc.recordio.codec import Decoder, encode
from triton_mp.ipc.recordio.records import decode_request

pytestmark = pytest.mark.skipif(input_arena_type() is None, reason="native extension not built")

_names = itertools.count()
_sent = Decoder(DirectSent)
_assign = Decoder(BatchAssign)


class Instance:
    """One instance's route objects: its lease, its inbox ring from frontend 0, its wake-up."""

    def __init__(self, instance_id: int, ring_bytes: int = 1 << 12) -> None:
        base = f"/triton_mp_test_ndirect_{os.getpid()}_{next(_names)}"
        self.ring_name = base + "_r"
        self.wakeup = create_wakeup("semaphore", base + "_w")
        self.lease_name = create_lease(base + "_l")
        self.ring = Ring.create(self.ring_name, ring_bytes)
        self.route = DirectRoute(
            instance_id=instance_id,
            model="m",
            version=1,
            frontend_id=0,
            ring=self.ring_name,
            wakeup=self.wakeup,
            lease=self.lease_name,
        )
        self.lease = Lease(self.lease_name)
        self.wake = posix_ipc.Semaphore(self.wakeup.name)

    def woken(self) -> int:
        """The wake-up posts pending, consumed."""
        n = 0
        with contextlib.suppress(posix_ipc.BusyError):
            while True:
                self.wake.acquire(0)
                n += 1
        return n

    def close(self) -> None:
        self.lease.close()
        self.wake.close()
        self.ring.close()
        unlink_quietly(self.ring_name)
        for name in (self.wakeup.name, self.lease_name):
            with contextlib.suppress(posix_ipc.Error):
                posix_ipc.unlink_semaphore(name)


class Twins:
    """The C++ submit and Python's ``DirectRoutes`` over the same instances; Python's notes
    to the scheduler collected, its clock set to the C++ batch's dispatch time."""

    def __init__(self, rig: Rig, instances: list[Instance]) -> None:
        self.rig = rig
        self.notes: list[bytes] = []
        self.now = 0
        self.routes = DirectRoutes(
            0,
            lambda b: self.notes.append(b) is None,
            self.notes.append,
            lambda: self.now,
            attach=attach_shared(native().RingProducer),
        )
        self.routes.update([i.route for i in instances])
        self.routes.mirror(native())
        self.sizes = [8, 3]
        rig.teach(self.sizes)
        key = native().split_infer(message([b"\0" * n for n in self.sizes]))[1]
        assert native().known_teach_route(key, b"c", "m", 1)

    def submit(self) -> Any:
        """The gRPC thread's submit of the taught call."""
        return native().known_submit(message([b"a" * 8, b"b" * 3]), 5)

    def hand(self, record: bytes) -> bool:
        """Python's hand of ``record`` (its request id's)."""
        rid = decode_request(record).request_id
        return self.routes.hand("m", 1, rid, record)

    def close(self) -> None:
        self.routes.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def instances() -> Iterator[list[Instance]]:
    made = [Instance(4), Instance(5)]
    try:
        yield made
    finally:
        native().direct_route_clear()
        for i in made:
            i.close()


def test_an_offered_lease_is_taken_and_both_hand_the_same_bytes(
    rig: Rig, instances: list[Instance]
) -> None:
    a, b = instances
    twins = Twins(rig, instances)
    b.lease.offer()  # NOTE: the first route's lease is not up: the second one is taken
    before = native().direct_stats()
    sent = twins.submit()
    assert isinstance(sent, tuple)
    assert sent[1] == 7
    (note,) = rig.ring_seg.records()  # NOTE: the DirectSent, and no REQUEST record
    msg = _sent.decode(note)
    assert isinstance(msg.request, bytes)
    record = msg.request
    req = decode_request(record)
    assert (msg.instance_id, req.request_id) == (5, sent[0])
    assert msg.batch_id == direct_batch_id(0, sent[0])
    (assign_bytes,) = b.ring.pop_all()
    assert a.ring.pop_all() == []
    assign = _assign.decode(assign_bytes)
    assert assign.requests == (record,)
    assert assign.dispatch_ns == msg.dispatch_ns >= 5
    assert not b.lease.offered()
    assert (a.woken(), b.woken()) == (0, 1)
    assert native().direct_stats()["handed"] == before["handed"] + 1
    # Python, on the same routes and record, at the same time: the same bytes
    twins.now = msg.dispatch_ns
    b.lease.offer()
    assert twins.hand(record)
    assert twins.notes == [note] == [encode(msg)]
    assert b.ring.pop_all() == [assign_bytes]
    assert not b.lease.offered()
    assert (a.woken(), b.woken()) == (0, 1)
    twins.close()


def test_no_lease_up_sends_the_record_to_the_scheduler(rig: Rig, instances: list[Instance]) -> None:
    a, b = instances
    twins = Twins(rig, instances)
    before = native().direct_stats()
    sent = twins.submit()
    assert isinstance(sent, tuple)
    (record,) = rig.ring_seg.records()
    assert decode_request(record).request_id == sent[0]  # a REQUEST record, as without routes
    assert not twins.hand(record)
    assert twins.notes == []
    assert a.ring.pop_all() == b.ring.pop_all() == []
    assert (a.woken(), b.woken()) == (0, 0)
    stats = native().direct_stats()
    assert stats["handed"] == before["handed"]
    assert stats["routes"] == 2
    assert stats["not_offered"] == before["not_offered"] + 1
    twins.close()


def test_a_batch_too_large_for_the_route_leaves_the_lease(rig: Rig) -> None:
    """The first offered route is the one tried: a batch that could never fit its ring
    takes nothing, and the call goes to the scheduler (the other instance's lease, up too,
    is not tried)."""
    small, other = Instance(4, ring_bytes=256), Instance(5)
    try:
        twins = Twins(rig, [small, other])
        small.lease.offer()
        other.lease.offer()
        sent = twins.submit()
        assert isinstance(sent, tuple)
        (record,) = rig.ring_seg.records()
        assert decode_request(record).request_id == sent[0]
        assert small.lease.offered()
        assert other.lease.offered()
        assert not twins.hand(record)
        assert small.lease.offered()
        assert other.lease.offered()
        assert small.ring.pop_all() == other.ring.pop_all() == twins.notes == []
        twins.close()
    finally:
        native().direct_route_clear()
        small.close()
        other.close()


def test_a_closed_route_and_another_version_are_not_handed(
    rig: Rig, instances: list[Instance]
) -> None:
    a, b = instances
    twins = Twins(rig, instances)
    twins.routes.update([], remove=[4, 5])
    a.lease.offer()
    sent = twins.submit()
    assert isinstance(sent, tuple)
    (record,) = rig.ring_seg.records()
    assert not twins.hand(record)
    assert a.lease.offered()
    assert a.ring.pop_all() == []
    assert native().direct_stats()["routes"] == 0
    # NOTE: routes of another version never serve this lesson's calls
    twins.routes.update([msgspec.structs.replace(b.route, version=2)])
    b.lease.offer()
    assert twins.submit()[0] == sent[0] + 1
    assert len(rig.ring_seg.records()) == 2
    assert b.lease.offered()
    twins.close()


def test_an_untaught_route_leaves_every_call_to_the_scheduler(
    rig: Rig, instances: list[Instance]
) -> None:
    """A lesson without ``known_teach_route`` (a build or a version without routes) pushes
    its record as before, even while an instance is offered."""
    a, _ = instances
    attach = attach_shared(native().RingProducer)
    routes = DirectRoutes(0, lambda b: True, lambda b: None, attach=attach)
    routes.update([a.route])
    routes.mirror(native())
    rig.teach([8, 3])
    a.lease.offer()
    sent = native().known_submit(message([b"a" * 8, b"b" * 3]), 5)
    assert isinstance(sent, tuple)
    assert len(rig.ring_seg.records()) == 1
    assert a.lease.offered()
    routes.close()


def test_a_lease_taken_then_a_full_ring_to_the_scheduler_loses_the_call(
    rig: Rig, instances: list[Instance]
) -> None:
    """C++ takes the offered lease, then the ring to the scheduler stays full past the full
    timeout: the call is lost (KnownResult kLost, 7: Python fails it UNAVAILABLE, as its own
    hand raises ChannelTimeout then), not handed back as a new call (kFull, 5), which would
    wait for the same ring again; the worker gets nothing and the lease stays taken (the
    scheduler frees the instance after its claim timeout)."""
    _, b = instances
    twins = Twins(rig, instances)
    filler = b"x" * 1000
    while rig.producer.push(filler) == 0:
        pass  # NOTE: the ring to the scheduler is full now; nothing drains it
    before = native().direct_stats()
    b.lease.offer()
    native().direct_full_timeout(0.02)
    try:
        result = twins.submit()
    finally:
        native().direct_full_timeout(10.0)
    assert result == 7
    assert not b.lease.offered()
    assert b.ring.pop_all() == []
    assert b.woken() == 0
    assert all(r == filler for r in rig.ring_seg.records())
    stats = native().direct_stats()
    assert (stats["lost"], stats["handed"]) == (before["lost"] + 1, before["handed"])
    twins.close()


class _Port:
    """``NativePort.owned``: the known calls the gRPC thread keeps."""

    def __init__(self, owned: int) -> None:
        self.kept = owned

    def owned(self) -> int:
        return self.kept


def test_the_loop_awaits_the_answers_of_the_calls_cpp_keeps() -> None:
    """A call the gRPC thread handed to an instance is kept in C++ (its answer served there),
    not in the pending table; the frontend loop still awaits its answer (its early-wake and
    answer-due polls, ``polling_loop``), or it would block just before the answer comes."""
    from triton_mp.frontend.dispatch.pending import PendingTable
    from triton_mp.frontend.main import _outstanding
    from triton_mp.ipc import SegmentCache

    pending = PendingTable(SegmentCache(), 1)
    port = _Port(2)
    outstanding = _outstanding(pending, port)  # type: ignore[arg-type]
    assert outstanding() == 2
    port.kept = 0
    assert outstanding() == 0
    assert _outstanding(pending, None)() == 0
    assert native().owned() == 0  # NOTE: no server in this process
