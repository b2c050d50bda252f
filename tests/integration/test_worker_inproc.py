"""``Worker`` in-process on the real onnxruntime backend and real shared-memory arenas.

The frontend side is played by this test: it writes each request's inputs into a block of
its own arena and reads the outputs back through the TensorRefs the worker sends. Sends
are recorded, not pushed through rings. Arenas are named ``/triton_mp_<pid>_test_*`` and
unlinked in fixture teardown.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import pytest

from triton_mp.backends.base import RESCHEDULED, BackendRequest, PhaseTimes, Result
from triton_mp.backends.onnxruntime.backend import OnnxRuntimeBackend
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.memory.ring import RecordTooLarge
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BatchAssign,
    BatchDone,
    BlockRef,
    ErrorInfo,
    InferRequest,
    InferResponse,
    ReplyTo,
    Requester,
    TensorRef,
)
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    ChannelSpec,
    InboxSpec,
    InstanceSpec,
    LogSpec,
    ModelVersionSpec,
    TensorSpec,
    WorkerSpec,
)
from triton_mp.ipc.tensor_pool import (
    BLOCK_HEADER_BYTES,
    LIVE,
    ArenaAllocator,
    SegmentCache,
    SharedBlocks,
    free_block,
)
from triton_mp.workers.worker import Worker

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILE = ROOT / "model_repository/add_sub/1/model.onnx"
PID = os.getpid()


def _t(name: str) -> TensorSpec:
    return TensorSpec(name=name, datatype="FP32", dims=(16,))


MODEL = ModelVersionSpec(
    model="add_sub",
    version=1,
    backend="onnxruntime",
    model_file=str(MODEL_FILE),
    max_batch_size=8,
    batching=BatchingSpec(kind="dynamic", max_batch_size=8, max_queue_delay_us=100),
    inputs=(_t("INPUT0"), _t("INPUT1")),
    outputs=(_t("OUTPUT0"), _t("OUTPUT1")),
    instance_ids=(0,),
)
INSTANCE = InstanceSpec(instance_id=0, name="add_sub_0", model="add_sub", version=1)
SPEC = WorkerSpec(
    instance=INSTANCE,
    model=MODEL,
    # NOTE: Worker never touches its channels; run_worker does. These names are never opened.
    inbox=InboxSpec(f"/triton_mp_{PID}_test_unused_sem", ()),
    to_scheduler=ChannelSpec(f"/triton_mp_{PID}_test_unused_ring", "unused"),
    to_frontends={},
    arena_prefix=f"/triton_mp_{PID}_test_worker",
    arena_bytes=1 << 16,
    arena_budget_bytes=1 << 20,
    log=LogSpec(),
)


@pytest.fixture(scope="module")
def ort_backend() -> Iterator[OnnxRuntimeBackend]:
    backend = OnnxRuntimeBackend(MODEL, INSTANCE)
    yield backend
    backend.close()


@dataclass
class Frontend:
    """This test as a frontend: owns the input arena, reads the worker's output arena."""

    arena: ArenaAllocator
    cache: SegmentCache
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    shared: SharedBlocks = field(default_factory=SharedBlocks)

    def request(
        self, batch_size: int, frontend_id: int = 0, outputs: Sequence[str] = ()
    ) -> tuple[InferRequest, np.ndarray, np.ndarray]:
        rid = next(self.ids)
        rng = np.random.default_rng(rid)
        a = rng.standard_normal((batch_size, 16)).astype(np.float32)
        b = rng.standard_normal((batch_size, 16)).astype(np.float32)
        seg, block = self.arena.alloc(a.nbytes + b.nbytes)
        pos = block + BLOCK_HEADER_BYTES
        refs = []
        for name, arr in (("INPUT0", a), ("INPUT1", b)):
            seg.buf[pos : pos + arr.nbytes] = arr.tobytes()
            refs.append(TensorRef(name, "FP32", arr.shape, seg.name, pos, arr.nbytes))
            pos += arr.nbytes
        req = InferRequest(
            request_id=rid,
            reply_to=ReplyTo(Requester.FRONTEND, frontend_id),
            model="add_sub",
            version=1,
            batch_size=batch_size,
            inputs=tuple(refs),
            outputs=tuple(outputs) or ("OUTPUT0", "OUTPUT1"),
            block=BlockRef(seg.name, block),
            arrival_ns=0,
        )
        return req, a, b

    def read(self, ref: TensorRef) -> np.ndarray:
        seg = self.cache.get(ref.segment)
        assert ref.datatype == "FP32"
        view = np.frombuffer(seg.buf, np.float32, count=ref.nbytes // 4, offset=ref.offset)
        return view.reshape(ref.shape).copy()

    def release(self, resp: InferResponse, req: InferRequest) -> None:
        """What the frontend does when it is done with a response: free the request's input
        block and the response's output blocks (one an ``AnswerBatch`` shares after its
        last response: ``SharedBlocks``, its handoffs taken by ``Sent``)."""
        for b in self.shared.released(resp):
            free_block(self.cache.get(b.segment), b)
        free_block(self.cache.get(req.block.segment), req.block)


@pytest.fixture
def frontend() -> Iterator[Frontend]:
    cache = SegmentCache()
    arena = ArenaAllocator(f"/triton_mp_{PID}_test_frontend", 1 << 16, 1 << 20, cache=cache)
    yield Frontend(arena, cache)
    cache.close()
    arena.close_and_unlink()


@dataclass
class Sent:
    """What the worker sent: every response (an ``AnswerBatch``'s unpacked, its handoffs
    given to ``shared``), and the messages as sent."""

    shared: SharedBlocks
    responses: list[tuple[ReplyTo, InferResponse]] = field(default_factory=list)
    messages: list[tuple[ReplyTo, InferResponse | AnswerBatch]] = field(default_factory=list)
    done: list[BatchDone] = field(default_factory=list)

    def to_frontend(self, reply_to: ReplyTo, msg: object) -> None:
        assert isinstance(msg, InferResponse | AnswerBatch)
        self.messages.append((reply_to, msg))
        if isinstance(msg, AnswerBatch):
            assert self.shared.arrived(msg) == []
            self.responses += [(reply_to, r) for r in msg.responses]
        else:
            self.responses.append((reply_to, msg))

    def response_of(self, req: InferRequest) -> InferResponse:
        (resp,) = [
            r for to, r in self.responses if (to, r.request_id) == (req.reply_to, req.request_id)
        ]
        return resp

    def to_scheduler(self, msg: object) -> None:
        assert isinstance(msg, BatchDone)
        self.done.append(msg)


@pytest.fixture
def worker_arena() -> Iterator[ArenaAllocator]:
    arena = ArenaAllocator(SPEC.arena_prefix, SPEC.arena_bytes, SPEC.arena_budget_bytes)
    yield arena
    arena.close_and_unlink()


@pytest.fixture
def worker_cache() -> Iterator[SegmentCache]:
    cache = SegmentCache()
    yield cache
    cache.close()


def _worker(backend: object, arena: ArenaAllocator, cache: SegmentCache, sent: Sent) -> Worker:
    return Worker(SPEC, backend, arena, cache, sent.to_frontend, sent.to_scheduler)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- fakes


class RaisingBackend:
    """Raises on the first ``fail_times`` calls, then runs the real backend."""

    def __init__(self, real: OnnxRuntimeBackend, fail_times: int = 1) -> None:
        self.real = real
        self.fail_times = fail_times

    def execute(self, requests: Sequence[BackendRequest]) -> tuple[list[Result], PhaseTimes]:
        if self.fail_times:
            self.fail_times -= 1
            raise RuntimeError("boom in execute")
        return self.real.execute(requests)

    def close(self) -> None:
        pass


class ShortBackend:
    """Returns one result too few."""

    def __init__(self, real: OnnxRuntimeBackend) -> None:
        self.real = real

    def execute(self, requests: Sequence[BackendRequest]) -> tuple[list[Result], PhaseTimes]:
        results, times = self.real.execute(requests)
        return results[:-1], times

    def close(self) -> None:
        pass


class PerItemErrorBackend:
    """Fails the request at ``index`` with its own error; drops OUTPUT1 of the one after."""

    def __init__(self, real: OnnxRuntimeBackend, index: int) -> None:
        self.real = real
        self.index = index

    def execute(self, requests: Sequence[BackendRequest]) -> tuple[list[Result], PhaseTimes]:
        results, times = self.real.execute(requests)
        results[self.index] = ErrorInfo(ErrorCode.INVALID_ARG, "bad item", "test")
        nxt = results[self.index + 1]
        assert isinstance(nxt, dict)
        del nxt["OUTPUT1"]
        return results, times

    def close(self) -> None:
        pass


class MixedBackend:
    """Request 0 rescheduled, request 1 without a result (None), the rest run."""

    def __init__(self, real: OnnxRuntimeBackend) -> None:
        self.real = real

    def execute(self, requests: Sequence[BackendRequest]) -> tuple[list[Result], PhaseTimes]:
        results: list[Result | None] = list(self.real.execute(requests)[0])
        results[0], results[1] = RESCHEDULED, None
        return results, PhaseTimes(0, 0)  # type: ignore[return-value]

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- tests


def test_a_batch_of_three_gives_each_request_its_own_outputs(
    ort_backend: OnnxRuntimeBackend,
    frontend: Frontend,
    worker_arena: ArenaAllocator,
    worker_cache: SegmentCache,
) -> None:
    sent = Sent(frontend.shared)
    worker = _worker(ort_backend, worker_arena, worker_cache, sent)
    reqs = [frontend.request(bs, frontend_id=f) for bs, f in ((1, 0), (2, 1), (1, 0))]
    worker.run_batch(BatchAssign(batch_id=7, requests=tuple(r for r, _, _ in reqs), dispatch_ns=0))

    # frontend 0's two requests share one message and one block; frontend 1's has its own
    (to0, batch), (to1, alone) = sent.messages
    assert isinstance(batch, AnswerBatch)
    assert (to0, [r.request_id for r in batch.responses]) == (
        ReplyTo(Requester.FRONTEND, 0),
        [reqs[0][0].request_id, reqs[2][0].request_id],
    )
    (handoff,) = batch.handoffs
    assert handoff.uses == 2
    assert all(r.block is None and r.shared_blocks == (handoff.block,) for r in batch.responses)
    assert isinstance(alone, InferResponse)
    assert (to1, alone.request_id) == (ReplyTo(Requester.FRONTEND, 1), reqs[1][0].request_id)
    assert alone.block is not None
    assert alone.shared_blocks == ()

    for req, a, b in reqs:
        resp = sent.response_of(req)
        assert resp.error is None
        assert resp.version == 1
        assert [o.name for o in resp.outputs] == ["OUTPUT0", "OUTPUT1"]
        block = resp.block or resp.shared_blocks[0]
        for ref in resp.outputs:
            assert ref.segment == block.segment
            assert ref.shape == (req.batch_size, 16)
            assert ref.offset % 64 == 0
        out0, out1 = (frontend.read(ref) for ref in resp.outputs)
        np.testing.assert_array_equal(out0, a + b)
        np.testing.assert_array_equal(out1, a - b)

    (done,) = sent.done
    assert (done.instance_id, done.batch_id, done.failed) == (0, 7, ())
    assert done.end_ns >= done.start_ns

    assert worker_arena.live_blocks() == 2  # one output block per message
    shared, own = handoff.block, alone.block

    def live(block: BlockRef) -> bool:
        return frontend.cache.get(block.segment).buf[block.offset] == LIVE

    frontend.release(sent.response_of(reqs[2][0]), reqs[2][0])
    assert (live(shared), live(own)) == (True, True)  # the shared block waits for its other use
    frontend.release(alone, reqs[1][0])
    assert (live(shared), live(own)) == (True, False)
    frontend.release(sent.response_of(reqs[0][0]), reqs[0][0])
    assert (live(shared), live(own)) == (False, False)
    assert worker_arena.live_blocks() == 0
    assert frontend.arena.live_blocks() == 0
    assert frontend.shared.pending() == 0


def test_a_request_may_ask_for_some_outputs_only(
    ort_backend: OnnxRuntimeBackend,
    frontend: Frontend,
    worker_arena: ArenaAllocator,
    worker_cache: SegmentCache,
) -> None:
    sent = Sent(frontend.shared)
    worker = _worker(ort_backend, worker_arena, worker_cache, sent)
    req, a, b = frontend.request(3, outputs=("OUTPUT1",))
    worker.run_batch(BatchAssign(batch_id=1, requests=(req,), dispatch_ns=0))
    ((_, resp),) = sent.responses
    (ref,) = resp.outputs
    assert ref.name == "OUTPUT1"
    np.testing.assert_array_equal(frontend.read(ref), a - b)
    frontend.release(resp, req)


def test_a_raising_backend_fails_the_batch_and_the_worker_goes_on(
    ort_backend: OnnxRuntimeBackend,
    frontend: Frontend,
    worker_arena: ArenaAllocator,
    worker_cache: SegmentCache,
) -> None:
    sent = Sent(frontend.shared)
    worker = _worker(RaisingBackend(ort_backend), worker_arena, worker_cache, sent)
    reqs = [frontend.request(bs)[0] for bs in (1, 2, 1)]
    worker.run_batch(BatchAssign(batch_id=1, requests=tuple(reqs), dispatch_ns=0))

    assert [r.request_id for _, r in sent.responses] == [r.request_id for r in reqs]
    for _, resp in sent.responses:
        assert resp.outputs == ()
        assert resp.block is None
        assert resp.error == ErrorInfo(
            ErrorCode.INTERNAL, "RuntimeError: boom in execute", "worker add_sub_0"
        )
    (done,) = sent.done
    assert done.failed == (0, 1, 2)
    assert worker_arena.live_blocks() == 0  # nothing was allocated for failed requests

    # the next batch on the same worker runs normally
    req, a, b = frontend.request(2)
    worker.run_batch(BatchAssign(batch_id=2, requests=(req,), dispatch_ns=0))
    resp = sent.responses[-1][1]
    assert resp.error is None
    np.testing.assert_array_equal(frontend.read(resp.outputs[0]), a + b)
    assert sent.done[-1].failed == ()
    frontend.release(resp, req)


def test_a_backend_returning_the_wrong_number_of_results_fails_every_request(
    ort_backend: OnnxRuntimeBackend,
    frontend: Frontend,
    worker_arena: ArenaAllocator,
    worker_cache: SegmentCache,
) -> None:
    sent = Sent(frontend.shared)
    worker = _worker(ShortBackend(ort_backend), worker_arena, worker_cache, sent)
    reqs = [frontend.request(1)[0] for _ in range(3)]
    worker.run_batch(BatchAssign(batch_id=3, requests=tuple(reqs), dispatch_ns=0))
    assert len(sent.responses) == 3
    for _, resp in sent.responses:
        assert resp.error is not None
        assert resp.error.code == ErrorCode.INTERNAL
        assert "returned 2 results for a batch of 3 requests" in resp.error.message
    assert sent.done[0].failed == (0, 1, 2)
    assert worker_arena.live_blocks() == 0


def test_per_item_errors_fail_only_their_requests(
    ort_backend: OnnxRuntimeBackend,
    frontend: Frontend,
    worker_arena: ArenaAllocator,
    worker_cache: SegmentCache,
) -> None:
    sent = Sent(frontend.shared)
    worker = _worker(PerItemErrorBackend(ort_backend, 0), worker_arena, worker_cache, sent)
    reqs = [frontend.request(bs) for bs in (1, 2, 1)]
    worker.run_batch(BatchAssign(batch_id=4, requests=tuple(r for r, _, _ in reqs), dispatch_ns=0))
    errors = [resp.error for _, resp in sent.responses]
    assert errors[0] == ErrorInfo(ErrorCode.INVALID_ARG, "bad item", "test")
    # the second request's backend result lacks OUTPUT1 it asked for: answered without it
    assert errors[1] is None
    assert [o.name for o in sent.responses[1][1].outputs] == ["OUTPUT0"]
    assert errors[2] is None
    req, a, b = reqs[2]
    resp = sent.responses[2][1]
    np.testing.assert_array_equal(frontend.read(resp.outputs[0]), a + b)
    assert sent.done[0].failed == (0,)
    assert worker_arena.live_blocks() >= 1
    frontend.release(resp, req)
    frontend.release(sent.responses[1][1], reqs[1][0])
    assert worker_arena.live_blocks() == 0


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, max(1, len(os.sched_getaffinity(0)) - 1)),
        ({"intra_op_thread_count": {"string_value": "3"}}, 3),
        ({"intra_op_thread_count": {"string_value": "0"}}, 0),
    ],
)
def test_intra_op_threads_leave_a_core_unless_the_config_says(
    parameters: dict[str, object], expected: int
) -> None:
    spec = msgspec.structs.replace(MODEL, config_json=json.dumps({"parameters": parameters}))
    backend = OnnxRuntimeBackend(spec, INSTANCE)
    try:
        got = backend._session.get_session_options().intra_op_num_threads
    finally:
        backend.close()
    assert got == expected


