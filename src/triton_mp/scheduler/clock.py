"""Clocks for the scheduler core: the real monotonic one and a fake one for tests.

Imported by ``scheduler.main`` (MonotonicClock) and tests (FakeClock). The batching logic
never reads a clock itself: callers pass ``now_ns``.
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Protocol

log = logging.getLogger(__name__)

_PR_SET_TIMERSLACK = 29
_PR_GET_TIMERSLACK = 30
"""prctl options from <linux/prctl.h>."""
SCHEDULER_TIMER_SLACK_NS = 1000
"""The scheduler's timer slack: its timed waits end within ~1 µs of the deadline."""


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


def _prctl(option: int, arg: int) -> int | None:
    """``prctl(option, arg)``'s result, or None where there is no prctl (not Linux)."""
    try:
        # NOTE: as supervisor._die_with_parent reaches prctl: the process's own libc.
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, ctypes.c_ulong(arg), 0, 0, 0))
    except (OSError, AttributeError):
        return None


def set_timer_slack_ns(slack_ns: int) -> bool:
    """Set this thread's timer slack (Linux ``prctl(PR_SET_TIMERSLACK)``), in nanoseconds.

    The kernel may end a timed sleep up to the slack after its deadline, to coalesce
    wake-ups; the default is 50 µs. The scheduler sleeps until the next batch deadline
    (``max_queue_delay_microseconds``), so the default slack added ~50 µs to the queue time
    of every request of a model with a delay at low load (measured with add_sub_py at
    concurrency 1: queue 658-694 µs with the default, 607-640 µs with 1 µs, for a 500 µs
    delay). Called once, by the scheduler's main thread, before its loop.

    Returns:
        True when set; False where prctl is missing or refuses (non-Linux): nothing changes.
    """
    ok = _prctl(_PR_SET_TIMERSLACK, slack_ns) == 0
    if not ok:
        log.debug("timer slack not set; timed waits keep the default slack")
    return ok


def timer_slack_ns() -> int | None:
    """This thread's timer slack in nanoseconds (``prctl(PR_GET_TIMERSLACK)``), or None
    where it cannot be read."""
    value = _prctl(_PR_GET_TIMERSLACK, 0)
    return value if value is not None and value >= 0 else None
