"""``_answer_writer.answer_plain`` with outputs a request asked into a client's registered
region (Triton's output ``shared_memory_region``), against its Python twins:
``answering._one_frontend`` + ``write_answer_batch``'s Python loop (``_place``,
``output_parts``, ``write_region``) + ``Ring.push``.

On random batches of one to four requests (single ones included: the C path answers those
too now), each output either to the arena or to a region of one of two client objects
(its room sometimes too small, its window sometimes past the object's end, a key that no
object has, a region list shorter than the outputs, overlapping windows, a BYTES or strided
output), the C call:

- answers exactly the batches the twins answer as one frontend's ``AnswerBatch`` without a
  failed member: the same ring bytes, the same block payload, the same bytes in both client
  objects;
- declines every other batch before allocating a block or writing a byte anywhere.

No processes: the client objects, ring and arena are this test process's
(``/triton_mp_<pid>_test_apr*``), unlinked at the end of each example.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import posix_ipc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from triton_mp.backends.base import Outputs, response_parameters
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    InferRequest,
    OutputRegion,
    ReplyTo,
    Requester,
)
from triton_mp.ipc.recordio import codec
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, ArenaAllocator, free_block
from triton_mp.workers.answering import Answers, _one_frontend
from triton_mp.workers.tensors.answer_batch import alloc_block, write_answer_batch
from triton_mp.workers.tensors.tensor_io import WIRE_OF, ClientRegions
from triton_mp.workers.traces import Traces

from .test_answer_plain import FakeSender, _drop, _py_push
from .test_answer_writer import ORIGIN, Recording, _plain

native = pytest.importorskip("triton_mp.workers._answer_writer")

PID = os.getpid()
_names = itertools.count()
SLOW = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]
TO = ReplyTo(Requester.FRONTEND, 5)
OBJECT_BYTES = 4096


class Clients:
    """Two client objects of ``OBJECT_BYTES`` each, zeroed, mapped here for reading."""

    def __init__(self) -> None:
        n = next(_names)
        self.keys = [f"/triton_mp_{PID}_test_apr_c{n}_{i}" for i in range(2)]
        self.maps: list[mmap.mmap] = []
        for key in self.keys:
            obj = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=OBJECT_BYTES)
            self.maps.append(mmap.mmap(obj.fd, OBJECT_BYTES))
            obj.close_fd()

    def snapshot(self) -> list[bytes]:
        return [bytes(m) for m in self.maps]

    def zero(self) -> None:
        for m in self.maps:
            m[:] = bytes(OBJECT_BYTES)

    def close(self) -> None:
        for m, key in zip(self.maps, self.keys, strict=True):
            m.close()
            posix_ipc.unlink_shared_memory(key)


@pytest.fixture
def arena() -> Iterator[ArenaAllocator]:
    alloc = ArenaAllocator(f"/triton_mp_{PID}_test_apr_a{next(_names)}", 1 << 20, 1 << 24)
    yield alloc
    alloc.close_and_unlink()


NAMES = ["OUTPUT0", "OUTPUT1", "o" * 40]


@st.composite
def outputs(draw: st.DrawFn) -> np.ndarray:
    """A small output: mostly a C-contiguous fixed-size array, sometimes strided or BYTES."""
    n = draw(st.sampled_from([0, 1, 3, 16, 200]))
    kind = draw(st.sampled_from(["fixed"] * 20 + ["strided", "bytes"]))
    if kind == "bytes":
        return np.array([b"ab"] * n, dtype=np.object_)
    dtype = draw(st.sampled_from([np.float32, np.int64, np.uint8, np.float16]))
    arr = (np.arange(2 * n) % 251 + 1).astype(dtype)
    return arr[::2] if kind == "strided" else arr[:n]


@st.composite
def regions_for(draw: st.DrawFn, wanted: tuple[str, ...], keys: list[str]) -> tuple[Any, ...]:
    """One region (or None: the arena) per wanted name; the room, the offset and the key
    sometimes wrong (too small, past the object's end, no such object)."""
    out: list[OutputRegion | None] = []
    for _ in wanted:
        if draw(st.integers(0, 3)) == 0:
            out.append(None)
            continue
        bad = draw(st.integers(0, 9)) == 0
        key = draw(st.sampled_from([*keys, f"/triton_mp_{PID}_test_apr_none"] if bad else keys))
        offsets = [0, 64, 100, 1024, 2048]
        offset = draw(
            st.sampled_from([*offsets, OBJECT_BYTES - 8, OBJECT_BYTES] if bad else offsets)
        )
        room = draw(st.sampled_from([0, 7, 600, 1600] if bad else [1600, 1 << 20]))
        out.append(OutputRegion(key, keys.index(key) + 1 if key in keys else 9, offset, room, "r"))
    return tuple(out)


@st.composite
def batches(draw: st.DrawFn, keys: list[str]) -> tuple[tuple[InferRequest, ...], list[Any]]:
    """One to four requests of one frontend, some outputs asked into client regions."""
    reqs: list[InferRequest] = []
    results: list[Any] = []
    for rid in range(draw(st.sampled_from([1, 1, 2, 3, 4]))):
        produced = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3))
        res: dict[str, np.ndarray] = {name: draw(outputs()) for name in produced}
        wanted = tuple(n for n in produced if draw(st.booleans())) + tuple(
            draw(st.lists(st.sampled_from(NAMES), max_size=1, unique=True))
        )
        wanted = tuple(dict.fromkeys(wanted))
        regions: tuple[Any, ...] = ()
        if wanted and draw(st.integers(0, 4)) > 0:
            regions = draw(regions_for(wanted, keys))
            if draw(st.integers(0, 15)) == 0:
                regions = regions[:-1]  # NOTE: output_parts' ValueError
        if draw(st.integers(0, 7)) == 0:
            res = Outputs(res, '{"p": 2}')
        reqs.append(
            InferRequest(
                request_id=rid,
                reply_to=TO,
                model="m",
                version=1,
                batch_size=1,
                inputs=(),
                outputs=wanted,
                block=None,
                arrival_ns=0,
                output_regions=regions,
            )
        )
        results.append(res)
    return tuple(reqs), results


