"""``SchedulerCore`` in-process, the control messages: shutdown, statistics and queue queries,
cancellation, readiness and the frontends' availability news (the harness of
``test_scheduler_core``)."""

from __future__ import annotations

import pytest

from tests.unit.scheduler_harness import DYNAMIC, Harness, fe
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import (
    CancelRequest,
    Shutdown,
    StatsQuery,
    StatsReply,
    WorkerDied,
    WorkerReady,
)
from triton_mp.scheduler.lifecycle import STOPPING_MESSAGE


@pytest.fixture
def h() -> Harness:
    return Harness()


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
