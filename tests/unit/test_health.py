"""Heartbeat judging (``supervisor.processes.health``): slots, when judging starts, who is hung.
Fake children on a real board; no process is started."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from triton_mp.ipc.memory.heartbeat import HeartbeatBoard
from triton_mp.ipc.memory.topology import Topology
from triton_mp.supervisor.processes.health import Health

S = 1_000_000_000


@dataclass
class _Process:
    exitcode: int | None = None


@dataclass(eq=False)
class _Child:
    role: str = "worker"
    name: str = "m_0"
    process: _Process | None = field(default_factory=_Process)
    ready: bool = True
    slot: int = -1
    judged_since_ns: int = 0
    hung_s: float = 0.0


@pytest.fixture
def health() -> Iterator[Health]:
    board = HeartbeatBoard.create(Topology(str(os.getpid())).scratch("test_health"), 2)
    yield Health(board, timeout_s=2.0)
    board.close()
    board.unlink()


def test_slots_are_handed_out_once_and_reset_for_each_start(health: Health) -> None:
    a, b, c = _Child(), _Child(), _Child()
    assert health.prepare(a, set()) == (health.board.segment.name, 0, 0.5)
    health.board.beat(0, now_ns=5)
    a.judged_since_ns, a.hung_s = 7, 3.0
    assert health.prepare(a, {0})[1] == 0  # type: ignore[index]
    assert health.board.last_ns(0) == 0
    assert (a.judged_since_ns, a.hung_s) == (0, 0.0)
    assert health.prepare(b, {0})[1] == 1  # type: ignore[index]
    assert health.prepare(c, {0, 1}) is None
    assert c.slot == -1


def test_judging_starts_when_first_seen_ready_and_silence_counts_from_there(
    health: Health,
) -> None:
    child = _Child()
    health.prepare(child, set())
    assert health.hung([child], now_ns=100 * S) == []  # first look: judging starts
    assert child.judged_since_ns == 100 * S
    assert health.hung([child], now_ns=102 * S) == []  # 2 s: not over the timeout
    assert health.hung([child], now_ns=103 * S) == [(child, 3.0)]
    health.board.beat(child.slot, now_ns=102 * S)
    assert health.hung([child], now_ns=103 * S) == []


def test_starting_dead_or_already_judged_children_are_not_judged(health: Health) -> None:
    starting, dead, killed, no_slot = _Child(ready=False), _Child(), _Child(), _Child()
    for c in (starting, dead, killed):
        c.slot, c.judged_since_ns = 0, 1
    dead.process = _Process(exitcode=-9)
    killed.hung_s = 5.0
    assert health.hung([starting, dead, killed, no_slot], now_ns=100 * S) == []


def test_the_interval_is_a_quarter_of_the_timeout_at_most_a_second(health: Health) -> None:
    assert health.interval_s == 0.5
    assert Health(health.board, 60.0).interval_s == 1.0
