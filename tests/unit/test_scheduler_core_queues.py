"""``SchedulerCore`` in-process, the queue policies: full levels, timeouts, priorities, queue
queries, failure reasons, restarts and a sequence model (the harness of
``test_scheduler_core``)."""

from __future__ import annotations

import pytest

from tests.unit.scheduler_harness import US, Harness, fe, model_spec, tensor
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import (
    CancelRequest,
    QueueQuery,
    QueueReply,
    SequenceFlags,
    WorkerDied,
)
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    ModelVersionSpec,
    QueuePolicySpec,
    SequenceSpec,
)
from triton_mp.scheduler.core import QUEUE_FULL_MESSAGE, TIMEOUT_MESSAGE


@pytest.fixture
def h() -> Harness:
    return Harness()


# --------------------------------------------------------------------------- queue policies

POLICED = model_spec(
    "policed",
    (4,),
    max_batch_size=1,
    batching=BatchingSpec(
        kind="dynamic",
        max_batch_size=1,
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy=QueuePolicySpec(
            default_timeout_us=100, allow_timeout_override=True, max_queue_size=3
        ),
        priority_queue_policy={1: QueuePolicySpec(timeout_action="DELAY", default_timeout_us=50)},
    ),
)


def _policed() -> Harness:
    return Harness(models=(POLICED,))


def test_a_full_level_is_refused_with_tritons_message() -> None:
    h = _policed()
    accepted = [h.request("policed", client_id=f"r{i}") for i in range(5)]
    fails = h.failures()
    assert [m.request_id for _, m in fails] == [accepted[3].request_id, accepted[4].request_id]
    assert {m.error.code for _, m in fails} == {ErrorCode.UNAVAILABLE}
    assert fails[0][1].error.message == "[request id: r3] " + QUEUE_FULL_MESSAGE
    # NOTE: refused at enqueue, as core's PolicyQueue::Enqueue: 2.51 counts it nowhere
    st = h.stats("policed")
    assert (st.fail.count, st.fail_reasons.get("REJECTED", 0)) == (0, 0)
    unnamed = h.request("policed")
    assert h.failures()[-1][1].request_id == unnamed.request_id
    assert h.failures()[-1][1].error.message == "[request id: <id_unknown>] " + QUEUE_FULL_MESSAGE


def test_a_reject_timeout_fails_the_request_when_it_expires_even_with_all_instances_busy() -> None:
    h = _policed()
    short = h.request("policed", timeout_us=20)
    plain = h.request("policed")
    # NOTE: no instance ready: timeouts still wake; a timeout runs from the arrival.
    assert h.core.next_deadline_ns() == short.arrival_ns + 20 * US
    h.clock.advance_us(10)
    h.dispatch()
    assert [(m.request_id, m.error.message) for _, m in h.failures()] == [
        (short.request_id, TIMEOUT_MESSAGE)
    ]
    h.clock.advance_us(80)
    h.dispatch()
    assert [m.request_id for _, m in h.failures()][-1] == plain.request_id
    assert h.stats("policed").fail.count == 2
    (status,) = h.core.queue_status("policed", h.now)
    assert [(lv.level, lv.timed_out) for lv in status.levels] == [(1, 0), (2, 2)]


def test_priority_and_delay_reach_the_batches() -> None:
    h = _policed()
    low = h.request("policed", priority=2)
    high = h.request("policed", priority=1)
    h.clock.advance_us(50)  # level 1's DELAY timeout: still ahead of level 2
    h.ready(4)
    ((_, batch),) = h.dispatch()
    assert batch.requests == (high,)
    assert h.failures() == []
    (status,) = h.core.queue_status("policed", h.now)
    assert [(lv.level, lv.delayed_total) for lv in status.levels] == [(1, 1), (2, 0)]
    h.done(4, batch)
    ((_, batch),) = h.dispatch()
    assert batch.requests == (low,)


