"""Clocks for the scheduler core: the real monotonic one and a fake one for tests.

Imported by ``scheduler.main`` (MonotonicClock) and tests (FakeClock). The batching logic
never reads a clock itself: callers pass ``now_ns``.
"""

from __future__ import annotations

import time
from typing import Protocol

SCHEDULER_TIMER_SLACK_NS = 1000
"""The scheduler's timer slack: its timed waits end within ~1 µs of the deadline
(``common.process.platform.set_timer_slack_ns`` says why)."""


DUE_LEAD_NS = 100_000
"""How long before a deadline the scheduler stops sleeping and polls its rings instead
(``wait_plan``), and tells the worker whose batch is due (``BatchDue``), until its own timed
sleeps have been measured (``WakeLead``): a timed sleep on this VM ends 25-35 µs late at the
median and ~100 µs at p90 under load, and a cold worker's wake-up costs as much again;
polling for this long instead costs at most that much CPU per delayed batch, in each of the
two processes."""

LEAD_MARGIN_NS = 0
"""What ``WakeLead`` adds to how late the scheduler's poll before a deadline started: its
timed sleep's lateness and the cost of the notices (the ``BatchDue``'s encode, push and post,
which on a busy machine hands the vCPU to the woken worker: 38 µs at the median at load 7,
against ~15 µs alone), both measured. None: the poll from its start to the deadline is spin,
the scheduler's CPU for its whole length, once per delayed batch, and at add_sub_py c=16 it
never ended early (every request joins the forming batch without a post). With a 20 µs
margin on the 0.9 quantile it lasted ~42 µs of wall and ~35 µs of CPU per batch (late
p10/p50/p90 47/57/76 µs, lead 84/93/113); a poll that starts late sends its batch late by
that much, a few µs at the median. Measured (s16sch, 2026-12-07, ``ab_interleaved.py`` c=16
8 pairs, ``ab_c1.py`` 5 rounds, load 7-16): 5 µs on the 0.75 quantile against 20 on the 0.9,
scheduler CPU per inference lower in 6 of 8 pairs (medians 18.7 against 22.4), infer/s higher
in 5 of 8, c=1 p50 803 against 785 µs; then none on the median against that, lower in 15 of
16 pairs (medians 16.2 against 19.3 and 15.0 against 17.3), infer/s higher in 9 of 16
(medians 8,691 against 7,047 and 9,908 against 8,689), c=1 p50 782 against 808 µs (0.80x
Triton), its scheduler CPU 172 against 183 µs per inference."""

MIN_LEAD_NS = 20_000
"""The shortest lead ``WakeLead`` gives (the notices' own cost alone, ~15-20 µs)."""

MAX_LEAD_NS = 150_000
"""The longest lead ``WakeLead`` gives: under heavy load a timed sleep can end milliseconds
late, which no lead should chase (the poll that follows costs CPU for its whole length).
Measured at load 12 with a cap of 250 µs (``bench/ab_c1.py``, 4 rounds): p50 0.97x the fixed
100 µs lead, but the scheduler's CPU per inference +37 µs and the worker's +22: the lead sat
at the cap, polling past the median sleep's lateness (53 µs at that load, p90 405 µs:
``bench/wake_cost.py``) for a tail it rarely caught; at 150 µs it still covers the median
sleep and the notice twice over."""

LATE_QUANTILE = 0.5
"""Which quantile of its timed sleeps' lateness ``WakeLead`` tracks (``LEAD_MARGIN_NS`` says
why not 0.9: a higher quantile is a longer poll on every batch for the few late ones)."""

LATE_STEP_NS = 2_000
"""How far one late sleep moves ``WakeLead``'s quantile estimate (ns): up by
``LATE_STEP_NS * LATE_QUANTILE`` when the sleep was later than the estimate, down by
``LATE_STEP_NS * (1 - LATE_QUANTILE)`` otherwise, so about half the samples stay above it; a
jump or a fall of 20 µs in the lateness is followed within ~20 later sleeps."""


