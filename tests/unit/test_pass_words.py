"""``SchedulerCore.pass_words``: the loop's four answers before it waits, asked at once.

It must say exactly what ``next_deadline_ns``, ``quiet_requests``, ``quiet_done`` (of that
mask) and ``forming`` say one by one (``scheduler.pass_words``): checked here after every
step of a busy dynamic batcher's life, and with each server-wide condition that silences the
words (stopping, deferred requests, a rate limiter, an ensemble in flight is quiet_done's).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.scheduler_harness import DYNAMIC, PLAIN, RAGGED, Harness, model_spec
from triton_mp.ipc.protocol.messages import BatchAssign, InstancesRetired, Shutdown, WorkerDied
from triton_mp.ipc.protocol.specs import BatchingSpec, QueuePolicySpec
from triton_mp.scheduler.core import SchedulerCore
from triton_mp.scheduler.forming import NOT_FORMING
from triton_mp.scheduler.limits.rate_limiter import RateLimiter
from triton_mp.scheduler.pass_words import PassWords

OTHER = model_spec("other_model", (5,))


def _one_by_one(core: SchedulerCore, frontends: int) -> PassWords:
    requests = core.quiet_requests()
    return PassWords(
        core.next_deadline_ns(), requests, core.quiet_done(requests), core.forming(frontends)
    )


def _agree(h: Harness, frontends: int = 1) -> PassWords:
    words = h.core.pass_words(frontends)
    assert words == _one_by_one(h.core, frontends)
    return words


def test_pass_words_say_what_the_four_questions_say_through_a_batchers_life() -> None:
    h = Harness(models=(DYNAMIC, OTHER, PLAIN))
    assert _agree(h)[:2] == (None, 0)  # nothing ready yet
    h.ready(0, 1, 2, 5)
    _agree(h)
    h.request()
    forming = _agree(h)
    assert forming.deadline_ns is not None
    assert forming.forming != NOT_FORMING
    assert _agree(h, frontends=2).forming == NOT_FORMING  # two rings: never forming
    for _ in range(3):
        h.request()
    batches = h.dispatch()
    _agree(h)
    for _ in range(4):
        h.request()
    batches += h.dispatch()
    busy = _agree(h)
    assert busy.requests  # both add_sub instances run a batch: its requests may be quiet
    assert busy.quiet == h.core.quiet_done(busy.requests)
    h.request()
    h.request("other_model")
    _agree(h)
    for iid, batch in batches:
        h.done(iid, batch)
        _agree(h)
    h.clock.advance_us(150)
    assert _agree(h).deadline_ns is not None
    h.deliver(list(h.core.dispatch(h.now)))
    _agree(h)


def test_pass_words_go_silent_as_the_four_do_while_stopping_or_holding_requests() -> None:
    h = Harness(models=(DYNAMIC,))
    h.ready(0, 1)
    for _ in range(4):
        h.request()
    h.dispatch()
    h.core.defer_unknown = True
    h.request("not_loaded")  # held: the version is not known yet
    assert h.core.deferred
    held = _agree(h)
    assert held.requests == 0
    assert held.quiet == frozenset()
    assert held.forming == NOT_FORMING
    h.core.deferred.clear()
    h.handle(Shutdown())
    stopping = _agree(h)
    assert stopping.requests == 0
    assert stopping.quiet == frozenset()


def test_pass_words_with_a_rate_limiter_are_silent_but_keep_the_deadline() -> None:
    h = Harness(models=(DYNAMIC,))
    h.core = SchedulerCore((DYNAMIC,), RateLimiter(()))
    h.ready(0, 1)
    h.request()
    limited = _agree(h)
    assert limited.deadline_ns is not None
    assert (limited.requests, limited.quiet, limited.forming) == (0, frozenset(), NOT_FORMING)


BIG = model_spec(
    "add_sub_py",
    (6, 7),
    max_batch_size=64,
    batching=BatchingSpec(kind="dynamic", max_batch_size=64, max_queue_delay_us=500),
)
TIMED = model_spec(
    "timed",
    (8,),
    batching=BatchingSpec(
        kind="dynamic",
        max_batch_size=8,
        max_queue_delay_us=100,
        default_queue_policy=QueuePolicySpec(default_timeout_us=300),
    ),
)
_MODELS = (DYNAMIC, PLAIN, RAGGED, BIG, TIMED)
_IIDS = (0, 1, 2, 3, 6, 7, 8)
_STEP = st.one_of(
    st.tuples(st.just("request"), st.sampled_from(_MODELS), st.integers(1, 3)),
    st.tuples(st.just("dispatch"), st.just(None), st.just(0)),
    st.tuples(st.just("done"), st.just(None), st.integers(0, 6)),
    st.tuples(st.just("advance"), st.just(None), st.integers(1, 600)),
    st.tuples(st.just("died"), st.just(None), st.sampled_from(_IIDS)),
    st.tuples(st.just("ready"), st.just(None), st.sampled_from(_IIDS)),
    st.tuples(st.just("retire"), st.sampled_from(_MODELS), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, max_size=40))
def test_pass_words_say_what_the_four_say_over_random_histories(
    steps: list[tuple[str, Any, int]],
) -> None:
    """Every word of the one-walk ``pass_words`` (``scheduler.pass_words.walk_words``) equals
    the four questions' answers asked one by one, after every step of a random history over
    dynamic batchers (with and without preferred sizes, a queue timeout, shapes enforced),
    a default scheduler, batches running and ending, instances dying, coming back and
    retiring, with one frontend ring and with two."""
    h = Harness(models=_MODELS)
    h.ready(*_IIDS)
    running: list[tuple[int, BatchAssign]] = []
    for kind, spec, n in steps:
        if kind == "request":
            h.request(spec.model, batch_size=n if spec.max_batch_size else 1)
        elif kind == "dispatch":
            running += h.dispatch()
        elif kind == "done" and running:
            h.done(*running.pop(n % len(running)))
        elif kind == "advance":
            h.clock.advance_us(n)
        elif kind == "died":
            running = [(i, b) for i, b in running if i != n]
            h.handle(WorkerDied(instance_id=n, exitcode=1))
        elif kind == "ready":
            h.ready(n)
        elif kind == "retire":
            h.handle(InstancesRetired(instance_ids=spec.instance_ids))
        _agree(h)
        _agree(h, frontends=2)
