"""``_native.known_*`` (``frontend/native/known_submit.h``): the gRPC thread's submit of a
known call, without a server. Over an arena and a ring in plain memory (``InputArena`` and
``RingProducer`` over bytearrays), a taught call leaves the record the Python lane writes
(``known_records.patch_in_python`` of the same template) and the raw bytes where
``known_requests.write_known`` puts them; anything that does not match its lesson is left
to Python with nothing done; a full ring frees the block; the wake follows HeldWakes' rule;
any message, however broken, is left to Python or sent, never read out of bounds."""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.dispatch.known_records import patch_in_python
from triton_mp.frontend.native import input_arena_type
from triton_mp.ipc.memory.notify import create_wakeup
from triton_mp.ipc.memory.ring import DATA_OFFSET, QUIET_OFFSET, RING_MAGIC
from triton_mp.ipc.memory.shm import unlink_quietly
from triton_mp.ipc.protocol.messages import BlockRef, InferRequest, ReplyTo, Requester, TensorRef
from triton_mp.ipc.recordio.request_records import encode_request
from triton_mp.ipc.tensor_pool import ARENA_HEADER_BYTES, BLOCK_HEADER_BYTES, align

pytestmark = pytest.mark.skipif(input_arena_type() is None, reason="native extension not built")

SENT, UNKNOWN, DECLINED, NO_IDS, NO_ROOM, FULL = range(6)
"""``known_submit.h`` KnownResult."""
_names = itertools.count()


def native() -> Any:
    from triton_mp.frontend.native import _native  # type: ignore[attr-defined]

    return _native


class ArenaSegment:
    def __init__(self, capacity: int) -> None:
        self.name = "/arena"
        self.size_bytes = ARENA_HEADER_BYTES + capacity
        self.buf = bytearray(self.size_bytes)


class RingSegment:
    def __init__(self, capacity: int) -> None:
        self.name = "/ring"
        self.buf = bytearray(DATA_OFFSET + capacity)
        struct.pack_into("<IIQ", self.buf, 0, RING_MAGIC, 1, capacity)

    def records(self) -> list[bytes]:
        """Every record pushed (none wraps in these tests)."""
        tail = struct.unpack_from("<Q", self.buf, 64)[0]
        out, at = [], 0
        while at < tail:
            (n,) = struct.unpack_from("<I", self.buf, DATA_OFFSET + at)
            out.append(bytes(self.buf[DATA_OFFSET + at + 4 : DATA_OFFSET + at + 4 + n]))
            at += (4 + n + 7) & ~7
        return out


class Rig:
    """The process's KnownSubmit over an arena and a ring of its own; ``teach`` teaches the
    key of ``message(...)`` with ``sizes``."""

    def __init__(self, arena_bytes: int = 64 * 64, ring_bytes: int = 1 << 16) -> None:
        n = native()
        self.arena_seg = ArenaSegment(arena_bytes)
        self.arena = n.InputArena(self.arena_seg)
        self.ring_seg = RingSegment(ring_bytes)
        self.producer = n.RingProducer(self.ring_seg)
        n.known_detach()
        n.known_set_ring(self.producer, None)
        n.known_set_arena(self.arena)
        n.known_add_ids(100, 1000)
        self.templates: dict[bytes, bytes] = {}

    def close(self) -> None:
        native().known_detach()
        self.producer.release()

    def teach(self, sizes: list[int], client_id: str = "c", bit: int = 0, lesson: int = 7) -> bytes:
        """Teach ``message(sizes, client_id)``'s key; returns the template taught."""
        key = native().split_infer(message([b"\0" * n for n in sizes], client_id))[1]
        template = encode_request(descriptor(sizes, client_id, 1, 5, 0, 1))
        assert template is not None
        at = list(itertools.accumulate((align(n) for n in sizes), initial=0))[:-1]
        block_bytes = BLOCK_HEADER_BYTES + align(max(sum(align(n) for n in sizes), 1))
        ok = native().known_teach(
            key, client_id.encode(), lesson, sizes, at, block_bytes, template, bit
        )
        assert ok
        return template