def test_a_group_too_large_for_one_record_is_answered_request_by_request(
    ort_backend: OnnxRuntimeBackend,
    frontend: Frontend,
    worker_arena: ArenaAllocator,
    worker_cache: SegmentCache,
) -> None:
    """The ring refuses the AnswerBatch (``RecordTooLarge``): its block goes back to the arena
    and each request gets its own response and block, as before answers were grouped."""
    sent = Sent(frontend.shared)
    refused: list[AnswerBatch] = []

    def to_frontend(reply_to: ReplyTo, msg: object) -> None:
        if isinstance(msg, AnswerBatch):
            refused.append(msg)
            raise RecordTooLarge("record of many bytes does not fit")
        sent.to_frontend(reply_to, msg)

    worker = Worker(SPEC, ort_backend, worker_arena, worker_cache, to_frontend, sent.to_scheduler)
    reqs = [frontend.request(bs) for bs in (1, 2, 1)]
    worker.run_batch(BatchAssign(batch_id=5, requests=tuple(r for r, _, _ in reqs), dispatch_ns=0))
    (batch,) = refused
    assert [h.uses for h in batch.handoffs] == [3]
    assert [type(m) for _, m in sent.messages] == [InferResponse] * 3
    for (_, resp), (req, a, b) in zip(sent.responses, reqs, strict=True):
        assert resp.request_id == req.request_id
        assert resp.block is not None
        np.testing.assert_array_equal(frontend.read(resp.outputs[1]), a - b)
        frontend.release(resp, req)
    assert sent.done[0].failed == ()
    assert worker_arena.live_blocks() == 0  # the refused group's block too (freed oldest)