def _payload(rec: Recording) -> bytes:
    assert rec.last is not None
    seg, offset = rec.last
    start = offset + BLOCK_HEADER_BYTES
    return bytes(seg.buf[start : start + rec.payload])


@settings(max_examples=150, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_answer_plain_into_client_regions_writes_what_the_twins_write(
    arena: ArenaAllocator, data: st.DataObject
) -> None:
    clients = Clients()
    c_ring, py_ring = Ring.create(f"/triton_mp_{PID}_test_apr_r{next(_names)}", 1 << 16), None
    c_regions, py_regions = ClientRegions(), ClientRegions()
    try:
        py_ring = Ring.create(f"/triton_mp_{PID}_test_apr_r{next(_names)}", 1 << 16)
        reqs, results = data.draw(batches(clients.keys))
        group = list(zip(reqs, results, strict=True))
        rec = Recording(arena)
        got = native.answer_plain(
            reqs, results, Requester.FRONTEND, {TO.id: c_ring.segment.buf}, WIRE_OF,
            response_parameters, alloc_block, rec, c_regions.window,
        )  # fmt: skip
        c_objects = clients.snapshot()
        c_payload = _payload(rec) if got is not None and got[2] is not None else b""
        if got is not None and rec.last is not None:
            seg, offset = rec.last  # NOTE: the twin writes over the same block, zeroed
            start = offset + BLOCK_HEADER_BYTES
            seg.buf[start : start + rec.payload] = bytes(rec.payload)
            rec.replay = True
        clients.zero()
        msg, block, failed = write_answer_batch(rec, py_regions, group, ORIGIN)  # type: ignore[arg-type]
        taken = _one_frontend(reqs, results) is not None and _plain(group) and failed == []
        if got is None:
            event("declined")
            assert not taken
            assert rec.allocs <= int(block is not None)  # NOTE: the twin's own block only
            assert c_ring.pending_bytes() == 0
            assert all(b == bytes(OBJECT_BYTES) for b in c_objects)  # NOTE: nothing written
            if block is not None:
                free_block(rec.last[0], block)  # type: ignore[index]
            return
        event("regions" if any(r.output_regions for r in reqs) else "arena only")
        assert taken
        frontend_id, pushed_back, c_block = got
        assert frontend_id == TO.id
        assert pushed_back is None
        assert c_block == block
        assert isinstance(msg, AnswerBatch)
        assert _py_push(py_ring, codec.encode(msg)) == 0
        assert bytes(c_ring.segment.buf) == bytes(py_ring.segment.buf)
        assert c_objects == clients.snapshot()
        if block is not None:
            assert c_payload == _payload(rec)
            free_block(rec.last[0], block)  # type: ignore[index]
    finally:
        c_regions.close()
        py_regions.close()
        clients.close()
        _drop(c_ring, *([py_ring] if py_ring is not None else []))


def test_a_single_request_into_a_region_is_pushed_with_one_wake(arena: ArenaAllocator) -> None:
    clients = Clients()
    ring = Ring.create(f"/triton_mp_{PID}_test_apr_r{next(_names)}", 1 << 16)
    regions = ClientRegions()
    try:
        region = OutputRegion(clients.keys[1], 2, 128, 64, "out")
        req = InferRequest(
            request_id=7, reply_to=TO, model="m", version=1, batch_size=1, inputs=(),
            outputs=("OUTPUT0",), block=None, arrival_ns=0, output_regions=(region,),
        )  # fmt: skip
        sender = FakeSender(ring)
        answers = Answers(
            0, arena, regions, ORIGIN, False, threading.RLock(),
            Traces(False, lambda ref: np.zeros(0)), set(),
            lambda to, msg: pytest.fail("sent as a message"), lambda msg: None,
            lambda frontend_id, data: pytest.fail("sent by Python"), {TO.id: sender},
        )  # fmt: skip
        out = np.arange(16, dtype=np.float32)
        assert answers.answer((req,), [{"OUTPUT0": out}]) == ((), ())
        assert sender.wakes == 1
        (record,) = ring.pop_all()
        (response,) = codec.Decoder(AnswerBatch).decode(record).responses
        (ref,) = response.outputs
        assert (ref.segment, ref.offset, ref.nbytes, ref.region_id) == (region.key, 128, 64, 2)
        assert response.shared_blocks == ()
        assert bytes(clients.maps[1][128:192]) == out.tobytes()
        # NOTE: a region too small: the C call declines, Python answers with its error.
        small = msgspec.structs.replace(region, byte_size=32)
        sent: list[Any] = []
        answers._send_reply = lambda to, msg: sent.append(msg)  # type: ignore[method-assign]
        req2 = msgspec.structs.replace(req, output_regions=(small,))
        assert answers.answer((req2,), [{"OUTPUT0": out}]) == ((0,), ())
        assert sender.wakes == 1
        assert "should be at least 64 bytes" in sent[0].error.message
    finally:
        regions.close()
        clients.close()
        _drop(ring)
