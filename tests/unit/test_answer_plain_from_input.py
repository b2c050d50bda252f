"""``_answer_writer.answer_plain`` with ``input_buf``: an output answered from its request's
own input block (``TensorRef``'s rule in ``ipc.protocol.messages``;
``workers/native/answer_writer.cc`` PlanAlias).

- an output of 64 KiB or more that is the request's input, or a view inside it, is named by
  the input arena's segment and its offset there (no block allocated when every output is
  so; the bytes are the input's);
- a modified copy, a view of another request's input, an output smaller than 64 KiB, a view
  running past its input, an input in a client's region, or no ``input_buf``: copied into
  the worker's block as before (the bytes equal, the ref naming the block).

No processes: an input arena and an output arena of this test process
(``/triton_mp_<pid>_test_api*``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from triton_mp.backends.base import response_parameters
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.memory.shm import Segment, unlink_quietly
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BlockRef,
    InferRequest,
    ReplyTo,
    Requester,
    TensorRef,
)
from triton_mp.ipc.recordio import codec
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, ArenaAllocator, free_block
from triton_mp.workers.tensors.answer_batch import alloc_block
from triton_mp.workers.tensors.tensor_io import WIRE_OF

from .test_answer_plain import _drop, _ring
from .test_answer_writer import Recording

native = pytest.importorskip("triton_mp.workers._answer_writer")

_names = itertools.count()
PID = os.getpid()
TO = ReplyTo(Requester.FRONTEND, 2)
LARGE = 64 * 1024
"""answer_writer.cc kAliasMinBytes."""


@pytest.fixture
def inputs() -> Iterator[Segment]:
    """A frontend-like input arena (this worker maps it writable, as SegmentCache does)."""
    name = f"/triton_mp_{PID}_test_api_in{next(_names)}"
    seg = Segment.create(name, 1 << 21)
    yield seg
    seg.close()
    unlink_quietly(name)


@pytest.fixture
def rec() -> Iterator[Recording]:
    alloc = ArenaAllocator(f"/triton_mp_{PID}_test_api_a{next(_names)}", 1 << 21, 1 << 24)
    yield Recording(alloc)
    alloc.close_and_unlink()


def request(seg: Segment, rid: int, at: int, n: int, region_id: int = 0) -> InferRequest:
    """Request ``rid`` whose one FP32 input (``n`` bytes, filled) lies at ``at`` of ``seg``,
    in the block whose header is 64 bytes before it."""
    np.frombuffer(seg.buf, np.float32, n // 4, at)[:] = np.arange(n // 4) + rid
    return InferRequest(
        request_id=rid,
        reply_to=TO,
        model="m",
        version=1,
        batch_size=1,
        inputs=(TensorRef("IN", "FP32", (n // 4,), seg.name, at, n, region_id),),
        outputs=("OUT",),
        block=BlockRef(seg.name, at - BLOCK_HEADER_BYTES, 1),
        arrival_ns=0,
    )


def view(seg: Segment, req: InferRequest) -> np.ndarray:
    """The request's input as the model sees it: a view of the worker's mapping."""
    ref = req.inputs[0]
    return np.frombuffer(seg.buf, np.float32, ref.nbytes // 4, ref.offset)


def answer(
    reqs: tuple[InferRequest, ...], results: list[Any], rec: Recording, input_buf: Any
) -> tuple[AnswerBatch, BlockRef | None]:
    """answer_plain's AnswerBatch (pushed into a ring, popped back) and its block."""
    ring: Ring = _ring(1 << 16)
    try:
        got = native.answer_plain(
            reqs, results, Requester.FRONTEND, {TO.id: ring.segment.buf}, WIRE_OF,
            response_parameters, alloc_block, rec, None, input_buf,
        )  # fmt: skip
        assert got is not None
        _, data, block = got
        assert data is None  # NOTE: pushed
        (record,) = ring.pop_all()
        return codec.Decoder(AnswerBatch).decode(record), block
    finally:
        _drop(ring)


def bytes_of(seg: Segment, ref: TensorRef) -> bytes:
    return bytes(seg.buf[ref.offset : ref.offset + ref.nbytes])


def test_outputs_that_are_their_inputs_are_named_in_the_input_block(
    inputs: Segment, rec: Recording
) -> None:
    a = request(inputs, 1, 64, LARGE)
    b = request(inputs, 2, 64 + LARGE + 64, 3 * LARGE)
    # NOTE: a's input itself, b's a view inside it (its second half)
    results = [{"OUT": view(inputs, a)}, {"OUT": view(inputs, b)[LARGE * 3 // 8 :]}]
    msg, block = answer((a, b), results, rec, lambda s: inputs.buf)
    assert block is None
    assert rec.allocs == 0
    assert msg.handoffs == ()
    ra, rb = (r.outputs[0] for r in msg.responses)
    assert (ra.segment, ra.offset, ra.nbytes, ra.region_id) == (inputs.name, 64, LARGE, 0)
    assert (rb.segment, rb.offset, rb.nbytes) == (
        inputs.name,
        b.inputs[0].offset + LARGE * 3 // 2,
        LARGE * 3 // 2,
    )
    assert bytes_of(inputs, ra) == view(inputs, a).tobytes()
    assert bytes_of(inputs, rb) == view(inputs, b)[LARGE * 3 // 8 :].tobytes()
    assert all(r.shared_blocks == () for r in msg.responses)


def test_copies_and_other_outputs_are_copied_into_the_block(
    inputs: Segment, rec: Recording
) -> None:
    a = request(inputs, 1, 64, LARGE)
    b = request(inputs, 2, 64 + LARGE + 64, LARGE)
    c = request(inputs, 3, 64 + 2 * (LARGE + 64), LARGE - 4)
    d = request(inputs, 4, 64 + 3 * (LARGE + 64), LARGE, region_id=9)
    e = request(inputs, 5, 64 + 4 * (LARGE + 64), LARGE)
    wide = np.frombuffer(inputs.buf, np.float32, LARGE // 4, e.inputs[0].offset + 4)
    results = [
        {"OUT": view(inputs, a) + 1},  # NOTE: a modified copy
        {"OUT": view(inputs, a)},  # NOTE: another request's input
        {"OUT": view(inputs, c)},  # NOTE: under 64 KiB
        {"OUT": view(inputs, d)},  # NOTE: its input is in a client's region
        {"OUT": wide},  # NOTE: runs 4 bytes past its input
    ]
    expected = [r["OUT"].tobytes() for r in results]
    msg, block = answer((a, b, c, d, e), results, rec, lambda s: inputs.buf)
    assert block is not None
    assert msg.handoffs[0].uses == 5
    seg, _ = rec.last  # type: ignore[misc]
    for r, want in zip(msg.responses, expected, strict=True):
        (ref,) = r.outputs
        assert ref.segment == block.segment
        assert bytes_of(seg, ref) == want
    assert free_block(seg, block)


def test_without_input_buf_every_output_is_copied(inputs: Segment, rec: Recording) -> None:
    a = request(inputs, 1, 64, LARGE)
    for input_buf in (None, lambda s: (_ for _ in ()).throw(KeyError(s))):
        msg, block = answer((a,), [{"OUT": view(inputs, a)}], rec, input_buf)
        assert block is not None
        (ref,) = msg.responses[0].outputs
        assert ref.segment == block.segment
        seg, _ = rec.last  # type: ignore[misc]
        assert bytes_of(seg, ref) == view(inputs, a).tobytes()
        assert free_block(seg, block)
