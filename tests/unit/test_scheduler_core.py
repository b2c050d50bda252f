"""``SchedulerCore`` in-process: messages in, outbound items out, routed by a recording
harness as the process shell routes them. No shared memory: the requests carry dummy
TensorRefs that nothing ever maps."""

from __future__ import annotations

import msgspec
import pytest

from tests.unit.scheduler_harness import DYNAMIC, US, Harness, fe, model_spec, tensor
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.memory.ring import RecordTooLarge
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BatchDone,
    CancelRequest,
    DecoupledDone,
    QueueQuery,
    QueueReply,
    ReplyTo,
    Requester,
    RequestFailed,
    SequenceFlags,
    Shutdown,
    StatsQuery,
    StatsReply,
    WorkerDied,
    WorkerReady,
)
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    ModelVersionSpec,
    QueuePolicySpec,
    SequenceSpec,
)
from triton_mp.scheduler.core import QUEUE_FULL_MESSAGE, TIMEOUT_MESSAGE
from triton_mp.scheduler.lifecycle import STOPPING_MESSAGE
from triton_mp.scheduler.rules.admission import queue_start_ns


@pytest.fixture
def h() -> Harness:
    return Harness()


# --------------------------------------------------------------------------- dispatch


def test_requests_wait_until_a_worker_is_ready(h: Harness) -> None:
    req = h.request("plain")
    assert h.dispatch() == []
    assert h.core.next_deadline_ns() is None
    assert not h.core.idle()
    h.ready(2)
    ((instance, batch),) = h.dispatch()
    assert instance == 2
    assert batch.requests == (req,)
    assert batch.dispatch_ns == h.now


def test_a_batch_goes_to_an_instance_of_the_requests_model(h: Harness) -> None:
    h.ready(0, 1, 2, 3)
    plain = h.request("plain")
    dyn = [h.request("add_sub") for _ in range(4)]  # preferred size 4: goes at once
    sent = h.dispatch()
    assert sorted((i, b.requests) for i, b in sent) == [(0, tuple(dyn)), (2, (plain,))]
    assert len({b.batch_id for _, b in sent}) == 2


