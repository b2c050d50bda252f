"""The sequence batcher (``scheduler.policies.sequence``) with a FakeClock: Direct and Oldest
strategies, slots, backlog, idle release and the error cases, rule by rule, then properties
over random interleavings of sequences."""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import given, settings

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import SequenceFlags
from triton_mp.scheduler.policies.clock import FakeClock
from triton_mp.scheduler.policies.policy import Batch, Queued, Rejection
from triton_mp.scheduler.policies.sequence import SequenceBatcher

US = 1000
START, END = SequenceFlags.START, SequenceFlags.END


@dataclass
class Feed:
    sched: SequenceBatcher
    clock: FakeClock = field(default_factory=FakeClock)
    keys: itertools.count[int] = field(default_factory=itertools.count)

    def send(
        self, corrid: Hashable, flags: int = 0, *, batch_size: int = 1, timeout_us: int = 0
    ) -> Rejection | Queued:
        now = self.clock.now_ns()
        item = Queued(
            next(self.keys),
            batch_size,
            (),
            now,
            corrid=corrid,
            starts=bool(flags & START),
            ends=bool(flags & END),
            timeout_us=timeout_us,
        )
        rejection = self.sched.offer(item, now)
        return item if rejection is None else rejection

    def pop(self) -> list[Batch]:
        return self.sched.pop_ready(self.clock.now_ns())

    def done(self, *instances: int) -> None:
        for i in instances:
            self.sched.instance_idle(i, self.clock.now_ns())


def direct(
    mbs: int = 4, instances: tuple[int, ...] = (0,), idle_us: int = 1000, **kw: object
) -> Feed:
    f = Feed(
        SequenceBatcher(
            "acc",
            "direct",
            mbs,
            instances,
            max_sequence_idle_us=idle_us,
            **kw,  # type: ignore[arg-type]
        )
    )
    f.done(*instances)
    return f


def oldest(
    mbs: int = 4, instances: tuple[int, ...] = (0,), idle_us: int = 1000, **kw: object
) -> Feed:
    f = Feed(
        SequenceBatcher(
            "acc",
            "oldest",
            mbs,
            instances,
            max_sequence_idle_us=idle_us,
            **kw,  # type: ignore[arg-type]
        )
    )
    f.done(*instances)
    return f


def _corrids(batch: Batch) -> list[Hashable]:
    return [q.corrid for q in batch.requests]


# --------------------------------------------------------------------------- errors


def test_a_request_without_start_for_an_unknown_sequence_is_refused() -> None:
    f = direct()
    r = f.send(7)
    assert isinstance(r, Rejection)
    assert r.code == ErrorCode.INVALID_ARG
    assert r.message == (
        "inference request for sequence 7 to model 'acc' must specify the START flag on the "
        "first request of the sequence"
    )


def test_batch_size_above_one_zero_ids_and_long_string_ids_are_refused() -> None:
    f = direct()
    big = f.send(1, START, batch_size=2)
    assert isinstance(big, Rejection)
    assert "must specify batch-size 1 due to requirements of sequence batcher" in big.message
    for zero in (0, ""):
        r = f.send(zero, START)
        assert isinstance(r, Rejection)
        assert "must specify a non-zero or non-empty correlation ID" in r.message
    long = f.send("x" * 129, START)
    assert isinstance(long, Rejection)
    assert long.message == "string correlation ID cannot be longer than 128 characters"
    assert isinstance(f.send("x" * 128, START), Queued)


def test_a_corrid_control_fixes_the_type_of_correlation_ids() -> None:
    f = Feed(SequenceBatcher("acc", "direct", 4, (0,), corrid_kind=str))
    r = f.send(5, START)
    assert isinstance(r, Rejection)
    assert r.message == (
        "sequence batching control 'CORRID' data-type is 'UINT64', but model 'acc' expects 'BYTES'"
    )
    assert isinstance(f.send("five", START), Queued)
    g = Feed(SequenceBatcher("acc", "direct", 4, (0,), corrid_kind=int))
    r = g.send("five", START)
    assert isinstance(r, Rejection)
    assert "data-type is 'BYTES', but model 'acc' expects 'UINT64'" in r.message


