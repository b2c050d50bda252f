"""The scheduler's status side of ``triton-mp stat`` (``scheduler.status``), process-free."""

from __future__ import annotations

from tests.unit.scheduler_harness import US, Harness


def test_a_request_queued_in_the_pass_that_reads_the_status_is_aged_from_its_arrival() -> None:
    """The scheduler queues every request it reads in one pass at that pass's time, and a
    status query read in the same pass saw "depth 2 … oldest 0 µs": requests that had
    waited since they reached the frontend (the harness's arrive 10 µs before)."""
    h = Harness()
    h.request("plain")
    h.request("plain")
    (st,) = h.core.queue_status("plain", h.now)
    assert [(lv.depth, lv.oldest_age_us) for lv in st.levels] == [(2, 10)]
    h.clock.advance_us(5)
    (st,) = h.core.queue_status("plain", h.now)
    assert [(lv.depth, lv.oldest_age_us) for lv in st.levels] == [(2, 15)]


def test_an_empty_queue_has_no_age() -> None:
    h = Harness()
    (st,) = h.core.queue_status("plain", h.now + 7 * US)
    assert [(lv.depth, lv.oldest_age_us) for lv in st.levels] == [(0, 0)]