def test_dynamic_batching_waits_for_the_delay(h: Harness) -> None:
    h.ready(0)
    first = h.request()
    h.clock.advance_us(30)
    second = h.request(batch_size=2)
    assert h.dispatch() == []
    # NOTE: the delay runs from the oldest request's arrival (its frontend's stamp, 10 µs
    # before the harness hands it over), not from when the scheduler read it.
    due = first.arrival_ns + 100 * US
    assert h.core.next_deadline_ns() == due
    h.clock.advance_us((due - h.now) // US - 1)
    assert h.dispatch() == []
    h.clock.advance_us(1)
    ((instance, batch),) = h.dispatch()
    assert (instance, batch.requests) == (0, (first, second))


def test_a_request_read_after_its_delay_ran_out_goes_at_once(h: Harness) -> None:
    # NOTE: the frontend stamped it 10 µs before the harness hands it over; a scheduler
    # that reads it 100 µs late finds its delay over (Triton's queue starts in-process).
    h.ready(0)
    template = Harness().request()  # NOTE: another core's: only its message is used
    late = msgspec.structs.replace(template, arrival_ns=h.now - 100 * US)
    h.handle(late)
    ((instance, batch),) = h.dispatch()
    assert (instance, batch.requests) == (0, (late,))


def test_the_queue_starts_at_the_arrival_stamp_when_it_is_in_the_past() -> None:
    assert queue_start_ns(900, 1000) == 900
    assert queue_start_ns(1000, 1000) == 1000
    assert queue_start_ns(0, 1000) == 1000  # no stamp
    assert queue_start_ns(1001, 1000) == 1000  # a stamp ahead of this clock


def test_shapes_of_variable_inputs_keep_requests_apart(h: Harness) -> None:
    h.ready(3)
    a = h.request("ragged", width=16)
    h.request("ragged", width=32)
    ((_, batch),) = h.dispatch()  # the shape change closes the first batch at once
    assert batch.requests == (a,)


def test_unknown_model_is_not_found(h: Harness) -> None:
    req = h.request("nope", frontend_id=3)
    ((frontend, failed),) = h.failures()
    assert frontend == 3
    assert failed.request_id == req.request_id
    assert failed.error.code == ErrorCode.NOT_FOUND
    assert "'nope'" in failed.error.message
    assert failed.error.message == "Request for unknown model: 'nope' is not found"
    # a version of a served model that the scheduler no longer has (a change retired it
    # after the frontend resolved it): the frontend's words for a retired version
    h.request("add_sub", version=2)
    error = h.failures()[-1][1].error
    assert (error.code, error.message) == (
        ErrorCode.UNAVAILABLE,
        "Request for unknown model: 'add_sub' version 2 is not at ready state",
    )


# --------------------------------------------------------------------------- batch done


def test_a_bls_request_is_answered_at_its_bls_client_not_at_a_frontend(h: Harness) -> None:
    lost = h.request("nope", reply_to=ReplyTo(Requester.BLS, 0))
    assert h.to_frontends == []
    ((instance_id, failed),) = h.to_bls
    assert instance_id == 0
    assert isinstance(failed, RequestFailed)
    assert failed.request_id == lost.request_id
    assert failed.error.code == ErrorCode.NOT_FOUND


def test_batch_done_records_stats_and_frees_the_instance(h: Harness) -> None:
    h.ready(0)
    reqs = [h.request(batch_size=bs) for bs in (1, 2, 1)]  # 4: a preferred size
    ((_, batch),) = h.dispatch()
    assert batch.requests == tuple(reqs)
    later = h.request()
    assert h.dispatch() == []  # the only instance is busy
    assert h.core.next_deadline_ns() is None

    h.clock.advance_us(50)
    h.done(0, batch)
    st = h.stats("add_sub")
    assert st.inference_count == 4
    assert st.execution_count == 1
    assert st.success.count == 3
    assert st.fail.count == 0
    assert st.queue.count == 3
    assert st.queue.ns == 3 * 10 * US  # each arrived 10 us before dispatch
    assert st.compute_infer.count == 3
    assert st.compute_infer.ns == 3 * 5 * US  # each request is charged the whole batch
    assert list(st.batch_stats) == [4]
    bs4 = st.batch_stats[4]
    assert (bs4.compute_input.count, bs4.compute_input.ns) == (1, 1 * US)
    assert (bs4.compute_infer.count, bs4.compute_infer.ns) == (1, 5 * US)
    assert (bs4.compute_output.count, bs4.compute_output.ns) == (1, 2 * US)

    # idle again: the waiting request goes once its delay has run out
    assert h.core.next_deadline_ns() is not None
    h.clock.advance_us(100)
    ((instance, batch2),) = h.dispatch()
    assert (instance, batch2.requests) == (0, (later,))
    assert batch2.batch_id != batch.batch_id


def test_batch_stats_are_keyed_by_total_batch_size(h: Harness) -> None:
    h.ready(0)
    for sizes in [(4,), (1, 3), (2,)]:
        for bs in sizes:
            h.request(batch_size=bs)
        h.clock.advance_us(100)
        ((_, batch),) = h.dispatch()
        h.done(0, batch)
    st = h.stats("add_sub")
    assert sorted(st.batch_stats) == [2, 4]
    assert st.batch_stats[4].compute_infer.count == 2
    assert st.batch_stats[2].compute_infer.count == 1
    assert (st.execution_count, st.inference_count) == (3, 10)


def test_failed_requests_of_a_batch_count_as_failures(h: Harness) -> None:
    h.ready(0)
    for bs in (1, 2, 1):
        h.request(batch_size=bs)
    ((_, batch),) = h.dispatch()
    h.done(0, batch, failed=(1,))
    st = h.stats("add_sub")
    assert (st.success.count, st.fail.count) == (2, 1)
    assert st.inference_count == 2
    assert st.execution_count == 1
    assert list(st.batch_stats) == [4]


def test_batch_done_for_an_unknown_batch_is_ignored(h: Harness) -> None:
    h.ready(0)
    h.handle(
        BatchDone(
            instance_id=0,
            batch_id=999,
            start_ns=0,
            compute_input_ns=0,
            compute_infer_ns=0,
            compute_output_ns=0,
            end_ns=0,
        )
    )
    assert h.stats("add_sub").execution_count == 0
    assert h.core.idle()


# --------------------------------------------------------------------------- worker died


def test_worker_died_fails_its_in_flight_requests(h: Harness) -> None:
    h.ready(0)
    reqs = [h.request(frontend_id=f) for f in (0, 1, 0, 1)]
    ((_, batch),) = h.dispatch()
    h.handle(WorkerDied(instance_id=0, exitcode=-9))
    failures = h.failures()
    assert [(f, m.request_id) for f, m in failures] == [(r.reply_to.id, r.request_id) for r in reqs]
    for _, m in failures:
        assert m.error.code == ErrorCode.UNAVAILABLE
        assert "'add_sub'" in m.error.message
        assert "exit code -9" in m.error.message
        assert m.error.origin == "scheduler"
    st = h.stats("add_sub")
    assert (st.fail.count, st.success.count, st.execution_count) == (4, 0, 0)
    assert h.core.idle()


def test_a_dead_instance_gets_no_more_batches(h: Harness) -> None:
    h.ready(0)
    h.request()
    h.clock.advance_us(100)
    ((_, batch),) = h.dispatch()
    h.handle(WorkerDied(instance_id=0, exitcode=1))
    waiting = h.request()
    h.clock.advance_us(1000)
    assert h.dispatch() == []
    assert h.core.next_deadline_ns() is None
    # a late BatchDone of the dead instance's batch changes nothing
    h.done(0, batch)
    assert h.dispatch() == []
    assert h.stats("add_sub").execution_count == 0
    # its replacement reports ready and takes the waiting request
    h.ready(0)
    ((instance, batch2),) = h.dispatch()
    assert (instance, batch2.requests) == (0, (waiting,))


def test_an_idle_instance_dying_fails_nothing(h: Harness) -> None:
    h.ready(0, 1)
    h.handle(WorkerDied(instance_id=1, exitcode=0))
    h.handle(WorkerDied(instance_id=42, exitcode=0))  # not ours: ignored
    assert h.failures() == []
    reqs = [h.request() for _ in range(8)]
    sent = h.dispatch()
    assert [(i, b.requests) for i, b in sent] == [(0, tuple(reqs[:4]))]


# --------------------------------------------------------------------------- shutdown / stats


def test_shutdown_fails_queued_requests_with_tritons_message(h: Harness) -> None:
    assert STOPPING_MESSAGE == (
        "Server is stopping, scheduler for model has stopped accepting new inference requests"
    )
    queued = [h.request(), h.request("plain", frontend_id=2)]
    h.handle(Shutdown())
    assert h.core.stopping
    failures = h.failures()
    assert sorted((f, m.request_id) for f, m in failures) == sorted(
        (r.reply_to.id, r.request_id) for r in queued
    )
    for _, m in failures:
        assert (m.error.code, m.error.message) == (ErrorCode.UNAVAILABLE, STOPPING_MESSAGE)
    # and requests that arrive afterwards get the same answer
    late = h.request()
    assert h.failures()[-1][1].request_id == late.request_id
    assert h.failures()[-1][1].error.message == STOPPING_MESSAGE
    h.ready(0, 1, 2)
    assert h.dispatch() == []


def test_shutdown_leaves_in_flight_batches_to_finish(h: Harness) -> None:
    h.ready(0)
    for _ in range(4):
        h.request()
    ((_, batch),) = h.dispatch()
    h.handle(Shutdown())
    assert h.failures() == []
    h.done(0, batch)
    assert h.stats("add_sub").success.count == 4
    assert h.core.idle()


def test_stats_query_gets_a_reply_on_its_frontend(h: Harness) -> None:
    h.ready(0)
    for _ in range(4):
        h.request()
    ((_, batch),) = h.dispatch()
    h.done(0, batch)
    h.handle(StatsQuery(query_id=5, frontend_id=1, model="add_sub"))
    ((frontend, reply),) = [(f, m) for f, m in h.to_frontends if isinstance(m, StatsReply)]
    assert frontend == 1
    assert reply.query_id == 5
    (st,) = reply.stats
    assert (st.name, st.version, st.inference_count, st.execution_count) == ("add_sub", 1, 4, 1)

    h.handle(StatsQuery(query_id=6, frontend_id=0))
    reply_all = h.to_frontends[-1][1]
    assert isinstance(reply_all, StatsReply)
    assert [s.name for s in reply_all.stats] == ["add_sub", "plain", "ragged"]


def test_a_stats_reply_does_not_change_after_it_was_sent(h: Harness) -> None:
    h.handle(StatsQuery(query_id=1, frontend_id=0, model="add_sub"))
    reply = h.to_frontends[-1][1]
    assert isinstance(reply, StatsReply)
    h.ready(0)
    for _ in range(4):
        h.request()
    ((_, batch),) = h.dispatch()
    h.done(0, batch)
    assert reply.stats[0].execution_count == 0


def test_a_cancelled_queued_request_is_dropped_and_answered(h: Harness) -> None:
    from triton_mp.ipc.protocol.messages import CancelRequest

    # No instance is ready yet, so both requests wait in the queue.
    keep = h.request(frontend_id=0)
    gone = h.request(frontend_id=1)
    h.handle(CancelRequest(request_id=gone.request_id, reply_to=fe(1), model="add_sub", version=1))
    ((fid, failed),) = h.failures()
    assert (fid, failed.request_id) == (1, gone.request_id)
    assert failed.error.code == ErrorCode.CANCELLED
    h.ready(0)
    h.clock.advance_us(1000)
    ((_, batch),) = h.dispatch()
    assert [r.request_id for r in batch.requests] == [keep.request_id]


def test_cancelling_a_dispatched_or_unknown_request_changes_nothing(h: Harness) -> None:
    from triton_mp.ipc.protocol.messages import CancelRequest

    h.ready(0)
    req = h.request()
    h.clock.advance_us(1000)
    ((_, batch),) = h.dispatch()
    cancel = CancelRequest(request_id=req.request_id, reply_to=fe(0), model="add_sub", version=1)
    h.handle(cancel)
    # NOTE: the running request's worker hears of it (the model's is_cancelled()).
    assert h.to_workers[-1] == (0, cancel)
    sent = len(h.to_workers)
    h.handle(CancelRequest(request_id=999, reply_to=fe(0), model="nope", version=1))
    assert len(h.to_workers) == sent
    assert h.failures() == []
    assert not h.core.idle()  # the batch still runs; its answer frees the blocks


def test_frontends_learn_when_a_version_gains_or_loses_its_last_live_instance() -> None:
    from triton_mp.ipc.protocol.messages import ModelAvailability

    h = Harness(models=(DYNAMIC,), frontend_ids=(0, 1))

    def availability() -> list[tuple[int, bool]]:
        out = [(f, m.ready) for f, m in h.to_frontends if isinstance(m, ModelAvailability)]
        h.to_frontends.clear()
        return out

    h.handle(WorkerReady(instance_id=0, pid=10))
    assert availability() == [(0, True), (1, True)]
    h.handle(WorkerReady(instance_id=1, pid=11))
    assert availability() == []  # already had a live instance
    h.handle(WorkerDied(instance_id=0, exitcode=-9))
    assert availability() == []  # instance 1 still lives
    h.handle(WorkerDied(instance_id=1, exitcode=-9))
    assert availability() == [(0, False), (1, False)]
    h.handle(WorkerReady(instance_id=1, pid=12))
    assert availability() == [(0, True), (1, True)]


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


# --------------------------------------------------------------------------- decoupled

DECOUPLED = msgspec.structs.replace(
    model_spec("repeat", (4,), max_batch_size=0, batching=BatchingSpec()), decoupled=True
)


@pytest.fixture
def hd() -> Harness:
    return Harness(models=(DYNAMIC, DECOUPLED))


def test_decoupled_instance_is_idle_when_execute_returns(hd: Harness) -> None:
    """The instance takes the next request at BatchDone, while the first is still open."""
    hd.ready(4)
    r1 = hd.request("repeat")
    ((_, b1),) = hd.dispatch()
    r2 = hd.request("repeat")
    assert hd.dispatch() == []
    hd.done(4, b1)
    ((_, b2),) = hd.dispatch()
    assert [r.request_id for r in b2.requests] == [r2.request_id]
    assert hd.stats("repeat").inference_count == 1
    del r1


def test_cancel_of_an_open_decoupled_request_goes_to_its_worker(hd: Harness) -> None:
    hd.ready(4)
    r = hd.request("repeat")
    ((_, b),) = hd.dispatch()
    hd.done(4, b)
    cancel = CancelRequest(request_id=r.request_id, reply_to=fe(0), model="repeat", version=1)
    hd.handle(cancel)
    assert hd.to_workers[-1] == (4, cancel)
    assert hd.failures() == []
    # after the final response, a late cancel goes nowhere
    hd.handle(DecoupledDone(instance_id=4, reply_to=fe(0), request_id=r.request_id))
    n = len(hd.to_workers)
    hd.handle(cancel)
    assert len(hd.to_workers) == n


def test_worker_death_ends_open_decoupled_requests_once(hd: Harness) -> None:
    hd.ready(4)
    r1 = hd.request("repeat")
    ((_, b1),) = hd.dispatch()
    hd.done(4, b1)  # r1: execute returned, responses still coming
    r2 = hd.request("repeat")
    hd.dispatch()  # r2: in execute
    r3 = hd.request("repeat")  # waits in the queue
    hd.handle(WorkerDied(instance_id=4, exitcode=-9))
    failed = {m.request_id: m.error for _, m in hd.failures()}
    assert set(failed) == {r1.request_id, r2.request_id}
    assert failed[r1.request_id].code == ErrorCode.UNAVAILABLE
    assert "before the final response" in failed[r1.request_id].message
    assert "while running the request" in failed[r2.request_id].message
    assert r3.request_id not in failed


def test_a_batch_too_large_for_the_worker_ring_fails_alone(h: Harness) -> None:
    # NOTE: the harness's worker channel refuses batches of 4 requests, as a ring would
    # whose record limit their parameters exceed together.
    def send_worker(instance_id: int, msg: object) -> None:
        if isinstance(msg, BatchAssign) and len(msg.requests) >= 4:
            raise RecordTooLarge("record of 700000 bytes does not fit a ring of 1048576 bytes")
        h.to_workers.append((instance_id, msg))

    h.send_worker = send_worker
    h.ready(0, 1)
    big = [h.request("add_sub") for _ in range(4)]  # preferred size 4: goes at once
    assert h.dispatch() == []
    failed = h.failures()
    assert sorted(m.request_id for _, m in failed) == sorted(r.request_id for r in big)
    assert all(m.error.code == ErrorCode.RESOURCE_EXHAUSTED for _, m in failed)
    assert "too large to hand to its instance" in failed[0][1].error.message
    assert h.stats("add_sub").fail.count == 4
    # The instances are idle again: the next (smaller) batch is served.
    small = [h.request("add_sub") for _ in range(2)]
    h.clock.advance_us(200)
    ((_, batch),) = h.dispatch()
    assert batch.requests == tuple(small)


def test_a_readiness_query_asks_the_live_instances_whose_model_checks_itself() -> None:
    """TritonModel::IsReady asks every instance; only those with is_ready() are asked."""
    from triton_mp.ipc.protocol.ready_messages import ReadyCheck, ReadyFanout, ReadyQuery

    h = Harness(models=(DYNAMIC,), frontend_ids=(0, 1))
    h.handle(WorkerReady(instance_id=0, pid=10, ready_check=True))
    h.handle(WorkerReady(instance_id=1, pid=11))
    h.handle(ReadyQuery(query_id=5, frontend_id=1, model="add_sub", version=1))
    assert h.to_workers[-1] == (0, ReadyCheck(query_id=5, frontend_id=1))
    assert h.to_frontends[-1] == (1, ReadyFanout(query_id=5, instance_ids=(0,)))
    h.handle(WorkerDied(instance_id=0, exitcode=-9))
    h.handle(ReadyQuery(query_id=6, frontend_id=1, model="add_sub", version=1))
    assert h.to_frontends[-1] == (1, ReadyFanout(query_id=6, instance_ids=()))
    h.handle(ReadyQuery(query_id=7, frontend_id=0, model="nope", version=1))
    assert h.to_frontends[-1] == (0, ReadyFanout(query_id=7, instance_ids=()))
