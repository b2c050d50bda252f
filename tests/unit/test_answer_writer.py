"""The C answer writer (``workers/native/answer_writer.cc``) against its Python twin
(``workers.tensors.answer_batch.write_answer_batch``'s loop and msgspec's encoding).

For random groups (request ids and versions over the whole int range msgspec takes, unicode
output names of every length class, shapes whose dims need every msgpack int form, fixed-size,
non-contiguous and BYTES outputs, empty outputs, response parameters, a segment name past 31
bytes) the C writer's bytes must be ``codec.encode`` of the message the Python loop builds
over the same block, and the block's bytes the same; a group the writer declines (one with
a BYTES or strided output) must be one off the hot path, declined before anything is
allocated. No processes: arenas in this process,
named ``/triton_mp_<pid>_test_aw...`` and unlinked by the fixture.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triton_mp.backends.base import Outputs, response_parameters
from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc.memory.shm import Segment
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BlockRef,
    ErrorInfo,
    InferRequest,
    OutputRegion,
    ReplyTo,
    Requester,
)
from triton_mp.ipc.recordio import codec
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, ArenaAllocator, free_block
from triton_mp.workers.tensors import answer_batch
from triton_mp.workers.tensors.answer_batch import write_answer_batch
from triton_mp.workers.tensors.tensor_io import WIRE_OF, ClientRegions

native = pytest.importorskip("triton_mp.workers._answer_writer")

_prefixes = itertools.count()
ORIGIN = "worker m_0"


@pytest.fixture(params=["short", "long"])
def arena(request: pytest.FixtureRequest) -> Iterator[ArenaAllocator]:
    # NOTE: "long": a segment name of 32+ bytes (msgpack str8 where the short one is fixstr).
    tail = "_with_a_segment_name_past_31_bytes" if request.param == "long" else ""
    alloc = ArenaAllocator(
        f"/triton_mp_{os.getpid()}_test_aw{next(_prefixes)}{tail}", 1 << 20, 1 << 24
    )
    yield alloc
    alloc.close_and_unlink()


class Recording:
    """An arena that remembers its last block (its payload zeroed: padding between outputs
    is written by neither writer), and gives that same block again once ``replay`` is set
    (so the Python twin writes over the C writer's block)."""

    def __init__(self, arena: ArenaAllocator) -> None:
        self.arena = arena
        self.last: tuple[Segment, int] | None = None
        self.payload = 0
        self.replay = False
        self.allocs = 0

    def alloc(self, payload_bytes: int) -> tuple[Segment, int]:
        if self.replay:
            assert self.last is not None
            assert payload_bytes == self.payload
            return self.last
        self.allocs += 1
        self.last = seg, offset = self.arena.alloc(payload_bytes)
        self.payload = payload_bytes
        start = offset + BLOCK_HEADER_BYTES
        seg.buf[start : start + payload_bytes] = bytes(payload_bytes)
        return self.last


def _req(
    rid: int, version: int, outputs: tuple[str, ...], regions: tuple[OutputRegion, ...] = ()
) -> InferRequest:
    return InferRequest(
        request_id=rid,
        reply_to=ReplyTo(Requester.FRONTEND, 0),
        model="m",
        version=version,
        batch_size=1,
        inputs=(),
        outputs=outputs,
        block=None,
        arrival_ns=0,
        output_regions=regions,
    )


EDGES = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
"""Where msgpack's int forms change (fixint, uint8, 16, 32, 64)."""
NEGATIVE_EDGES = [-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]
REQUEST_IDS = st.one_of(st.sampled_from(EDGES), st.integers(0, 2**64 - 1))
VERSIONS = st.one_of(st.sampled_from(EDGES[:10] + NEGATIVE_EDGES), st.integers(-(2**63), 2**63 - 1))

DIMS = st.sampled_from([0, 1, 2, 3, 15, 16, 31, 127, 128, 255, 256, 300, 65535, 65536, 70000])
DTYPES = [np.float32, np.int64, np.uint8, np.bool_, np.float16, np.int8, np.float64, np.uint64]


@st.composite
def arrays(draw: st.DrawFn, odd: bool) -> np.ndarray:
    """A small array of any kind the hot path meets: fixed-size (contiguous or a strided
    view, which goes through its wire bytes), or BYTES; dims from every msgpack int class
    (the product kept under ~600 KB)."""
    shape = tuple(draw(st.lists(DIMS, max_size=4)))
    if math.prod(shape) > 70000:  # NOTE: Python ints: np.prod wraps past 2**63
        shape = tuple(d if d <= 3 else 3 for d in shape)
    kind = draw(st.sampled_from(["fixed", "strided", "bytes"])) if odd else "fixed"
    if kind == "bytes":
        n = math.prod(shape)
        items = [draw(st.binary(max_size=6)) for _ in range(min(n, 4))] or [b""]
        return np.array([items[i % len(items)] for i in range(n)], dtype=np.object_).reshape(shape)
    dtype = draw(st.sampled_from(DTYPES))
    arr = (np.arange(math.prod(shape) * 2) % 100).astype(dtype)
    if kind == "strided":
        return arr[::2].reshape(shape) if shape else arr[:1].reshape(())
    return arr[: arr.size // 2].reshape(shape)


NAMES = st.one_of(
    st.text(min_size=1, max_size=8),
    st.text(min_size=32, max_size=40),
    st.sampled_from(["OUTPUT0", "OUTPUT1", "é" * 200, "x" * 300]),
)


@st.composite
def members(draw: st.DrawFn) -> list[tuple[InferRequest, dict[str, np.ndarray]]]:
    """A group of one frontend's requests whose every output goes to the arena."""
    out = []
    odd = draw(st.integers(0, 3)) == 0  # NOTE: a quarter of the groups may be declined
    for _ in range(draw(st.integers(1, 12))):
        results = draw(st.dictionaries(NAMES, arrays(odd), max_size=3))
        names = list(results)
        wanted = tuple(n for n in names if draw(st.booleans())) + tuple(
            draw(st.lists(NAMES, max_size=1))
        )
        rid = draw(REQUEST_IDS)
        version = draw(VERSIONS)
        params = draw(st.one_of(st.none(), st.text(max_size=40), st.just("p" * 70000)))
        res: dict[str, np.ndarray] = results if params is None else Outputs(results, params)
        out.append((_req(rid, version, wanted), res))
    return out


def _plain(group: Any) -> bool:
    """Whether every requested output of the group takes _place_all's hot path (an array of
    a WIRE_OF dtype, C-contiguous): the groups the C writer takes."""
    return all(
        isinstance(arr, np.ndarray) and arr.dtype in WIRE_OF and arr.flags.c_contiguous
        for req, res in group
        for name, arr in res.items()
        if name in req.outputs
    )


def _both(arena: ArenaAllocator, group: Any) -> tuple[bytes, bytes, bytes, bytes] | None:
    """(C bytes, its block's payload, msgspec's bytes of the Python twin, its payload),
    the twin written over the same block after it was zeroed; None when the C writer
    declined the group (then it must not be plain, and nothing was allocated first)."""
    rec = Recording(arena)
    data, block, failed = write_answer_batch(rec, ClientRegions(), group, ORIGIN, True)  # type: ignore[arg-type]
    if not isinstance(data, bytes):
        assert not _plain(group)
        assert rec.allocs == int(block is not None)
        if block is not None:
            free_block(rec.last[0], block)  # type: ignore[index]
        return None
    assert _plain(group)
    assert failed == []
    if block is None:
        rec.replay = True  # NOTE: no alloc happens then
        msg, block2, _ = write_answer_batch(rec, ClientRegions(), group, ORIGIN)  # type: ignore[arg-type]
        assert isinstance(msg, AnswerBatch)
        assert block2 is None
        return data, b"", codec.encode(msg), b""
    assert rec.last is not None
    seg, offset = rec.last
    start = offset + BLOCK_HEADER_BYTES
    end = start + rec.payload
    c_payload = bytes(seg.buf[start:end])
    seg.buf[start:end] = bytes(end - start)
    rec.replay = True
    msg, block2, _ = write_answer_batch(rec, ClientRegions(), group, ORIGIN)  # type: ignore[arg-type]
    py_payload = bytes(seg.buf[start:end])
    assert isinstance(msg, AnswerBatch)
    assert block2 == block
    free_block(seg, block)
    return data, c_payload, codec.encode(msg), py_payload


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])  # fmt: skip
@given(group=members())
def test_random_groups_are_msgspecs_bytes_and_the_same_block(
    arena: ArenaAllocator, group: list[tuple[InferRequest, dict[str, np.ndarray]]]
) -> None:
    both = _both(arena, group)
    if both is not None:
        data, c_payload, expected, py_payload = both
        assert data == expected
        assert c_payload == py_payload