def descriptor(
    sizes: list[int], client_id: str, rid: int, arrival: int, offset: int, generation: int
) -> InferRequest:
    """The descriptor Python sends for ``message(sizes, client_id)`` in a block at ``offset``."""
    pos = offset + BLOCK_HEADER_BYTES
    refs = []
    for i, n in enumerate(sizes):
        refs.append(TensorRef(f"IN{i}", "UINT8", (n,), "/arena", pos, n))
        pos += align(n)
    return InferRequest(
        request_id=rid,
        reply_to=ReplyTo(Requester.FRONTEND, 0),
        model="m",
        version=1,
        batch_size=1,
        inputs=tuple(refs),
        outputs=(),
        block=BlockRef("/arena", offset, generation),
        arrival_ns=arrival,
        client_id=client_id,
    )


def message(raws: list[bytes], client_id: str = "c", shapes: list[int] | None = None) -> bytes:
    """A ModelInferRequest of UINT8 inputs (shape: each raw's length, or ``shapes``)."""
    req = pb.ModelInferRequest(model_name="m", id=client_id)
    for i, raw in enumerate(raws):
        n = len(raw) if shapes is None else shapes[i]
        req.inputs.add(name=f"IN{i}", datatype="UINT8", shape=[n])
    req.raw_input_contents.extend(raws)
    return bytes(req.SerializeToString())


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        r.close()


ids = st.one_of(
    st.just(""),
    st.text(max_size=6),
    st.text(min_size=100, max_size=300),
    st.sampled_from(["é", "请求-42", "\U0001f600" * 40]),
)
"""Request ids: empty, short, long, UTF-8 of 2-4 bytes a character."""


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=3),
    client_id=ids,
    call_ids=st.lists(ids, min_size=4, max_size=4),
    calls=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_a_sent_call_is_what_the_python_lane_writes(
    sizes: list[int], client_id: str, call_ids: list[str], calls: int, seed: int
) -> None:
    """Taught from a call with one id, the lesson sends calls with any id: each record is
    the one Python encodes for that call (its own id in it)."""
    r = Rig()
    try:
        r.teach(sizes, client_id)
        rng = np.random.default_rng(seed)
        for k in range(calls):
            cid = call_ids[k]
            raws = [rng.integers(0, 256, n, np.uint8).tobytes() for n in sizes]
            sent = native().known_submit(message(raws, cid), 1000 + k)
            assert isinstance(sent, tuple), sent
            rid, lesson, offset, generation = sent
            assert (rid, lesson) == (100 + k, 7)
            block = BlockRef("/arena", offset, generation)
            desc = descriptor(sizes, cid, rid, 1000 + k, offset, generation)
            template = encode_request(descriptor(sizes, cid, 1, 5, 0, 1))
            expected = patch_in_python(template, rid, 1000 + k, block, desc.inputs)
            assert r.ring_seg.records()[k] == expected == encode_request(desc)
            for ref, raw in zip(desc.inputs, raws, strict=True):
                assert r.arena_seg.buf[ref.offset : ref.offset + ref.nbytes] == raw
            state, gen, block_bytes = struct.unpack_from("<IIQ", r.arena_seg.buf, offset)
            assert (state, gen) == (1, generation)
            assert block_bytes == BLOCK_HEADER_BYTES + align(max(sum(map(align, sizes)), 1))
        assert native().known_stats()["sent"] >= calls
    finally:
        r.close()