# --------------------------------------------------------------------------- Direct


def test_direct_each_sequence_keeps_its_slot_and_empty_slots_are_null_rows() -> None:
    f = direct(mbs=4)
    for corrid in ("a", "b", "c"):
        f.send(corrid, START)
    (batch,) = f.pop()
    assert (_corrids(batch), batch.rows, batch.slots) == (["a", "b", "c"], 3, (0, 1, 2))
    f.send("b", END)
    f.done(0)
    (batch,) = f.pop()
    assert (_corrids(batch), batch.slots) == (["b"], (1,))
    # b ended: slot 1 is free; a and c keep slots 0 and 2, slot 1 is a null row
    f.send("a")
    f.send("c")
    f.done(0)
    (batch,) = f.pop()
    assert (_corrids(batch), batch.rows, batch.slots) == (["a", "c"], 3, (0, 2))
    # a new sequence takes the free slot 1
    f.send("d", START)
    f.send("c")
    f.done(0)
    (batch,) = f.pop()
    assert (_corrids(batch), batch.slots) == (["d", "c"], (1, 2))


def test_direct_one_request_per_slot_per_batch_in_order() -> None:
    f = direct(mbs=2)
    first = f.send("a", START)
    second = f.send("a")
    (batch,) = f.pop()
    assert batch.requests == (first,)
    f.done(0)
    (batch,) = f.pop()
    assert batch.requests == (second,)


def test_direct_sequences_spread_over_instances_and_stay_there() -> None:
    f = direct(mbs=2, instances=(0, 1))
    f.send("a", START)
    f.send("b", START)
    f.send("c", START)
    batches = {b.instance_id: b for b in f.pop()}
    assert {i: _corrids(b) for i, b in batches.items()} == {0: ["a", "c"], 1: ["b"]}
    assert batches[0].slots == (0, 1)
    for _ in range(3):
        f.send("a")
        f.send("b")
        f.done(0, 1)
        got = {b.instance_id: _corrids(b) for b in f.pop()}
        assert got == {0: ["a"], 1: ["b"]}


def test_direct_without_a_free_slot_new_sequences_wait_in_fifo_order() -> None:
    f = direct(mbs=1)
    f.send("a", START)
    f.send("b", START)  # backlog
    f.send("c", START)  # backlog
    f.send("b")  # joins b's backlog
    assert f.sched.queue_depth() == 4
    (batch,) = f.pop()
    assert _corrids(batch) == ["a"]
    f.send("a", END)
    f.done(0)
    (batch,) = f.pop()
    assert _corrids(batch) == ["a"]  # the END: the slot goes to b
    f.done(0)
    (batch,) = f.pop()
    assert [(q.corrid, q.starts) for q in batch.requests] == [("b", True)]
    f.done(0)
    (batch,) = f.pop()
    assert [(q.corrid, q.starts) for q in batch.requests] == [("b", False)]


def test_direct_start_for_a_live_sequence_continues_in_its_slot() -> None:
    f = direct(mbs=2)
    f.send("a", START)
    f.send("b", START)
    f.pop()
    f.send("a", START)
    f.done(0)
    (batch,) = f.pop()
    assert (_corrids(batch), batch.slots) == (["a"], (0,))


def test_direct_minimum_slot_utilization_waits_up_to_the_delay() -> None:
    f = direct(mbs=4, max_queue_delay_us=100, minimum_slot_utilization=0.5)
    t0 = f.clock.now_ns()
    f.send("a", START)
    assert f.pop() == []
    assert f.sched.next_deadline_ns() == t0 + 100 * US
    f.send("b", START)  # 2 of 4 slots ready: utilization reached
    (batch,) = f.pop()
    assert (_corrids(batch), batch.reason) == (["a", "b"], "idle")
    f.send("a")
    f.done(0)
    assert f.pop() == []
    f.clock.advance_us(100)
    (batch,) = f.pop()
    assert (_corrids(batch), batch.reason) == (["a"], "delay")


