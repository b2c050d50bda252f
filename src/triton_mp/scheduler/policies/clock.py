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
(``wait_plan``), and tells the worker whose batch is due (``BatchDue``): a timed sleep on
this VM ends 25 µs late at the median and ~100 µs at p90 under load, and a cold worker's
wake-up costs as much again; polling for this long instead costs at most that much CPU per
delayed batch, in each of the two processes."""


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
