"""``SchedulerCore`` in-process: messages in, outbound items out, routed by a recording
harness as the process shell routes them. No shared memory: the requests carry dummy
TensorRefs that nothing ever maps."""

from __future__ import annotations

from itertools import count

import msgspec
import pytest
from msgspec.structs import replace

from tests.unit.scheduler_harness import US, Harness
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.memory.ring import RecordTooLarge
from triton_mp.ipc.protocol.messages import (
    QUEUED_ORIGIN,
    BatchAssign,
    BatchDone,
    ModelAvailability,
    ReplyTo,
    Requester,
    RequestFailed,
    StatsQuery,
    StatsReply,
    ToScheduler,
    WorkerDied,
)
from triton_mp.ipc.recordio.codec import Decoder
from triton_mp.ipc.recordio.records import RequestRecord, encode_request
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
        assert m.error.origin == QUEUED_ORIGIN  # NOTE: answered in the response, as Triton
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


# --------------------------------------------------------------------------- one drain


def _drain(h: Harness, first: BatchAssign) -> list[object]:
    """One drain's messages as the rings give them: request records (one for a model
    nobody serves), the first batch's ``BatchDone``, a statistics query, a worker's death."""
    decode = Decoder(ToScheduler).decode_buffer
    maker = Harness(ids=count(100))  # NOTE: builds the requests; its own core is not used
    reqs = [maker.request(m) for m in ("add_sub", "add_sub", "nope", "add_sub")]
    records: list[object] = [
        decode(memoryview(encode_request(replace(r, arrival_ns=h.now)) or b"")) for r in reqs
    ]
    done = BatchDone(
        instance_id=0, batch_id=first.batch_id, start_ns=h.now, compute_input_ns=1,
        compute_infer_ns=1, compute_output_ns=1, end_ns=h.now,
    )  # fmt: skip
    return [*records[:2], done, records[2], StatsQuery(query_id=1, frontend_id=0), *records[3:]]


def _no_wall_clock(msg: object) -> object:
    """A ``StatsReply`` without its wall-clock field (``last_inference_ms``)."""
    if not isinstance(msg, StatsReply):
        return msg
    return replace(msg, stats=tuple(replace(s, last_inference_ms=0) for s in msg.stats))


def test_a_drain_handled_at_once_sends_what_each_message_in_turn_sends() -> None:
    outcomes = []
    for at_once in (False, True):
        h = Harness()
        h.ready(0, 1)
        h.request()
        h.clock.advance_us(600)
        ((_, first),) = h.dispatch()
        msgs = _drain(h, first)
        assert sum(type(m) is RequestRecord for m in msgs) == 4
        if at_once:
            h.deliver(list(h.core.handle_all(msgs, h.now)))
        else:
            for m in msgs:
                h.handle(m)
        h.handle(WorkerDied(instance_id=1, exitcode=-9))
        h.clock.advance_us(600)
        sent = [(f, _no_wall_clock(m)) for f, m in h.to_frontends]
        outcomes.append((sent, h.to_workers, h.dispatch(), h.core.idle()))
    assert outcomes[0] == outcomes[1]
    to_frontends = outcomes[1][0]
    assert [type(m) for _, m in to_frontends] == [ModelAvailability, RequestFailed, StatsReply]