def test_idle_sequences_are_released_and_their_ids_reach_the_instance() -> None:
    f = direct(mbs=2, idle_us=500)
    t0 = f.clock.now_ns()
    f.send("a", START)
    f.send("b", START)
    f.pop()
    f.done(0)
    assert f.sched.next_deadline_ns() == t0 + 500 * US
    f.clock.advance_us(300)
    f.send("b")  # b stays active
    (batch,) = f.pop()
    f.done(0)
    f.clock.advance_us(200)
    assert f.sched.expire(f.clock.now_ns()) == []
    # a is released: a request without START now fails, the next batch says so
    r = f.send("a")
    assert isinstance(r, Rejection)
    assert "must specify the START flag" in r.message
    f.send("c", START)
    (batch,) = f.pop()
    assert batch.released == ("a",)
    assert (_corrids(batch), batch.slots) == (["c"], (0,))


def test_a_backlogged_sequence_whose_timeout_runs_out_fails_whole() -> None:
    f = direct(mbs=1)
    f.send("a", START)
    f.send("b", START, timeout_us=100)
    f.send("b")
    f.pop()
    f.clock.advance_us(100)
    failed = f.sched.expire(f.clock.now_ns())
    assert [(q.corrid, why.code) for q, why in failed] == [
        ("b", ErrorCode.UNAVAILABLE),
        ("b", ErrorCode.UNAVAILABLE),
    ]
    assert failed[0][1].message == "timeout of the corresponding sequence has been expired"
    assert isinstance(f.send("b"), Rejection)


def test_a_dead_instance_loses_its_sequences() -> None:
    f = direct(mbs=2, instances=(0, 1))
    f.send("a", START)
    f.send("b", START)
    f.pop()
    f.send("a")
    f.sched.instance_gone(0)
    failed = f.sched.expire(f.clock.now_ns())
    assert [(q.corrid, why.code, why.reason) for q, why in failed] == [
        ("a", ErrorCode.UNAVAILABLE, "OTHER")
    ]
    assert "was lost" in failed[0][1].message
    assert isinstance(f.send("a"), Rejection)
    # new sequences go to the live instance only
    f.send("c", START)
    f.done(1)
    (batch,) = f.pop()
    assert (batch.instance_id, _corrids(batch)) == (1, ["c"])


def test_sequences_wait_for_an_instance_to_become_live() -> None:
    f = Feed(SequenceBatcher("acc", "direct", 2, (0,)))
    f.send("a", START)
    assert f.pop() == []
    f.done(0)
    (batch,) = f.pop()
    assert _corrids(batch) == ["a"]


def test_cancel_and_drain_find_requests_in_slots_and_backlog() -> None:
    f = direct(mbs=1)
    a = f.send("a", START)
    b = f.send("b", START)
    assert isinstance(a, Queued)
    assert isinstance(b, Queued)
    assert f.sched.cancel(b.key) is b
    assert f.sched.queue_depth() == 1
    assert f.sched.drain_queue() == [a]


def test_a_cancelled_backlogged_start_leaves_no_empty_backlog_entry() -> None:
    """r23 (session 18): a backlogged START cancelled by its client's deadline left an empty
    backlog queue; the next ``expire`` read its first item and the scheduler died."""
    f = direct(mbs=1)
    f.send("a", START)
    b = f.send("b", START, timeout_us=100)
    assert isinstance(b, Queued)
    f.pop()
    assert f.sched.cancel(b.key) is b
    f.clock.advance_us(200)
    assert f.sched.next_deadline_ns() is None or f.sched.next_deadline_ns() >= 0
    assert f.sched.expire(f.clock.now_ns()) == []
    assert f.sched.queue_depth() == 0
    # the sequence never started: a later request of it needs START, and one is served
    assert isinstance(f.send("b"), Rejection)
    f.send("a", END)
    f.send("c", START)
    f.done(0)
    batches = f.pop()
    assert [c for batch in batches for c in _corrids(batch)] == ["a"]
    f.done(0)
    (batch,) = f.pop()
    assert _corrids(batch) == ["c"]


