"""Clocks for the scheduler core: the real monotonic one and a fake one for tests.

Imported by ``scheduler.main`` (MonotonicClock) and tests (FakeClock). The batching logic
never reads a clock itself: callers pass ``now_ns``.
"""

from __future__ import annotations

import time
from typing import Protocol

SCHEDULER_TIMER_SLACK_NS = 1000
"""The scheduler's timer slack: its timed waits end within ~1 µs of the deadline
(``common.platform.set_timer_slack_ns`` says why)."""


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
