"""Whether the frontend's loop polls a little before it blocks: right after it answered
(``Linger``), or while an answer is due soon (``AnswerDue``).

Imported by ``frontend.dispatch.polling_loop``. A client that sends its next request as soon
as it has an answer (perf_analyzer, a c=1 caller) makes it reach the frontend a client round
trip after the answer left: on this VM ~100-250 µs. If the loop blocked meanwhile, the
native server's eventfd wakes it (tens of µs for the halted vCPU, ``bench/wake_cost.py``);
if it polls, the request is taken at once. The loop polls after a pass that delivered
answers only, for at most ``LINGER_S``, and only while such polls pay: the last wait after
answers ended with an event within ``LINGER_S``. So a client that pauses between requests,
and an idle server, see one poll at most after their last answer, and none after that.
"""

from __future__ import annotations

LINGER_S = 250e-6
"""The longest the loop polls after answering before it blocks (seconds)."""


class Linger:
    """The decision (module docstring), fed by the selector.

    ``answered()`` after a pass that delivered answers; ``budget_s()`` when the next wait
    would block; ``ended(gap_s, event)`` when that wait ends: ``gap_s`` seconds after it
    began, by an event (a descriptor or a ring record) or not (a timer's timeout).
    """

    __slots__ = ("_after_answers", "pays")

    def __init__(self) -> None:
        self._after_answers = False
        self.pays = False
        """The last wait after answers ended with an event within ``LINGER_S``."""

    def answered(self) -> None:
        """A pass delivered answers: the next wait follows them."""
        self._after_answers = True

    def budget_s(self) -> float:
        """Seconds to poll before blocking now (0: block at once)."""
        return LINGER_S if self._after_answers and self.pays else 0.0

    def ended(self, gap_s: float, event: bool) -> None:
        """The wait after answers ended (no-op for any other wait)."""
        if not self._after_answers:
            return
        if event:
            self._after_answers = False
            self.pays = gap_s <= LINGER_S
        elif gap_s > LINGER_S:
            # NOTE: a timer ended it late: the client did not come back at once.
            self._after_answers = False
            self.pays = False


DUE_POLL_S = 200e-6
"""The longest the loop polls for an answer it awaits before it blocks (seconds)."""


class AnswerDue:
    """Whether the loop polls for an awaited answer instead of blocking, fed by the selector.

    A request handed straight to an idle worker (``frontend.dispatch.direct``) is answered
    an ``execute`` later (tens of µs for a small python model), and the loop, done with the
    request's pass, would block just before the answer comes and pay the FIFO wake-up of its
    halted vCPU (``bench/wake_cost.py``: p50 19-24 µs quiet, much more under load). The worker's
    early wake (``workers.prewake``) cannot help there: it comes while the loop still runs.
    So when the loop would block with answers outstanding, it polls for up to
    ``DUE_POLL_S`` while that pays: the last such wait ended with an answer within
    ``DUE_POLL_S``. A slow model (or a batching delay) ends that after one wait; an idle loop
    (nothing outstanding) never polls, nor does one whose clients pause between requests
    (the selector asks ``Linger.pays`` too: one request every few ms finds every process
    asleep, and a poll would add CPU to each without making it faster than the other hops).

    ``budget_s()`` when the next wait would block with answers outstanding;
    ``ended(gap_s, answer)`` when that wait ends, ``gap_s`` seconds after it began, by an
    inbox record or not.
    """

    __slots__ = ("pays",)

    def __init__(self) -> None:
        self.pays = True
        """The last wait with answers outstanding ended by one within ``DUE_POLL_S`` (True at
        first: the first wait tells)."""

    def budget_s(self) -> float:
        """Seconds to poll for the answer before blocking (0: block at once)."""
        return DUE_POLL_S if self.pays else 0.0

    def ended(self, gap_s: float, answer: bool) -> None:
        """A wait with answers outstanding ended (an event other than an answer, within
        ``DUE_POLL_S``, changes nothing)."""
        if answer:
            self.pays = gap_s <= DUE_POLL_S
        elif gap_s > DUE_POLL_S:
            self.pays = False
