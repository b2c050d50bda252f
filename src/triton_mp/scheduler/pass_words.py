"""What the scheduler's loop learns from the core once per pass, before it waits.

Imported by ``scheduler.core`` (``SchedulerCore.pass_words``) and ``scheduler.main``. Four
answers, each its own concept's (``SchedulerCore.next_deadline_ns``, ``quiet_requests``,
``quiet_done``, ``forming``), asked together: the loop asks all four on every pass (about
2.3 passes per batch at c=16), and asked one by one each walked the generations again and
tested the server-wide conditions again (measured in the running scheduler at c=16, load
6-8: 24 µs of CPU per pass, 6.6 µs per inference; #34).
"""

from __future__ import annotations

from typing import NamedTuple

from triton_mp.scheduler.forming import Forming


class PassWords(NamedTuple):
    """The loop's view of the core before it waits.

    Attributes:
        deadline_ns: the nearest time a batch may become ready, a queue timeout expire, a
            claim run out or a retirement end without a message (monotonic ns; None: none).
        requests: the frontends' rings' quiet word (64-bit mask of model buckets,
            ``scheduler.request_wakeups``; 0: every request wakes the scheduler).
        quiet: the instances whose ``BatchDone`` need not wake the scheduler
            (``scheduler.done_wakeups``).
        forming: the forming words of the frontends' rings (``scheduler.forming``).
    """

    deadline_ns: int | None
    requests: int
    quiet: frozenset[int]
    forming: Forming
