"""A sequence is over for new requests once its END request is queued (core
``SequenceBatchScheduler::Enqueue`` drops the correlation ID from its slot and backlog maps
when it queues the END), though its slot stays bound until the END is handed out."""

from __future__ import annotations

from tests.unit.test_sequence_batcher import END, START, _corrids, direct, oldest
from triton_mp.common.errors import ErrorCode
from triton_mp.scheduler.policies.policy import Queued, Rejection

REFUSAL = (
    "inference request for sequence {} to model 'acc' must specify the START flag on the "
    "first request of the sequence"
)


def test_a_request_without_start_behind_a_queued_end_is_refused() -> None:
    f = direct()
    f.send("a", START)
    f.pop()  # START runs; the END waits in the slot
    f.send("a", END)
    r = f.send("a")
    assert isinstance(r, Rejection)
    assert (r.code, r.message) == (ErrorCode.INVALID_ARG, REFUSAL.format("a"))
    assert f.sched.queue_depth() == 1


def test_a_start_behind_a_queued_end_begins_the_next_sequence_after_it() -> None:
    f = oldest(mbs=1)
    f.send(5, START)
    f.pop()
    f.send(5, END)
    assert isinstance(f.send(5, START), Queued)
    assert isinstance(f.send(5), Queued)  # the new sequence is live
    order = []
    for _ in range(3):
        f.done(0)
        (batch,) = f.pop()
        order += [(q.corrid, q.starts, q.ends) for q in batch.requests]
    assert order == [(5, False, True), (5, True, False), (5, False, False)]


def test_a_backlogged_sequence_whose_end_is_queued_takes_no_more_requests() -> None:
    f = direct(mbs=1)
    f.send("a", START)
    f.send("b", START)  # backlog: a holds the only slot
    f.send("b", END)
    r = f.send("b")
    assert isinstance(r, Rejection)
    assert r.message == REFUSAL.format("b")
    f.pop()
    f.send("a", END)
    f.done(0)
    (batch,) = f.pop()
    assert _corrids(batch) == ["a"]
    f.done(0)
    (batch,) = f.pop()
    assert [(q.corrid, q.starts) for q in batch.requests] == [("b", True)]
    f.done(0)
    (batch,) = f.pop()
    assert [(q.corrid, q.ends) for q in batch.requests] == [("b", True)]
    f.done(0)
    assert f.pop() == []
    assert isinstance(f.send("b"), Rejection)