def test_what_does_not_match_the_lesson_is_left_with_nothing_done(rig: Rig) -> None:
    rig.teach([8, 4], "c")
    n = native()
    stats = n.known_stats()
    short = message([b"a" * 8, b"b" * 3], "c", shapes=[8, 4])
    assert n.known_submit(short, 1) == DECLINED  # a byte size
    assert n.known_submit(message([b"a" * 8], "c"), 1) == UNKNOWN  # another key
    assert n.known_submit(b"\x0a\x05ab", 1) == UNKNOWN  # not a message
    # NOTE: an id that is not UTF-8 (protobuf refuses it in Python), or over 4 KiB
    bad = message([b"a" * 8, b"b" * 4], "c").replace(b"\x1a\x01c", b"\x1a\x02\xc3\x28")
    assert n.split_infer(bad)[1] == n.split_infer(message([b"a" * 8, b"b" * 4], "c"))[1]
    assert n.known_submit(bad, 1) == DECLINED
    assert n.known_submit(message([b"a" * 8, b"b" * 4], "x" * 4097), 1) == DECLINED
    assert rig.ring_seg.records() == []
    assert n.known_stats()["declined"] == stats["declined"] + 3
    # NOTE: another id is the same form: sent, with its own id (4 KiB is still sent)
    assert isinstance(n.known_submit(message([b"a" * 8, b"b" * 4], "d"), 1), tuple)
    assert isinstance(n.known_submit(message([b"a" * 8, b"b" * 4], "y" * 4096), 1), tuple)
    # NOTE: surplus raw entries are ignored (Triton does), as by KnownRequest.matches
    req = pb.ModelInferRequest.FromString(message([b"a" * 8, b"b" * 4], "c"))
    req.raw_input_contents.append(b"surplus")
    assert isinstance(n.known_submit(req.SerializeToString(), 1), tuple)
    n.known_clear()
    assert n.known_submit(message([b"a" * 8, b"b" * 4], "c"), 1) == UNKNOWN


def test_no_ids_no_room_and_a_full_ring_leave_the_call_to_python() -> None:
    n = native()
    r = Rig(arena_bytes=2 * 128, ring_bytes=2048)
    try:
        n.known_detach()
        n.known_set_ring(r.producer, None)
        n.known_set_arena(r.arena)
        r.teach([64])
        body = message([b"z" * 64])
        assert n.known_submit(body, 1) == NO_IDS
        n.known_add_ids(5, 1)
        assert n.known_submit(body, 1)[0] == 5
        assert n.known_ids_left() == 0
        n.known_add_ids(6, 10)
        records = len(r.ring_seg.records())
        while (got := n.known_submit(body, 1)) != FULL:
            assert got != NO_ROOM or records  # NOTE: 2 blocks of 128: room runs out first
            if got == NO_ROOM:
                # NOTE: the reader frees every block (as a worker does): room again
                for off in range(ARENA_HEADER_BYTES, r.arena_seg.size_bytes, 128):
                    struct.pack_into("<I", r.arena_seg.buf, off, 0)
            records = len(r.ring_seg.records())
        # NOTE: the full ring's block was freed at once: the arena has room for another
        states = [
            struct.unpack_from("<I", r.arena_seg.buf, off)[0]
            for off in range(ARENA_HEADER_BYTES, r.arena_seg.size_bytes, 128)
        ]
        assert 0 in states
        assert n.known_stats()["full"] >= 1
    finally:
        r.close()


def test_the_wake_is_posted_unless_the_lessons_bit_is_quiet_or_a_post_is_pending(
    rig: Rig,
) -> None:
    import posix_ipc

    n = native()
    name = f"/triton_mp_{os.getpid()}_test_ks{next(_names)}"
    create_wakeup("semaphore", name)
    sem = posix_ipc.Semaphore(name)
    try:
        n.known_set_ring(rig.producer, name)
        rig.teach([4], bit=0b100)
        body = message([b"abcd"])
        assert isinstance(n.known_submit(body, 1), tuple)
        assert sem.value == 1
        struct.pack_into("<Q", rig.ring_seg.buf, QUIET_OFFSET, 0b100)  # the model is busy
        assert isinstance(n.known_submit(body, 2), tuple)
        assert sem.value == 1
        struct.pack_into("<Q", rig.ring_seg.buf, QUIET_OFFSET, 0b011)  # others are
        assert isinstance(n.known_submit(body, 3), tuple)
        assert sem.value == 1  # NOTE: the post still pending announces this one too
        sem.acquire(0)  # NOTE: the scheduler takes it (then reads its rings)
        assert isinstance(n.known_submit(body, 4), tuple)
        assert sem.value == 1
        assert n.known_stats()["wakes"] == 2
    finally:
        n.known_set_ring(rig.producer, None)
        sem.close()
        unlink_quietly(name)


