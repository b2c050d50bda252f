"""The frontend's one submit path (``frontend.inference``) and its tickets, without a process.

Fakes (``tests/unit/fake_frontend.py``) stand in for the input arena, the ring to the
scheduler and a worker's output arena; answers are handed to the pending table as the
frontend's inbox would. Each test checks what is sent, what the ticket yields, and which
blocks are still held afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from tests.unit.fake_frontend import (
    FakeArena,
    FakeCache,
    FakeScheduler,
    FakeSegment,
    FakeWorker,
    is_live,
    model_entry,
    ring_full,
    table,
)
from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.inference import STOPPING_MESSAGE, Inference
from triton_mp.frontend.model_table import ModelTable
from triton_mp.frontend.request import InferenceRequest, InputTensor, RequestedOutput
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.ipc.memory.ring import RecordTooLarge
from triton_mp.ipc.protocol.messages import (
    CancelRequest,
    InferRequest,
    ReplyTo,
    Requester,
    SequenceFlags,
)

pytestmark = pytest.mark.timeout(30)

DECOUPLED_MESSAGE = "this endpoint doesn't support decoupled models"


class Frontend:
    """An ``Inference`` over fakes, plus the pieces a test looks at."""

    def __init__(self, models: ModelTable | None = None) -> None:
        self.input_segment = FakeSegment("/in")
        self.worker_segment = FakeSegment("/out")
        self.arena = FakeArena(self.input_segment)
        self.worker = FakeWorker(self.worker_segment)
        self.cache = FakeCache(self.input_segment, self.worker_segment)
        self.pending = PendingTable(self.cache)  # type: ignore[arg-type]
        self.scheduler = FakeScheduler()
        self.models = models or table(
            model_entry("unary"),
            model_entry("stream", decoupled=True),
            model_entry("ordered", preserve_ordering=True),
        )
        self.inference = Inference(
            frontend_id=2,
            models=self.models,
            shm=SystemShmRegistry(2),
            arena=self.arena,  # type: ignore[arg-type]
            cache=self.cache,  # type: ignore[arg-type]
            pending=self.pending,
            send_scheduler=self.scheduler.send,
            clock_ns=lambda: 123,
        )

    def deliver(self, *answers: object) -> None:
        self.pending.deliver(answers)  # type: ignore[arg-type]

    def last(self) -> InferRequest:
        return self.scheduler.requests()[-1]


def _request(
    model: str = "unary", values: tuple[float, ...] = (1.0, 2.0), **kw: object
) -> InferenceRequest:
    data = np.array(values, np.float32).tobytes()
    return InferenceRequest(
        model_name=model,
        inputs=(InputTensor("IN", "FP32", (len(values),)),),
        raw_inputs=(data,),
        **kw,  # type: ignore[arg-type]
    )


def _run(body: Callable[[Frontend], Awaitable[None]], models: ModelTable | None = None) -> None:
    async def main() -> None:
        await body(Frontend(models))

    asyncio.run(main())


def test_a_unary_request_is_written_once_sent_and_answered() -> None:
    async def body(f: Frontend) -> None:
        ticket = f.inference.submit(_request(id="r7"))
        sent = f.last()
        assert (sent.model, sent.version, sent.batch_size) == ("unary", 1, 1)
        assert sent.reply_to == ReplyTo(Requester.FRONTEND, 2)
        assert (sent.client_id, sent.arrival_ns, sent.outputs) == ("r7", 123, ("OUT",))
        (ref,) = sent.inputs
        written = bytes(f.input_segment.buf[ref.offset : ref.offset + ref.nbytes])
        assert written == np.array([1, 2], np.float32).tobytes()
        assert f.arena.live_blocks() == 1
        out = np.array([3, 4], np.float32).tobytes()
        f.deliver(f.worker.answer(sent, {"OUT": out}))
        assert f.arena.live_blocks() == 0, "the input block is freed with the answer"
        result = await ticket.result()
        assert (result.model, result.version, result.request_id) == ("unary", 1, "r7")
        assert result.data(result.outputs[0]) == out
        assert f.worker.arena.live_blocks() == 1
        result.release()
        assert f.worker.arena.live_blocks() == 0
        assert len(f.pending) == 0

    _run(body)


def test_request_parameters_reach_the_descriptor() -> None:
    async def body(f: Frontend) -> None:
        from triton_mp.frontend.request import bool_parameter, int64_parameter, string_parameter

        params = {
            "priority": int64_parameter(2),
            "timeout": int64_parameter(500),
            "sequence_id": string_parameter("abc"),
            "sequence_start": bool_parameter(True),
            "note": string_parameter("x"),
        }
        f.inference.submit(_request(parameters=params))
        sent = f.last()
        assert (sent.priority, sent.timeout_us) == (2, 500)
        assert (sent.sequence_id, sent.sequence_flags) == ("abc", SequenceFlags.START)
        assert sent.parameters_json == '{"note": "x"}'

    _run(body)


def test_an_error_answer_is_raised_by_result() -> None:
    async def body(f: Frontend) -> None:
        ticket = f.inference.submit(_request())
        f.deliver(f.worker.failed(f.last(), "kaput"))
        with pytest.raises(TritonMPError) as e:
            await ticket.result()
        assert (e.value.code, e.value.message) == (ErrorCode.INTERNAL, "kaput")
        assert f.arena.live_blocks() == 0

    _run(body)


def test_on_answer_hands_each_answer_to_the_callback_without_a_waiter() -> None:
    async def body(f: Frontend) -> None:
        got: list[object] = []
        ticket = f.inference.submit(_request(id="a"))
        ticket.on_answer(lambda t: got.append(t.take_result()))
        out = np.array([3, 4], np.float32).tobytes()
        f.deliver(f.worker.answer(f.last(), {"OUT": out}))
        (result,) = got
        assert result.data(result.outputs[0]) == out  # type: ignore[attr-defined]
        result.release()  # type: ignore[attr-defined]
        late = f.inference.submit(_request(id="b"))
        f.deliver(f.worker.failed(f.last(), "kaput"))
        errors: list[TritonMPError] = []

        def take(t: object) -> None:
            with pytest.raises(TritonMPError) as e:
                t.take_result()  # type: ignore[attr-defined]
            errors.append(e.value)

        late.on_answer(take)  # NOTE: an answer already queued is handed at once
        assert [(e.code, e.message) for e in errors] == [(ErrorCode.INTERNAL, "kaput")]
        assert f.arena.live_blocks() == 0
        assert f.worker.arena.live_blocks() == 0
        assert len(f.pending) == 0

    _run(body)


def test_a_decoupled_request_yields_every_response_then_ends() -> None:
    async def body(f: Frontend) -> None:
        ticket = f.inference.submit(_request("stream"))
        assert ticket.decoupled
        sent = f.last()
        one = np.ones(1, np.float32).tobytes()
        f.deliver(f.worker.answer(sent, {"OUT": one}, final=False))
        f.deliver(f.worker.answer(sent, {"OUT": one}, final=False))
        assert f.arena.live_blocks() == 1, "inputs are held until the final response"
        f.deliver(f.worker.empty_final(sent))
        got = []
        async for response in ticket:
            got.append((response.final, response.empty))
            if response.result is not None:
                response.result.release()
        assert got == [(False, False), (False, False), (True, True)]
        assert f.arena.live_blocks() == 0
        assert f.worker.arena.live_blocks() == 0
        ticket.cancel()
        assert f.scheduler.cancels() == [], "nothing to cancel after the final response"

    _run(body)


def test_a_caller_cancelled_while_waiting_cancels_the_request() -> None:
    async def body(f: Frontend) -> None:
        ticket = f.inference.submit(_request())
        waiter = asyncio.ensure_future(ticket.result())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        sent = f.last()
        assert f.scheduler.cancels() == [
            CancelRequest(
                request_id=sent.request_id,
                reply_to=ReplyTo(Requester.FRONTEND, 2),
                model="unary",
                version=1,
            )
        ]
        # The answer comes anyway (the request was running): every block is freed.
        f.deliver(f.worker.answer(sent, {"OUT": b"\0" * 4}))
        assert f.arena.live_blocks() == 0
        assert f.worker.arena.live_blocks() == 0

    _run(body)


def test_cancel_frees_the_responses_held_and_those_that_come_later() -> None:
    async def body(f: Frontend) -> None:
        ticket = f.inference.submit(_request("stream"))
        sent = f.last()
        f.deliver(f.worker.answer(sent, {"OUT": b"\0" * 4}, final=False))
        ticket.cancel()
        assert len(f.scheduler.cancels()) == 1
        assert f.worker.arena.live_blocks() == 0
        f.deliver(f.worker.answer(sent, {"OUT": b"\0" * 4}, final=True))
        assert f.worker.arena.live_blocks() == 0
        assert f.arena.live_blocks() == 0
        assert [r async for r in ticket] == []

    _run(body)


def test_a_full_ring_at_cancel_time_does_not_mask_the_cancellation() -> None:
    async def body(f: Frontend) -> None:
        ticket = f.inference.submit(_request())
        f.scheduler.refuse = ring_full()
        ticket.cancel()  # NOTE: no exception: the answer will still be freed on arrival

    _run(body)


def test_ordered_responses_wait_for_earlier_requests() -> None:
    async def body(f: Frontend) -> None:
        first = f.inference.submit(_request("ordered"))
        a = f.last()
        second = f.inference.submit(_request("ordered"))
        b = f.last()
        f.deliver(f.worker.answer(b, {"OUT": b"\0" * 4}))
        done = asyncio.ensure_future(second.result())
        await asyncio.sleep(0)
        assert not done.done(), "the second response waits for the first"
        f.deliver(f.worker.answer(a, {"OUT": b"\0" * 4}))
        (await first.result()).release()
        (await done).release()

    _run(body)


def test_validation_failures_allocate_and_send_nothing() -> None:
    async def body(f: Frontend) -> None:
        with pytest.raises(InvalidRequest) as e:
            f.inference.submit(_request(outputs=(RequestedOutput("NOPE"),)))
        assert e.value.message == "unexpected inference output 'NOPE' for model 'unary'"
        with pytest.raises(TritonMPError) as nf:
            f.inference.submit(_request("missing"))
        assert nf.value.code == ErrorCode.NOT_FOUND
        assert f.arena.blocks == []
        assert f.scheduler.sent == []

    _run(body)


def test_a_decoupled_model_is_refused_after_validation_where_unsupported() -> None:
    async def body(f: Frontend) -> None:
        # Triton's order: the request's own errors first, then the transaction policy.
        with pytest.raises(InvalidRequest) as bad:
            f.inference.submit(
                _request("stream", outputs=(RequestedOutput("NOPE"),)), decoupled_message="no"
            )
        assert bad.value.code == ErrorCode.INVALID_ARG
        with pytest.raises(InvalidRequest) as refused:
            f.inference.submit(_request("stream"), decoupled_message=DECOUPLED_MESSAGE)
        assert (refused.value.code, refused.value.message) == (
            ErrorCode.UNSUPPORTED,
            DECOUPLED_MESSAGE,
        )
        assert f.scheduler.sent == []

    _run(body)


def test_a_refused_send_forgets_the_request_and_frees_its_block() -> None:
    async def body(f: Frontend) -> None:
        f.scheduler.refuse = ring_full()
        with pytest.raises(TritonMPError) as e:
            f.inference.submit(_request())
        assert e.value.code == ErrorCode.UNAVAILABLE
        f.scheduler.refuse = RecordTooLarge("too big")
        with pytest.raises(InvalidRequest) as big:
            f.inference.submit(_request(id="r1"))
        assert big.value.message.startswith("[request id: r1] request of ")
        assert f.arena.live_blocks() == 0
        assert len(f.pending) == 0

    _run(body)


def test_admit_refuses_before_the_body_and_submit_does_not_repeat_it() -> None:
    async def body(f: Frontend) -> None:
        with pytest.raises(InvalidRequest) as e:
            f.inference.admit("stream", "", decoupled_message=DECOUPLED_MESSAGE)
        assert e.value.code == ErrorCode.UNSUPPORTED
        target = f.inference.admit("unary", "1", decoupled_message=DECOUPLED_MESSAGE)
        assert target.version == 1
        f.inference.submit(_request(), target=target, decoupled_message=DECOUPLED_MESSAGE)
        assert f.last().version == 1
        # The table changed meanwhile (the model was reloaded as version 2 only): the
        # target is stale, so the request is resolved again.
        f.models.update((model_entry("unary", versions=(2,)),))
        f.inference.submit(_request(), target=target, decoupled_message=DECOUPLED_MESSAGE)
        assert f.last().version == 2

    _run(body)


def test_draining_refuses_new_requests_and_waits_for_accepted_ones() -> None:
    async def body(f: Frontend) -> None:
        assert await f.inference.wait_drained(0)
        ticket = f.inference.submit(_request())
        f.inference.start_draining()
        with pytest.raises(TritonMPError) as e:
            f.inference.submit(_request())
        assert (e.value.code, e.value.message) == (ErrorCode.UNAVAILABLE, STOPPING_MESSAGE)
        assert not await f.inference.wait_drained(0.01)
        drained = asyncio.ensure_future(f.inference.wait_drained(5))
        await asyncio.sleep(0)
        f.deliver(f.worker.answer(f.last(), {"OUT": b"\0" * 4}))
        assert await drained
        (await ticket.result()).release()

    _run(body)


def test_a_worker_block_of_an_unknown_request_is_freed() -> None:
    async def body(f: Frontend) -> None:
        f.inference.submit(_request())
        stale = f.worker.answer(f.last(), {"OUT": b"\0" * 4})
        f.deliver(f.worker.failed(f.last()))
        f.deliver(stale)  # NOTE: e.g. a worker restart race: nobody waits for it
        assert not is_live(f.worker_segment, stale.block.offset)  # type: ignore[union-attr]

    _run(body)