def test_a_rescheduled_request_gets_no_answer_and_one_without_a_result_fails(
    ort_backend: OnnxRuntimeBackend,
    frontend: Frontend,
    worker_arena: ArenaAllocator,
    worker_cache: SegmentCache,
) -> None:
    sent = Sent(frontend.shared)
    worker = _worker(MixedBackend(ort_backend), worker_arena, worker_cache, sent)
    reqs = [frontend.request(1) for _ in range(4)]
    worker.run_batch(BatchAssign(batch_id=9, requests=tuple(r for r, _, _ in reqs), dispatch_ns=0))
    (done,) = sent.done
    assert (done.rescheduled, done.failed) == ((0,), (1,))
    assert [r.request_id for _, r in sent.responses] == [reqs[i][0].request_id for i in (1, 2, 3)]
    missing = sent.response_of(reqs[1][0]).error
    assert missing == ErrorInfo(ErrorCode.INTERNAL, "no result for the request", "worker add_sub_0")
    for i in (2, 3):
        req, a, b = reqs[i]
        resp = sent.response_of(req)
        np.testing.assert_array_equal(frontend.read(resp.outputs[0]), a + b)
        frontend.release(resp, req)
    assert worker_arena.live_blocks() == 0


@pytest.mark.parametrize("reoffers", [True, False])
def test_a_worker_reoffers_its_lease_after_its_answers_and_says_so(
    ort_backend: OnnxRuntimeBackend,
    frontend: Frontend,
    worker_arena: ArenaAllocator,
    worker_cache: SegmentCache,
    reoffers: bool,
) -> None:
    """``ipc.direct.worker_reoffers``: the lease goes up once every answer is posted; the
    ``BatchDone`` that says so goes lazily, and one after a refused re-offer wakes."""
    sent = Sent(frontend.shared)
    lazy: list[BatchDone] = []
    asked: list[tuple[bool, int]] = []

    def reoffer(rescheduled: bool) -> bool:
        asked.append((rescheduled, len(sent.responses)))
        return reoffers

    worker = Worker(
        SPEC,
        ort_backend,
        worker_arena,
        worker_cache,
        sent.to_frontend,
        sent.to_scheduler,
        send_done=lambda msg: lazy.append(msg),  # type: ignore[arg-type]
        reoffer=reoffer,
    )
    reqs = [frontend.request(1) for _ in range(2)]
    worker.run_batch(BatchAssign(batch_id=-3, requests=tuple(r for r, _, _ in reqs), dispatch_ns=0))
    assert asked == [(False, 2)]  # after both answers
    (ended,) = lazy if reoffers else sent.done
    assert len(lazy) + len(sent.done) == 1
    assert ended.reoffered is reoffers
    for req, _, _ in reqs:
        frontend.release(sent.response_of(req), req)