def test_a_group_of_empty_outputs_takes_no_block(arena: ArenaAllocator) -> None:
    group = [
        (_req(1, 1, ("A", "B")), {"A": np.zeros((0, 4), np.float32), "B": np.zeros(0, np.int8)}),
        (_req(2, 1, ("A",)), {"A": np.zeros((1, 0), np.float32)}),
    ]
    both = _both(arena, group)
    assert both is not None
    assert both[0] == both[2]
    assert codec.Decoder(AnswerBatch).decode(both[0]).handoffs == ()


REGION = OutputRegion("/client", 1, 0, 64, "r")


@pytest.mark.parametrize(
    "member",
    [
        (_req(2, 1, ("A",)), ErrorInfo(ErrorCode.INTERNAL, "no", ORIGIN)),  # an error
        (_req(2, 1, ("A",), (REGION,)), {"A": np.ones(4, np.float32)}),  # a client region
        (_req(2, 1, ("A",)), {"A": np.array([b"x"], dtype=np.object_)}),  # BYTES
        (_req(2, 1, ("A",)), {"A": np.ones(8, np.float32)[::2]}),  # strided
        (_req(2, 1, ("A",)), {"A": np.ones(4, ">f4")}),  # not in native order
        (_req(2, 1, ("A",)), {"A": [1.0, 2.0]}),  # no array
        (_req(2, 1, ("A",)), {"A": np.ones(4, np.complex64)}),  # no Triton datatype
    ],
)
def test_a_group_with_a_member_off_the_hot_path_is_declined_before_any_allocation(
    member: Any,
) -> None:
    calls: list[int] = []

    def alloc(arena: object, total: int) -> tuple[bytearray, int, None]:
        calls.append(total)
        return bytearray(total + 64), 64, None

    ok = (_req(1, 1, ("A",)), {"A": np.ones(4, np.float32)})
    assert native.write_plain([ok, member], WIRE_OF, response_parameters, alloc, None) is None
    assert calls == []