def test_a_cancelled_request_ends_its_sequence_and_fails_the_ones_behind_it() -> None:
    """Triton's request_cancellation.md: "If a request is cancelled when using
    sequence_batching, then all the pending requests in the same sequence will also be
    cancelled" (2.51: CANCELLED with no message; the sequence's next request needs START)."""
    f = direct(mbs=1, idle_us=10_000)
    f.send("a", START)
    (b,) = f.pop()  # a's START runs
    step = f.send("a")
    behind = [f.send("a"), f.send("a", END)]
    f.send("b", START)  # backlogged: one slot
    assert isinstance(step, Queued)
    assert f.sched.cancel(step.key) is step
    assert f.sched.next_deadline_ns() == 0
    failed = f.sched.expire(f.clock.now_ns())
    assert [q for q, _ in failed] == behind
    assert {(why.code, why.message, why.reason, why.prefixed) for _, why in failed} == {
        (ErrorCode.CANCELLED, "", "CANCELED", False)
    }
    assert isinstance(f.send("a"), Rejection)  # over: START needed
    f.done(0)
    (b,) = f.pop()  # the slot went to b; the instance drops a's state
    assert (_corrids(b), b.released) == (["b"], ("a",))
    assert f.sched.queue_depth() == 0


def test_a_cancelled_request_behind_queued_ones_ends_its_sequence_after_them() -> None:
    f = direct(mbs=1, idle_us=10_000)
    f.send("a", START)
    f.pop()
    ahead = f.send("a")
    cancelled = f.send("a")
    assert isinstance(cancelled, Queued)
    assert f.sched.cancel(cancelled.key) is cancelled
    assert f.sched.expire(f.clock.now_ns()) == []
    assert isinstance(f.send("a"), Rejection)  # ending: no new request joins it
    f.send("b", START)
    f.done(0)
    (b,) = f.pop()
    assert b.requests == (ahead,)  # the request ahead still runs, then the slot is freed
    f.done(0)
    (b,) = f.pop()
    assert (_corrids(b), b.released) == (["b"], ("a",))
    # a START for an ending sequence restarts it in its slot instead
    f.send("b")
    c = f.send("b")
    assert isinstance(c, Queued)
    f.sched.cancel(c.key)
    f.send("b", START)
    f.done(0)
    assert [_corrids(x) for x in f.pop()] == [["b"]]
    f.done(0)
    (b,) = f.pop()
    assert _corrids(b) == ["b"]
    assert f.sched.holds(0)


def test_a_cancelled_request_of_a_backlogged_sequence_drops_the_whole_sequence() -> None:
    f = direct(mbs=1, idle_us=10_000)
    f.send("a", START)
    start = f.send("b", START)
    later = f.send("b")
    assert isinstance(start, Queued)
    assert f.sched.cancel(start.key) is start
    failed = f.sched.expire(f.clock.now_ns())
    assert [(q, why.code) for q, why in failed] == [(later, ErrorCode.CANCELLED)]
    assert f.sched.queue_depth() == 1  # a's START only
    assert isinstance(f.send("b"), Rejection)


# --------------------------------------------------------------------------- Oldest