class SeeingBackend:
    """Runs the real backend and keeps the arrays each batch's requests brought; says it
    writes its inputs unless ``writes_inputs`` is given False (the real one's word)."""

    def __init__(self, real: OnnxRuntimeBackend, writes_inputs: bool | None) -> None:
        self.real = real
        if writes_inputs is not None:
            self.writes_inputs = writes_inputs
        self.seen: list[np.ndarray] = []

    def execute(self, requests: Sequence[BackendRequest]) -> tuple[list[Result], PhaseTimes]:
        self.seen += [r.inputs["INPUT0"] for r in requests]
        return self.real.execute(requests)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("writes_inputs", [None, False])
def test_requests_of_a_batch_reading_one_client_window_are_copies_only_for_a_writer(
    ort_backend: OnnxRuntimeBackend,
    frontend: Frontend,
    worker_arena: ArenaAllocator,
    worker_cache: SegmentCache,
    writes_inputs: bool | None,
) -> None:
    """Three requests whose INPUT0 and INPUT1 are the same two windows of one client object
    (perf_analyzer's shared-memory requests): with the onnxruntime backend's own
    ``writes_inputs = False`` each sees a view of the one mapping, with a backend that may
    write its inputs the later ones get copies; the answers are right either way."""
    import posix_ipc

    assert OnnxRuntimeBackend.writes_inputs is False
    key = f"/triton_mp_{PID}_test_inproc_client_{writes_inputs}"
    obj = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=4096)
    a = np.arange(16, dtype=np.float32)
    b = np.full(16, 0.5, dtype=np.float32)
    os.pwrite(obj.fd, a.tobytes() + b.tobytes(), 0)
    obj.close_fd()
    try:
        backend = SeeingBackend(ort_backend, writes_inputs)
        sent = Sent(frontend.shared)
        worker = _worker(backend, worker_arena, worker_cache, sent)
        reqs = []
        for rid in (1, 2, 3):
            refs = (
                TensorRef("INPUT0", "FP32", (1, 16), key, 0, 64, region_id=1),
                TensorRef("INPUT1", "FP32", (1, 16), key, 64, 64, region_id=1),
            )
            seg, block = frontend.arena.alloc(64)
            reqs.append(
                InferRequest(
                    request_id=rid,
                    reply_to=ReplyTo(Requester.FRONTEND, 0),
                    model="add_sub",
                    version=1,
                    batch_size=1,
                    inputs=refs,
                    outputs=("OUTPUT0",),
                    block=BlockRef(seg.name, block),
                    arrival_ns=0,
                )
            )
        worker.run_batch(BatchAssign(batch_id=1, requests=tuple(reqs), dispatch_ns=0))
        for req in reqs:
            (out,) = sent.response_of(req).outputs
            np.testing.assert_array_equal(frontend.read(out), (a + b).reshape(1, 16))
        first, *later = backend.seen
        assert [np.shares_memory(first, x) for x in later] == [writes_inputs is False] * 2
        worker.close()
    finally:
        posix_ipc.unlink_shared_memory(key)
