"""The frontend loop's poll after answers (``frontend.dispatch.linger``): only right after
answers, only while the last such wait ended with an event within ``LINGER_S``."""

from __future__ import annotations

from triton_mp.frontend.dispatch.linger import LINGER_S, Linger


def test_no_poll_before_a_short_gap_after_answers_was_seen() -> None:
    linger = Linger()
    assert linger.budget_s() == 0.0
    linger.answered()
    assert linger.budget_s() == 0.0  # NOTE: not known to pay yet
    linger.ended(LINGER_S / 2, event=True)
    assert linger.budget_s() == 0.0  # NOTE: no answers since
    linger.answered()
    assert linger.budget_s() == LINGER_S


def test_a_long_gap_after_answers_stops_the_polls() -> None:
    linger = Linger()
    linger.answered()
    linger.ended(0.0, event=True)
    linger.answered()
    linger.ended(LINGER_S * 4, event=True)
    linger.answered()
    assert linger.budget_s() == 0.0


def test_a_timer_ends_the_wait_late_and_the_polls_stop_but_an_early_timer_changes_nothing() -> None:
    linger = Linger()
    linger.answered()
    linger.ended(0.0, event=True)
    linger.answered()
    linger.ended(LINGER_S / 10, event=False)  # a timer of the loop's own, soon after
    assert linger.budget_s() == LINGER_S  # still the wait after answers
    linger.ended(LINGER_S * 2, event=False)
    assert linger.budget_s() == 0.0
    linger.answered()
    assert linger.budget_s() == 0.0


def test_waits_that_follow_no_answers_are_not_counted() -> None:
    linger = Linger()
    linger.ended(LINGER_S * 100, event=True)
    linger.answered()
    linger.ended(0.0, event=True)
    linger.ended(LINGER_S * 100, event=True)  # a later wait, not after answers
    linger.answered()
    assert linger.budget_s() == LINGER_S