def test_oldest_batches_the_oldest_heads_one_per_sequence() -> None:
    f = oldest(mbs=2, max_candidate_sequences=4)
    f.send("a", START)
    f.clock.advance_us(1)
    f.send("a")
    f.clock.advance_us(1)
    f.send("b", START)
    f.clock.advance_us(1)
    f.send("c", START)
    (batch,) = f.pop()
    assert (_corrids(batch), batch.rows) == (["a", "b"], 0)
    f.done(0)
    (batch,) = f.pop()
    assert _corrids(batch) == ["a", "c"]


def test_oldest_waits_for_a_preferred_size_up_to_the_delay() -> None:
    f = oldest(mbs=4, max_candidate_sequences=4, preferred_batch_sizes=(2,), max_queue_delay_us=100)
    f.send("a", START)
    assert f.pop() == []
    f.send("b", START)
    (batch,) = f.pop()
    assert (_corrids(batch), batch.reason) == (["a", "b"], "preferred")
    f.done(0)
    f.send("a")
    assert f.pop() == []
    f.clock.advance_us(100)
    (batch,) = f.pop()
    assert (_corrids(batch), batch.reason) == (["a"], "delay")


def test_oldest_without_batching_runs_the_oldest_request_alone() -> None:
    f = oldest(mbs=0, max_candidate_sequences=3)
    f.send("a", START)
    f.clock.advance_us(1)
    f.send("b", START)
    (batch,) = f.pop()
    assert (_corrids(batch), batch.reason) == (["a"], "single")
    f.done(0)
    (batch,) = f.pop()
    assert _corrids(batch) == ["b"]


def test_oldest_candidate_sequences_bound_the_live_sequences_per_instance() -> None:
    f = oldest(mbs=4, max_candidate_sequences=2)
    for c in "abc":
        f.send(c, START)
    (batch,) = f.pop()
    assert _corrids(batch) == ["a", "b"]
    (level,) = f.sched.levels()
    assert (level.depth, level.delayed) == (1, 1)  # c waits in the backlog


# --------------------------------------------------------------------------- properties


@settings(max_examples=200, deadline=None)
@given(
    strategy=st.sampled_from(["direct", "oldest"]),
    mbs=st.integers(0, 3),
    n_instances=st.integers(1, 2),
    ops=st.lists(
        st.tuples(st.sampled_from(["send", "end", "tick", "done"]), st.integers(0, 5)),
        max_size=80,
    ),
)
def test_random_interleavings_keep_each_sequence_on_its_instance_in_order(
    strategy: str, mbs: int, n_instances: int, ops: list[tuple[str, int]]
) -> None:
    instances = tuple(range(n_instances))
    kw = {"max_candidate_sequences": 2} if strategy == "oldest" else {}
    f = (direct if strategy == "direct" else oldest)(mbs, instances, idle_us=10_000, **kw)
    live: dict[int, bool] = {}
    sent: dict[int, list[int]] = {}
    outcome: dict[int, str] = {}
    where: dict[Hashable, int] = {}
    ran: dict[Hashable, list[int]] = {}
    busy: set[int] = set()
    slots = max(1, mbs) if strategy == "direct" else 2

    def pop() -> None:
        for batch in f.pop():
            assert batch.instance_id not in busy
            busy.add(batch.instance_id)
            corrids = _corrids(batch)
            assert len(corrids) == len(set(corrids)), "two requests of a sequence in a batch"
            if strategy == "direct":
                assert batch.rows <= slots
                assert len(batch.slots) == len(batch.requests)
            else:
                assert len(batch.requests) <= max(1, mbs)
            for q in batch.requests:
                outcome[q.key] = "ran"
                if q.starts:
                    where[q.corrid] = batch.instance_id
                assert where[q.corrid] == batch.instance_id, "a sequence changed instance"
                ran.setdefault(q.corrid, []).append(q.key)

    for op, n in ops:
        seq = n % 4 + 1
        if op in ("send", "end"):
            flags = (0 if live.get(seq) else START) | (END if op == "end" else 0)
            r = f.send(seq, flags)
            assert isinstance(r, Queued), r
            sent.setdefault(seq, []).append(r.key)
            live[seq] = op != "end"
        elif op == "tick":
            f.clock.advance_us(n * 10)
            for item, _ in f.sched.expire(f.clock.now_ns()):
                outcome[item.key] = "failed"
        elif op == "done" and busy:
            i = sorted(busy)[n % len(busy)]
            busy.discard(i)
            f.done(i)
        pop()
    for _ in range(200):
        for i in sorted(busy):
            busy.discard(i)
            f.done(i)
        pop()
        # sequences that never end hold their slots until they are idle long enough
        f.clock.advance_us(10_000)
        for item, _ in f.sched.expire(f.clock.now_ns()):
            outcome[item.key] = "failed"
        pop()
        if f.sched.queue_depth() == 0:
            break
    assert f.sched.queue_depth() == 0
    every = sorted(k for keys in sent.values() for k in keys)
    assert sorted(outcome) == every
    for seq, keys in ran.items():
        assert keys == sorted(keys), f"sequence {seq} ran out of order"


