"""The frontend loop's poll after answers (``frontend.dispatch.linger``): only right after
answers, only while the last such wait ended with an event within ``LINGER_S``."""

from __future__ import annotations

from triton_mp.frontend.dispatch.linger import DUE_POLL_S, LINGER_S, AnswerDue, Linger


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


def test_answers_due_are_polled_for_while_they_come_soon() -> None:
    due = AnswerDue()
    assert due.budget_s() == DUE_POLL_S  # NOTE: the first wait tells
    due.ended(DUE_POLL_S / 4, answer=True)
    assert due.budget_s() == DUE_POLL_S
    due.ended(DUE_POLL_S * 3, answer=True)  # a slow model, a batching delay
    assert due.budget_s() == 0.0
    due.ended(DUE_POLL_S / 2, answer=False)  # another event, soon: tells nothing
    assert due.budget_s() == 0.0
    due.ended(DUE_POLL_S / 2, answer=True)
    assert due.budget_s() == DUE_POLL_S


def test_a_long_wait_for_an_answer_that_did_not_come_stops_the_polls() -> None:
    due = AnswerDue()
    due.ended(DUE_POLL_S / 2, answer=False)
    assert due.budget_s() == DUE_POLL_S
    due.ended(DUE_POLL_S * 2, answer=False)  # a timer, a request of another client
    assert due.budget_s() == 0.0