def test_queue_query_reports_levels_instances_and_formed_batches(h: Harness) -> None:
    h.ready(0, 1)
    for _ in range(4):
        h.request()  # preferred size 4: a batch at once
    ((inst, batch),) = h.dispatch()
    h.request()
    h.clock.advance_us(30)
    h.handle(QueueQuery(query_id=9, frontend_id=3, model="add_sub"))
    ((fid, reply),) = [(f, m) for f, m in h.to_frontends if isinstance(m, QueueReply)]
    assert (fid, reply.query_id) == (3, 9)
    (st,) = reply.models
    assert (st.model, st.version, st.scheduler, st.max_batch_size) == ("add_sub", 1, "dynamic", 8)
    (level,) = st.levels
    # NOTE: aged from its arrival (the harness's requests arrive 10 µs before they queue)
    assert (level.level, level.depth, level.oldest_age_us) == (0, 1, 40)
    busy = {i.instance_id: i for i in st.instances}
    assert busy[inst].batches_in_flight == 1
    assert busy[inst].batch_size_in_flight == 4
    assert busy[1 - inst].batches_in_flight == 0
    assert all(i.live for i in st.instances)
    assert st.batch_sizes == {4: 1}
    assert st.close_reasons == {"preferred": 1}
    ((rec),) = st.recent_batches
    assert (rec.batch_size, rec.requests, rec.reason, rec.age_us) == (4, 4, "preferred", 30)
    h.done(inst, batch)
    h.handle(QueueQuery(query_id=10, frontend_id=3))
    reply = [m for _, m in h.to_frontends if isinstance(m, QueueReply)][-1]
    assert [m.model for m in reply.models] == ["add_sub", "plain", "ragged"]
    assert {i.instance_id: i.executions for i in reply.models[0].instances}[inst] == 1


def test_failures_are_counted_per_metric_reason() -> None:
    h = _policed()
    for i in range(4):
        h.request("policed", client_id=f"r{i}")  # the 4th: queue full, counted nowhere
    h.clock.advance_us(100)  # the 3 queued time out -> REJECTED
    h.dispatch()
    h.ready(4)
    cancelled = h.request("policed")
    h.handle(
        CancelRequest(request_id=cancelled.request_id, reply_to=fe(0), model="policed", version=1)
    )
    h.request("policed")
    ((_, batch),) = h.dispatch()
    h.done(4, batch, failed=(0,))  # the model's error -> BACKEND
    h.request("policed")
    ((_, batch),) = h.dispatch()
    h.handle(WorkerDied(instance_id=4, exitcode=-9))  # -> OTHER
    st = h.stats("policed")
    # NOTE: 2.51 counts a full queue's refusal neither in ``fail`` nor in any reason (core
    # PolicyQueue::Enqueue refuses it before it is queued; tests/e2e/test_metrics.py).
    assert st.fail_reasons == {"REJECTED": 3, "CANCELED": 1, "BACKEND": 1, "OTHER": 1}
    assert st.fail.count == 6


def test_an_instance_that_comes_back_after_dying_counts_a_restart(h: Harness) -> None:
    h.ready(0, 1)
    h.handle(WorkerDied(instance_id=0, exitcode=-9))
    (st,) = h.core.queue_status("add_sub", h.now)
    assert [(i.instance_id, i.live, i.restarts) for i in st.instances] == [
        (0, False, 0),
        (1, True, 0),
    ]
    h.ready(0)
    (st,) = h.core.queue_status("add_sub", h.now)
    assert [(i.instance_id, i.live, i.restarts) for i in st.instances] == [
        (0, True, 1),
        (1, True, 0),
    ]


SEQ = ModelVersionSpec(
    model="acc",
    version=1,
    backend="onnxruntime",
    model_file="/models/acc/1/model.onnx",
    max_batch_size=4,
    batching=BatchingSpec(kind="sequence", max_batch_size=4),
    inputs=(tensor("INPUT0", (16,)), tensor("INPUT1", (16,))),
    outputs=(tensor("OUTPUT0", (16,)),),
    instance_ids=(5,),
    instance_names=("acc_0",),
    sequence=SequenceSpec(strategy="direct", max_sequence_idle_us=1000),
)


def test_a_sequence_model_routes_by_correlation_id_and_reports_rows() -> None:
    h = Harness(models=(SEQ,))
    h.ready(5)
    a = h.request("acc", sequence_id=11, sequence_flags=SequenceFlags.START)
    b = h.request("acc", sequence_id="b", sequence_flags=SequenceFlags.START)
    ((inst, batch),) = h.dispatch()
    assert (inst, batch.requests, batch.rows, batch.slots) == (5, (a, b), 2, (0, 1))
    lost = h.request("acc", sequence_id=99, client_id="q")
    ((_, failed),) = h.failures()
    assert failed.request_id == lost.request_id
    assert failed.error.code == ErrorCode.INVALID_ARG
    assert failed.error.message == (
        "inference request for sequence 99 to model 'acc' must specify the "
        "START flag on the first request of the sequence"
    )
    h.done(5, batch)
    h.clock.advance_us(1000)  # both sequences idle: released, and the next batch says so
    h.dispatch()
    c = h.request("acc", sequence_id=12, sequence_flags=SequenceFlags.START)
    ((_, batch),) = h.dispatch()
    assert batch.requests == (c,)
    assert set(batch.released) == {11, "b"}
