"""Heartbeat judging: which children are hung (silent longer than the timeout).

Imported by ``supervisor.processes.children`` (which kills what is judged hung) and
``supervisor.main``. The board itself, its layout and the beating thread are
``ipc.memory.heartbeat``; ``supervisor.processes.wiring`` creates the board. A child is judged only
once it reported ready (loading a model has ``--startup-timeout-secs`` instead), from the moment
the supervisor first saw it ready, so a slow start never counts as silence.
"""

from __future__ import annotations

import logging
import time
from multiprocessing.process import BaseProcess
from typing import Protocol, TypeVar

from triton_mp.ipc.memory.heartbeat import HeartbeatBoard

log = logging.getLogger(__name__)

HEARTBEAT_SLOTS = 4096
"""Room on the heartbeat board (8 bytes a child); children beyond it are not judged."""


class Judged(Protocol):
    """What the judge reads and writes of a child (``supervisor.processes.children.Child``)."""

    @property
    def role(self) -> str:
        """The child's role (log lines)."""
        ...

    @property
    def name(self) -> str:
        """The child's name (log lines)."""
        ...

    process: BaseProcess | None
    ready: bool
    slot: int
    """Its slot on the board (-1: none)."""
    judged_since_ns: int
    """When judging began (0: not yet)."""
    hung_s: float
    """Its silence when it was found hung (0: it was not)."""


C = TypeVar("C", bound=Judged)


class Health:
    """Judges the children's heartbeats on one board.

    Args:
        board: the server's heartbeat board.
        timeout_s: ``--heartbeat-timeout-secs`` (> 0).
    """

    def __init__(self, board: HeartbeatBoard, timeout_s: float) -> None:
        self.board = board
        self.timeout_s = timeout_s

    @property
    def interval_s(self) -> float:
        """How often children beat and the supervisor looks: a quarter of the timeout,
        at most 1 s."""
        return min(1.0, self.timeout_s / 4)

    def prepare(self, child: Judged, used_slots: set[int]) -> tuple[str, int, float] | None:
        """Give ``child`` a slot (once, one not in ``used_slots``), clear it for a fresh
        start, and return ``(board name, slot, interval_s)`` for its beating thread; None
        when the board is full (the child is then never judged)."""
        board = self.board
        if child.slot < 0:
            child.slot = next((i for i in range(board.slots) if i not in used_slots), -1)
            if child.slot < 0:
                log.warning("no heartbeat slot left for %s %s", child.role, child.name)
                return None
        board.reset(child.slot)
        child.judged_since_ns = 0
        child.hung_s = 0.0
        return (board.segment.name, child.slot, self.interval_s)

    def hung(self, children: list[C], now_ns: int | None = None) -> list[tuple[C, float]]:
        """The ready, live children silent for longer than the timeout, each with its silence
        in seconds. A child seen ready for the first time starts being judged now."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        out = []
        for c in children:
            p = c.process
            if p is None or c.slot < 0 or not c.ready or c.hung_s or p.exitcode is not None:
                continue
            if not c.judged_since_ns:
                c.judged_since_ns = now
                continue
            silent_s = self.board.silent_for_s(c.slot, c.judged_since_ns, now)
            if silent_s > self.timeout_s:
                out.append((c, silent_s))
        return out
