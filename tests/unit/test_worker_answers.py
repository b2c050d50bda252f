"""How a worker answers a batch (``workers.answering.Answers.answer``, from
``Worker.run_batch``): which requests share one ``AnswerBatch`` and which get an
``InferResponse`` each.

No process: a fake backend echoes each request's input as its output, the worker's arena and
the "frontend's" input arena are arenas of this test process (``/triton_mp_<pid>_test_wa*``,
unlinked by the fixture), and the answers are kept as sent (address, message).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import numpy as np
import pytest

from triton_mp.backends.base import BackendRequest, PhaseTimes, Result
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BatchAssign,
    ErrorInfo,
    InferRequest,
    InferResponse,
    ReplyTo,
    Requester,
    TraceContext,
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
from triton_mp.ipc.recordio.request_records import encode_request
from triton_mp.ipc.tensor_pool import ArenaAllocator, SegmentCache
from triton_mp.workers import prewake
from triton_mp.workers.tensors.tensor_io import wire_tensor, write_block
from triton_mp.workers.worker import Worker

PID = os.getpid()
_names = itertools.count()


class Echo:
    """OUT = IN for each request; a request whose IN holds a negative number fails. Each
    execute is noted in ``events`` as ``(None, "execute")``, among the answers sent."""

    def __init__(self, events: list[tuple[ReplyTo | None, Any]]) -> None:
        self._events = events

    def execute(self, requests: Sequence[BackendRequest]) -> tuple[list[Result], PhaseTimes]:
        self._events.append((None, "execute"))
        out: list[Result] = []
        for r in requests:
            arr = r.inputs["IN"]
            if arr.min() < 0:
                out.append(ErrorInfo(3, "negative", "model"))
            else:
                out.append({"OUT": arr.copy()})
        return out, PhaseTimes(0, 0)

    def close(self) -> None:
        pass


@pytest.fixture
def world() -> Iterator[tuple[Worker, ArenaAllocator, list[tuple[ReplyTo | None, Any]]]]:
    n = next(_names)
    t = TensorSpec(name="IN", datatype="FP32", dims=(4,))
    model = ModelVersionSpec(
        model="m",
        version=1,
        backend="python",
        model_file="",
        max_batch_size=8,
        batching=BatchingSpec(kind="dynamic", max_batch_size=8, max_queue_delay_us=0),
        inputs=(t,),
        outputs=(msgspec.structs.replace(t, name="OUT"),),
        instance_ids=(0,),
        config_json=json.dumps({"name": "m", "max_batch_size": 8}),
    )
    spec = WorkerSpec(
        instance=InstanceSpec(instance_id=0, name="m_0", model="m", version=1),
        model=model,
        inbox=InboxSpec(f"/triton_mp_{PID}_test_wa_unused", ()),
        to_scheduler=ChannelSpec(f"/triton_mp_{PID}_test_wa_unused_ring", "unused"),
        to_frontends={},
        arena_prefix=f"/triton_mp_{PID}_test_wa{n}w",
        arena_bytes=1 << 16,
        arena_budget_bytes=1 << 20,
        log=LogSpec(),
    )
    inputs = ArenaAllocator(f"/triton_mp_{PID}_test_wa{n}f", 1 << 16, 1 << 20)
    outputs = ArenaAllocator(spec.arena_prefix, spec.arena_bytes, spec.arena_budget_bytes)
    cache = SegmentCache()
    sent: list[tuple[ReplyTo | None, Any]] = []
    backend: Any = Echo(sent)
    done: list[object] = []
    worker = Worker(
        spec,
        backend,
        outputs,
        cache,
        lambda to, m: sent.append((to, m)),
        done.append,
        wake_frontend=lambda i: sent.append((ReplyTo(Requester.FRONTEND, i), "wake")),
    )
    try:
        yield worker, inputs, sent
    finally:
        worker.close()
        cache.close()
        inputs.close_and_unlink()
        outputs.close_and_unlink()


def _request(
    inputs: ArenaAllocator, rid: int, frontend: int, value: float, trace: bool = False
) -> InferRequest:
    block, (ref,) = write_block(inputs, [wire_tensor("IN", np.full((1, 4), value, np.float32))])
    return InferRequest(
        request_id=rid,
        reply_to=ReplyTo(Requester.FRONTEND, frontend),
        model="m",
        version=1,
        batch_size=1,
        inputs=(ref,),
        outputs=("OUT",),
        block=block,
        arrival_ns=0,
        trace=TraceContext(1) if trace else None,
    )


def _answers(sent: list[tuple[ReplyTo | None, Any]]) -> list[tuple[int, str, tuple[int, ...]]]:
    """(frontend, message kind, request ids) of each message sent (executes and early wakes
    left out)."""
    out = []
    for to, msg in sent:
        if isinstance(msg, str):
            continue
        assert to is not None
        if isinstance(msg, AnswerBatch):
            out.append((to.id, "batch", tuple(r.request_id for r in msg.responses)))
        else:
            assert isinstance(msg, InferResponse)
            out.append((to.id, "one", (msg.request_id,)))
    return out


def test_a_batch_of_one_frontends_records_is_one_answer_batch(world: Any) -> None:
    worker, inputs, sent = world
    reqs = [_request(inputs, i, 0, float(i)) for i in (1, 2, 3)]
    records = tuple(encode_request(r) for r in reqs)
    worker.run_batch(BatchAssign(batch_id=1, requests=records, dispatch_ns=0))
    assert _answers(sent) == [(0, "batch", (1, 2, 3))]
    ((_, msg),) = [e for e in sent if not isinstance(e[1], str)]
    assert [r.error for r in msg.responses] == [None, None, None]
    assert msg.handoffs[0].uses == 3


def test_an_error_among_them_stays_in_the_one_answer_batch(world: Any) -> None:
    worker, inputs, sent = world
    reqs = tuple(_request(inputs, i, 0, v) for i, v in ((1, 1.0), (2, -1.0), (3, 3.0)))
    worker.run_batch(BatchAssign(batch_id=1, requests=reqs, dispatch_ns=0))
    assert _answers(sent) == [(0, "batch", (1, 2, 3))]
    ((_, msg),) = [e for e in sent if not isinstance(e[1], str)]
    assert [r.error is not None for r in msg.responses] == [False, True, False]
    assert msg.handoffs[0].uses == 2


def test_two_frontends_get_one_message_each_and_a_traced_request_its_own(world: Any) -> None:
    worker, inputs, sent = world
    reqs = (
        _request(inputs, 1, 0, 1.0),
        _request(inputs, 2, 1, 2.0),
        _request(inputs, 3, 0, 3.0),
        _request(inputs, 4, 0, 4.0, trace=True),
        _request(inputs, 5, 2, 5.0),
    )
    worker.run_batch(BatchAssign(batch_id=1, requests=reqs, dispatch_ns=0))
    assert sorted(_answers(sent)) == [
        (0, "batch", (1, 3)),
        (0, "one", (4,)),
        (1, "one", (2,)),
        (2, "one", (5,)),
    ]


def test_records_of_two_frontends_get_one_answer_batch_each(world: Any) -> None:
    worker, inputs, sent = world
    reqs = [_request(inputs, i, i % 2, float(i)) for i in (1, 2, 3, 4)]
    records = tuple(encode_request(r) for r in reqs)
    worker.run_batch(BatchAssign(batch_id=1, requests=records, dispatch_ns=0))
    assert sorted(_answers(sent)) == [(0, "batch", (2, 4)), (1, "batch", (1, 3))]


def _events(sent: list[tuple[ReplyTo | None, Any]]) -> list[tuple[int, str]]:
    """(frontend or -1, "execute" / "wake" / "answer") of each event, in order."""
    return [
        (-1 if to is None else to.id, msg if isinstance(msg, str) else "answer") for to, msg in sent
    ]


@pytest.mark.parametrize("at_start", [True, False])
def test_the_frontends_are_woken_early_at_the_start_or_after_execute(
    world: Any, monkeypatch: pytest.MonkeyPatch, at_start: bool
) -> None:
    # NOTE: the bounds moved so that the in-process batch's duration, whatever it is, picks
    # the branch: every batch counts as very short, or as longer but short.
    monkeypatch.setattr(prewake, "PREWAKE_MAX_NS", 10**15)
    monkeypatch.setattr(prewake, "PREWAKE_START_MAX_NS", 10**14 if at_start else 0)
    worker, inputs, sent = world
    worker.run_batch(
        BatchAssign(batch_id=1, requests=(_request(inputs, 1, 0, 1.0),), dispatch_ns=0)
    )
    assert _events(sent) == [(-1, "execute"), (0, "answer")]  # the first batch: no wake
    sent.clear()
    reqs = (_request(inputs, 2, 0, 2.0), _request(inputs, 3, 1, 3.0), _request(inputs, 4, 0, 4.0))
    worker.run_batch(BatchAssign(batch_id=2, requests=reqs, dispatch_ns=0))
    events = _events(sent)
    wakes = [(0, "wake"), (1, "wake")]
    assert events[:3] == ([*wakes, (-1, "execute")] if at_start else [(-1, "execute"), *wakes])
    assert sorted(events[3:]) == [(0, "answer"), (1, "answer")]