def test_invalid_sequence_requests_are_counted_in_no_statistic() -> None:
    """2.51 counts the sequence batcher's enqueue refusals nowhere (reason None):
    tests/e2e/test_r12_sequence_stats.py compares with the real Triton."""
    f = direct()
    for r in (f.send(7), f.send(0, START), f.send(1, START, batch_size=2)):
        assert isinstance(r, Rejection)
        assert r.reason is None


# --------------------------------------------------------------------------- iterative


def test_iterative_a_rescheduled_request_runs_first_in_its_slot_and_is_never_idle() -> None:
    """core IterativeSequencer: the slot stays bound while the request runs, longer than
    max_sequence_idle_microseconds; RESCHEDULE queues it first (no flags), ahead of a
    request of the same sequence that arrived meanwhile; a release without it ends the
    sequence, the next batch names it in ``released`` and the backlog takes the slot."""
    f = direct(mbs=0, idle_us=100, iterative=True)
    assert [f.sched.new_sequence_id() for _ in range(2)] == [1, 2]
    first = f.send(7, START)
    assert isinstance(first, Queued)
    (batch,) = f.pop()
    assert batch.requests == (first,)
    f.clock.advance_us(1000)
    assert f.sched.expire(f.clock.now_ns()) == []
    assert f.sched.next_deadline_ns() is None
    later = f.send(7)
    waiting = f.send(8, START)  # backlogged: the only slot is taken
    assert isinstance(later, Queued)
    assert isinstance(waiting, Queued)
    again = Queued(first.key, 1, (), f.clock.now_ns(), corrid=7)
    assert f.sched.reschedule(again, f.clock.now_ns()) is None
    f.done(0)
    (batch,) = f.pop()
    assert batch.requests == (again,)
    f.sched.finish(7, f.clock.now_ns())  # ``later`` is still queued: the sequence goes on
    f.done(0)
    (batch,) = f.pop()
    assert batch.requests == (later,)
    f.sched.finish(7, f.clock.now_ns())
    f.done(0)
    (batch,) = f.pop()
    assert (batch.requests, batch.released) == ((waiting,), (7,))


def test_iterative_a_reschedule_for_a_lost_sequence_starts_it_again() -> None:
    f = direct(mbs=0, instances=(0, 1), iterative=True)
    f.send(3, START)
    (batch,) = f.pop()
    f.sched.instance_gone(batch.instance_id)
    again = Queued(99, 1, (), f.clock.now_ns(), corrid=3)
    assert f.sched.reschedule(again, f.clock.now_ns()) is None
    (batch,) = f.pop()
    assert batch.requests[0].key == 99
    assert batch.requests[0].starts


# --------------------------------------------------------------------------- regroup