def test_a_call_joining_a_forming_batch_counts_in_the_allowance_python_shares(rig: Rig) -> None:
    """known_wake.h: a call whose bucket's batch forms goes without a post while the rows of
    this epoch stay within the allowance, counted with the Python thread's (SharedAllowance)."""
    import posix_ipc

    from tests.unit.test_known_wake import fresh_epoch
    from triton_mp.frontend.dispatch.wakes import SharedAllowance
    from triton_mp.ipc.memory.ring import FORMING_OFFSET
    from triton_mp.ipc.recordio.quiet_requests import allowance_word

    n = native()
    name = f"/triton_mp_{os.getpid()}_test_ks{next(_names)}"
    create_wakeup("semaphore", name)
    sem = posix_ipc.Semaphore(name)
    shared = SharedAllowance(n.known_wake_join)
    epoch = fresh_epoch()

    def forming(epoch: int, rows: int) -> tuple[int, int, int]:
        words = (0b100, allowance_word(epoch, rows), 5)  # NOTE: the floor: 5 ns
        struct.pack_into("<3Q", rig.ring_seg.buf, FORMING_OFFSET, *words)
        return words

    try:
        n.known_set_ring(rig.producer, name)
        rig.teach([4], bit=0b100)
        body = message([b"abcd"])
        # NOTE: no rows allowed: it wakes whether or not the process's one allowance saw an
        # epoch before (the first epoch it sees counts as spent; test_known_wake's tests,
        # when they run first in this process, show it older ones)
        forming(epoch, 0)
        assert isinstance(n.known_submit(body, 10), tuple)
        assert sem.value == 1
        sem.acquire(0)
        words = forming(epoch + 1, 2)
        assert isinstance(n.known_submit(body, 4), tuple)
        assert sem.value == 1  # NOTE: stamped before the floor: it wakes
        sem.acquire(0)
        assert isinstance(n.known_submit(body, 10), tuple)
        assert sem.value == 0  # NOTE: joined: 1 row of 2
        assert shared.join(0b100, 1, 10, words)  # NOTE: Python's push: 2 of 2
        assert isinstance(n.known_submit(body, 10), tuple)
        assert sem.value == 1  # NOTE: 3 rows > 2: it wakes
        assert n.known_stats()["sent"] >= 4
    finally:
        n.known_set_ring(rig.producer, None)
        sem.close()
        unlink_quietly(name)


def test_a_lesson_that_does_not_fit_is_refused(rig: Rig) -> None:
    n = native()
    key = n.split_infer(message([b"\0" * 8]))[1]
    template = rig.teach([8])
    # NOTE: an input past the block, a block over the arena, sizes without positions
    assert not n.known_teach(key, b"c", 1, [8], [64], 128, template, 0)
    assert not n.known_teach(key, b"c", 1, [8], [0], 1 << 20, template, 0)
    assert not n.known_teach(key, b"c", 1, [8, 8], [0], 128, template, 0)
    assert not n.known_teach(key, b"c", 0, [8], [0], 128, template, 0)  # lesson id 0
    assert not n.known_teach(key, b"c", 1, [8], [0], 128, template[:40], 0)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_message_is_sent_or_left_never_misread(data: st.DataObject) -> None:
    """Broken and altered forms of a taught request (truncated, bytes flipped, random):
    the submit never reads out of bounds (ASan builds check), and sends only a message
    whose key and sizes are the lesson's and whose id protobuf accepts, with that id in
    its record."""
    r = Rig()
    try:
        r.teach([16, 4], "c")
        good = message([b"q" * 16, b"w" * 4], "c")
        choice = data.draw(st.sampled_from(["cut", "flip", "random"]))
        if choice == "cut":
            body = good[: data.draw(st.integers(0, len(good)))]
        elif choice == "flip":
            at = data.draw(st.integers(0, len(good) - 1))
            body = good[:at] + bytes([data.draw(st.integers(0, 255))]) + good[at + 1 :]
        else:
            body = data.draw(st.binary(max_size=80))
        got = native().known_submit(body, 1)
        if isinstance(got, tuple):
            req = pb.ModelInferRequest.FromString(body)  # NOTE: its id is UTF-8
            assert [len(x) for x in req.raw_input_contents][:2] == [16, 4]
            record = r.ring_seg.records()[0]
            (cid_len,) = struct.unpack_from("<H", record, 78)
            (cid_off,) = struct.unpack_from("<I", record, 84)
            assert record[cid_off : cid_off + cid_len].decode() == req.id  # NOTE: its own id
        else:
            assert got in (UNKNOWN, DECLINED)
    finally:
        r.close()
