"""``SchedulerCore.pass_words``: the loop's four answers before it waits, asked at once.

It must say exactly what ``next_deadline_ns``, ``quiet_requests``, ``quiet_done`` (of that
mask) and ``forming`` say one by one (``scheduler.pass_words``): checked here after every
step of a busy dynamic batcher's life, and with each server-wide condition that silences the
words (stopping, deferred requests, a rate limiter, an ensemble in flight is quiet_done's).
"""

from __future__ import annotations

from tests.unit.scheduler_harness import DYNAMIC, PLAIN, Harness, model_spec
from triton_mp.ipc.protocol.messages import Shutdown
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