def test_a_leaving_instance_keeps_its_live_sequences_and_takes_no_new_one() -> None:
    """Core ``SequenceBatchScheduler::Update``: a removed instance's slots wait in
    ``pending_removal_seq_slots_`` until their sequences end."""
    f = oldest(mbs=2, instances=(0, 1))
    f.send(11, START)
    f.send(12, START)
    first = f.pop()
    assert sorted((b.instance_id, _corrids(b)[0]) for b in first) == [(0, 11), (1, 12)]
    f.done(0, 1)
    f.sched.regroup((), (0,))
    assert f.sched.holds(0)
    f.send(11)
    f.send(13, START)  # a new sequence: instance 1 only
    batches = f.pop()
    assert sorted((b.instance_id, _corrids(b)) for b in batches) == [(0, [11]), (1, [13])]
    f.done(0, 1)
    f.send(11, END)
    ((b,),) = [f.pop()]
    assert (b.instance_id, _corrids(b)) == (0, [11])
    assert not f.sched.holds(0)
    f.done(0)
    f.send(14, START)  # instance 0's free slots are not used again; 12 and 13 hold 1's
    assert f.pop() == []
    assert f.sched.queue_depth() == 1
    f.send(12, END)
    (b,) = f.pop()
    assert (b.instance_id, _corrids(b)) == (1, [12])  # 12's slot then goes to 14
    f.done(1)
    (b,) = f.pop()
    assert (b.instance_id, _corrids(b)) == (1, [14])


def test_an_added_instance_gets_slots_and_new_sequences() -> None:
    f = direct(mbs=1, instances=(0,))
    f.send(1, START)
    f.send(2, START)  # backlogged: one slot only
    (b,) = f.pop()
    assert _corrids(b) == [1]
    f.sched.regroup((5,), ())
    f.done(5)  # the added instance became ready: the backlogged sequence takes its slot
    (b,) = f.pop()
    assert (b.instance_id, _corrids(b)) == (5, [2])
    assert f.sched.holds(5)


def test_b2_a_dead_leaving_instance_that_comes_back_takes_no_sequence() -> None:
    """r23's B2 (session 18) at the policy: count 2 -> 1 with a live sequence on each
    instance, the leaving one dies (its sequence is lost) and its worker comes back ready;
    then three STARTs on the one slot left: the second and third wait in the backlog, and
    only an END or an idle release hands the slot on (the next START never overwrites a
    live sequence)."""
    f = direct(mbs=1, instances=(0, 1), idle_us=1000)
    f.send(21, START)
    f.send(22, START)
    assert sorted((b.instance_id, _corrids(b)) for b in f.pop()) == [(0, [21]), (1, [22])]
    f.done(0, 1)
    f.sched.regroup((), (0,))
    f.sched.instance_gone(0)
    f.sched.instance_idle(0, f.clock.now_ns())  # as a restarted worker would report
    assert not f.sched.holds(0)
    assert isinstance(f.send(21), Rejection)
    f.send(22, END)
    (b,) = f.pop()
    assert (b.instance_id, _corrids(b)) == (1, [22])
    f.done(1)
    for corrid in (30, 31, 32):
        assert isinstance(f.send(corrid, START), Queued)
    (b,) = f.pop()
    assert (b.instance_id, _corrids(b)) == (1, [30])
    f.done(1)
    assert f.pop() == []
    assert f.sched.queue_depth() == 2  # 31 and 32 wait
    f.send(30, END)
    (b,) = f.pop()
    assert (b.instance_id, _corrids(b)) == (1, [30])
    f.done(1)
    (b,) = f.pop()
    assert (b.instance_id, _corrids(b)) == (1, [31])  # 31 took 30's slot after its END
    f.done(1)
    f.clock.advance_us(1000)  # 31 idles out: 32 takes the slot, 31 is over
    assert f.sched.expire(f.clock.now_ns()) == []
    (b,) = f.pop()
    assert (b.instance_id, _corrids(b), b.released) == (1, [32], (31,))
    assert isinstance(f.send(31, END), Rejection)
    assert f.sched.queue_depth() == 0