def test_the_allocators_and_the_parameters_errors_propagate() -> None:
    def alloc(arena: object, total: int) -> tuple[bytearray, int, None]:
        raise TritonMPError("arena exhausted", ErrorCode.UNAVAILABLE)

    def params_of(res: object) -> str:
        raise RuntimeError("params")

    ok = (_req(1, 1, ("A",)), {"A": np.ones(4, np.float32)})
    with pytest.raises(TritonMPError, match="exhausted"):
        native.write_plain([ok], WIRE_OF, response_parameters, alloc, None)
    with pytest.raises(RuntimeError, match="params"):
        native.write_plain([(ok[0], Outputs(ok[1], "{}"))], WIRE_OF, params_of, alloc, None)


def test_without_the_extension_the_message_is_built(
    arena: ArenaAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(answer_batch, "native_writer", None)
    group = [(_req(1, 1, ("A",)), {"A": np.ones(4, np.float32)})]
    msg, block, _ = write_answer_batch(arena, ClientRegions(), group, ORIGIN, True)  # type: ignore[arg-type]
    assert isinstance(msg, AnswerBatch)
    assert block is not None


def test_outputs_past_the_end_of_the_block_are_refused() -> None:
    buf = bytearray(128)

    def alloc(arena: object, total: int) -> tuple[bytearray, int, BlockRef]:
        return buf, 64, BlockRef("/seg", 0, 1)

    member = (_req(1, 1, ("A",)), {"A": np.ones(100, np.uint8)})
    with pytest.raises(ValueError, match="past the end"):
        native.write_plain([member], WIRE_OF, response_parameters, alloc, None)
    assert bytes(buf) == bytes(128)


class Sub(np.ndarray):
    """An ndarray subclass: the writer reads it through Python (getattr, the buffer)."""


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3).view(Sub),  # not exactly an ndarray
        np.arange(512, dtype=np.int16).reshape((2,) * 9),  # nine dims
        np.arange(300, dtype=np.uint8).reshape(3, 100),  # the C path, beside them
    ],
)
def test_outputs_read_through_python_or_numpy_are_msgspecs_bytes(
    arena: ArenaAllocator, arr: np.ndarray
) -> None:
    group = [(_req(7, 3, ("A", "B")), {"A": arr, "B": np.ones((1, 16), np.float32)})]
    both = _both(arena, group)
    assert both is not None
    data, c_payload, expected, py_payload = both
    assert data == expected
    assert c_payload == py_payload


class Fields:
    """A request that is no InferRequest: the writer reads its fields with getattr."""

    def __init__(self, req: InferRequest) -> None:
        for name in ("request_id", "version", "outputs", "output_regions", "reply_to", "trace"):
            setattr(self, name, getattr(req, name))
        self.inputs = req.inputs


def test_a_request_of_another_class_is_read_with_getattr() -> None:
    def alloc(arena: object, total: int) -> tuple[bytearray, int, BlockRef]:
        return bytearray(total + 64), 64, BlockRef("/seg", 0, 1)

    req = _req(2**40, -5, ("A",))
    outputs = {"A": np.arange(4, dtype=np.float32)}
    slots = native.write_plain([(req, outputs)], WIRE_OF, response_parameters, alloc, None)
    attrs = native.write_plain([(Fields(req), outputs)], WIRE_OF, response_parameters, alloc, None)
    assert slots is not None
    assert attrs is not None
    assert slots[0] == attrs[0]


def test_configure_refuses_a_class_without_the_fields() -> None:
    class Computed:
        """Every field a property: no slot to read."""

        request_id = version = outputs = output_regions = property(lambda self: 0)
        reply_to = trace = inputs = kind = id = property(lambda self: 0)

    with pytest.raises(AttributeError):
        native.configure(dict, ReplyTo)
    with pytest.raises(TypeError, match="not an object slot"):
        native.configure(Computed, ReplyTo)
    with pytest.raises(TypeError, match="not an object slot"):
        native.configure(InferRequest, Computed)
    test_a_request_of_another_class_is_read_with_getattr()  # NOTE: the configured ones kept
