"""A batch's requests as the backend takes them (``workers.tensors.batch_requests``).

No process is started: an arena of this test process stands for a frontend's. Arenas are
named ``/triton_mp_<pid>_test_br<n>`` and unlinked by the fixture. The batch comes as the
scheduler hands it on: REQUEST records (bytes) and messages side by side.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import msgspec
import numpy as np
import pytest

from triton_mp.backends.base import Result
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import (
    BlockRef,
    ErrorInfo,
    InferRequest,
    ReplyTo,
    Requester,
    TensorRef,
)
from triton_mp.ipc.recordio.request_records import encode_request
from triton_mp.ipc.tensor_pool import ArenaAllocator, SegmentCache
from triton_mp.workers.tensors.batch_requests import BatchRequests
from triton_mp.workers.tensors.tensor_io import ClientRegions, wire_tensor, write_block

_names = itertools.count()
ORIGIN = "worker m_0"


@pytest.fixture
def arena() -> Iterator[ArenaAllocator]:
    alloc = ArenaAllocator(f"/triton_mp_{os.getpid()}_test_br{next(_names)}", 1 << 16, 1 << 20)
    yield alloc
    alloc.close_and_unlink()


@pytest.fixture
def cache() -> Iterator[SegmentCache]:
    c = SegmentCache()
    yield c
    c.close()


def _request(rid: int, inputs: tuple[TensorRef, ...], block: BlockRef) -> InferRequest:
    return InferRequest(
        request_id=rid,
        reply_to=ReplyTo(Requester.FRONTEND, 2),
        model="m",
        version=1,
        batch_size=1,
        inputs=inputs,
        outputs=("OUT",),
        block=block,
        arrival_ns=5,
        timeout_us=70,
        client_id=f"id{rid}",
        sequence_id=9,
    )


def test_records_and_messages_decode_alike_and_inputs_are_views_of_the_arena(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    a = np.arange(6, dtype=np.float32).reshape(1, 6)
    s = np.array([[b"ab", b""]], dtype=np.object_)
    block, (ref_a, ref_s) = write_block(arena, [wire_tensor("A", a), wire_tensor("S", s)])
    first = _request(1, (ref_a, ref_s), block)
    second = msgspec.structs.replace(first, request_id=2, parameters_json='{"k": 1}')
    gather = BatchRequests(cache, ClientRegions(), None, ORIGIN)
    record = encode_request(first)
    assert record is not None
    reqs = gather.decoded((record, second))
    assert reqs == (first, second)
    results: list[Result | None] = [None, None]
    runnable, backend = gather.backend_requests(reqs, results)
    assert runnable == [0, 1]
    assert results == [None, None]
    for req, br in zip(reqs, backend, strict=True):
        assert list(br.inputs) == ["A", "S"]
        np.testing.assert_array_equal(br.inputs["A"], a)
        assert br.inputs["S"].tolist() == [[b"ab", b""]]
        # NOTE: a view over the arena, not a copy
        assert np.shares_memory(
            br.inputs["A"], np.frombuffer(cache.get(ref_a.segment).buf, np.uint8)
        )
        assert (br.outputs, br.batch_size, br.request_id, br.timeout_us) == (
            ("OUT",),
            1,
            req.client_id,
            70,
        )
        assert (br.parameters_json, br.sequence_id, br.token) == (req.parameters_json, 9, req)


def test_a_request_whose_arena_is_gone_fails_alone(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    a = np.ones((1, 4), np.int32)
    block, (ref,) = write_block(arena, [wire_tensor("A", a)])
    gone = msgspec.structs.replace(ref, segment=f"/triton_mp_{os.getpid()}_test_br_gone")
    reqs = (_request(1, (ref,), block), _request(2, (gone,), block), _request(3, (ref,), block))
    results: list[Result | None] = [None, None, None]
    gather = BatchRequests(cache, ClientRegions(), None, ORIGIN)
    runnable, backend = gather.backend_requests(reqs, results)
    assert runnable == [0, 2]
    assert [br.token for br in backend] == [reqs[0], reqs[2]]
    err = results[1]
    assert isinstance(err, ErrorInfo)
    assert (err.code, err.origin) == (ErrorCode.UNAVAILABLE, ORIGIN)
    assert results[0] is None
    assert results[2] is None