class WakeLead:
    """How early the scheduler ends a timed sleep before a batching deadline
    (``wait_plan``'s ``lead_ns``): the ``LATE_QUANTILE`` of how late its poll before the
    deadline started against the sleep's planned end (the sleep's own lateness, then the
    notices), plus ``LEAD_MARGIN_NS``, within [``MIN_LEAD_NS``, ``MAX_LEAD_NS``].

    A sleep that ends late makes the scheduler reach its poll after the deadline: the batch
    leaves late by that much, and so does the worker's notice (measured under load: sleeps
    planned 100 µs before the deadline ended 54 / 63 / 72 µs late at p10 / p50 / p90, and
    the batch reached the worker 127 µs after its deadline). A lead longer than needed costs
    the poll's CPU, in the scheduler and in the worker, for nothing. The estimate moves by a
    fixed step per sample (a streaming quantile: O(1), no history kept).
    """

    __slots__ = ("_late_ns",)

    def __init__(self, late_ns: int = DUE_LEAD_NS - LEAD_MARGIN_NS) -> None:
        self._late_ns = float(late_ns)
        """The running ``LATE_QUANTILE`` estimate of the poll's lateness (ns)."""

    @property
    def lead_ns(self) -> int:
        """The lead to plan the next sleep with (ns)."""
        return int(min(MAX_LEAD_NS, max(MIN_LEAD_NS, self._late_ns + LEAD_MARGIN_NS)))

    @property
    def late_ns(self) -> int:
        """The current lateness estimate (ns)."""
        return int(self._late_ns)

    def slept(self, late_ns: int) -> None:
        """After a timed sleep that no message ended and the notices it sent, the poll to
        the deadline started ``late_ns`` after the sleep's planned end (CLOCK_MONOTONIC ns;
        negative when early)."""
        if late_ns > self._late_ns:
            # NOTE: capped where the lead is: a burst of very late sleeps must not leave an
            # estimate that takes thousands of sleeps to come back down.
            self._late_ns = min(
                MAX_LEAD_NS - LEAD_MARGIN_NS, self._late_ns + LATE_STEP_NS * LATE_QUANTILE
            )
        else:
            self._late_ns = max(0.0, self._late_ns - LATE_STEP_NS * (1 - LATE_QUANTILE))


def wait_plan(
    now_ns: int, deadline_ns: int | None, lead_ns: int = DUE_LEAD_NS
) -> tuple[float | None, float]:
    """How the scheduler's loop waits for its next pass: (seconds to sleep on the inbox
    first, None = until a message; then seconds to poll the rings, 0 = no poll).

    No deadline: sleep until a message. A deadline due: no wait. A deadline further than
    ``lead_ns``: sleep until ``lead_ns`` before it, then poll until it. Within ``lead_ns``
    of it: poll until it (never sleep past it).
    """
    if deadline_ns is None:
        return None, 0.0
    left = deadline_ns - now_ns
    if left <= 0:
        return 0.0, 0.0
    if left <= lead_ns:
        return 0.0, left / 1e9
    return (left - lead_ns) / 1e9, lead_ns / 1e9


class Clock(Protocol):
    """A monotonic clock in nanoseconds."""

    def now_ns(self) -> int:
        """Current time in nanoseconds (monotonic, system-wide on Linux)."""
        ...


class MonotonicClock:
    """``time.monotonic_ns``: CLOCK_MONOTONIC, the same in every process of the machine."""

    def now_ns(self) -> int:
        """Current CLOCK_MONOTONIC time in nanoseconds."""
        return time.monotonic_ns()


class FakeClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self._now_ns = start_ns

    def now_ns(self) -> int:
        """The current fake time in nanoseconds."""
        return self._now_ns

    def advance_us(self, us: int) -> int:
        """Move forward ``us`` microseconds; returns the new time in nanoseconds."""
        self._now_ns += us * 1000
        return self._now_ns
