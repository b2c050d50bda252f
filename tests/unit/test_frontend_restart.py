"""``supervisor.processes.frontend_restart`` without processes: request id ranges per start, and
what a dead frontend's restart does in order (free its arenas, take the spare or spawn, join the
control pipes, count), against a fake process table and link."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import triton_mp.supervisor.processes.frontend_restart as fr
from triton_mp.ipc.protocol.control_messages import ModelTableUpdate
from triton_mp.ipc.protocol.messages import direct_batch_id
from triton_mp.ipc.protocol.specs import FRONTEND_ID_RANGE
from triton_mp.supervisor.processes.children import MAX_RESTARTS, Child
from triton_mp.supervisor.processes.frontend_restart import FrontendRestarts, first_request_id


class _Process:
    def __init__(self, pid: int, alive: bool = True, exitcode: int | None = None) -> None:
        self.pid = pid
        self._alive = alive
        self.exitcode = exitcode

    def is_alive(self) -> bool:
        return self._alive


class _Conn:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)


class _Table:
    """The parts of ``ChildTable`` the restarts use; ``fail_starts`` spawns that fail."""

    def __init__(self, fail_starts: int = 0) -> None:
        self.stopping = False
        self.events: list[str] = []
        self.fail_starts = fail_starts
        self.children: list[Child] = []
        self.failed: Child | None = None
        self._pid = 1000

    def spawn(self, c: Child) -> None:
        self._pid += 1
        c.process = _Process(self._pid)  # type: ignore[assignment]
        c.ready_conn = _Conn()  # type: ignore[assignment]
        self.events.append(f"spawn {c.name}")

    def await_ready(self, children: list[Child], timeout_s: float) -> dict[str, str]:
        c = children[0]
        if self.fail_starts:
            self.fail_starts -= 1
            return {c.name: "did not report ready"}
        c.ready = True
        return {}

    def add(self, cs: Any) -> None:
        self.children.extend(cs)

    def remove(self, cs: Any) -> None:
        gone = {id(c) for c in cs}
        self.children = [c for c in self.children if id(c) not in gone]

    def claim(self, cs: Any) -> None:
        for c in cs:
            c.managed = True

    def release(self, cs: Any) -> None:
        for c in cs:
            c.managed = False
        self.events.append("release")

    def kill(self, c: Child) -> None:
        self.events.append(f"kill {c.name}")

    def fail(self, c: Child) -> None:
        self.failed = c


class _Link:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.updates: list[ModelTableUpdate] = []

    def detach(self, fid: int) -> None:
        self.events.append(f"detach {fid}")

    def attach_one(self, fid: int, conn: Any) -> None:
        self.events.append(f"attach {fid}")

    def attached(self) -> frozenset[int]:
        return frozenset({0, 1})

    def update(self, u: ModelTableUpdate, ack: bool) -> None:
        self.updates.append(u)

    def update_each(self, us: dict[int, ModelTableUpdate], ack: bool) -> None:
        self.events.extend(f"{u.resend_shm_to} to {i}" for i, u in us.items())


def _restarts(
    table: _Table, link: _Link, gone: list[tuple[int, int, int]], spare: bool = True
) -> tuple[FrontendRestarts, list[Callable[[], None]]]:
    queued: list[Callable[[], None]] = []
    r = FrontendRestarts(
        table,  # type: ignore[arg-type]
        link,  # type: ignore[arg-type]
        queued.append,
        lambda i, first, counts: f"{i}:{first}:{sorted(counts.items())}".encode(),
        lambda fid, pid, below: gone.append((fid, pid, below)),
        5.0,
        frontends=2,
        spare=spare,
    )
    return r, queued


def _dead(name: str, pid: int) -> Child:
    c = Child("frontend", name, b"")
    c.process = _Process(pid, alive=False, exitcode=-9)  # type: ignore[assignment]
    return c


def test_each_start_of_a_frontend_counts_request_ids_from_its_own_range() -> None:
    assert first_request_id(0) == 1
    assert first_request_id(3) == 3 * FRONTEND_ID_RANGE + 1
    # The last id of start 8190 still makes a direct batch id that fits an int64.
    assert -direct_batch_id(1023, first_request_id(8190) + FRONTEND_ID_RANGE - 1) < 2**63
    table, link = _Table(), _Link()
    gone: list[tuple[int, int, int]] = []
    r, _ = _restarts(table, link, gone)
    assert r.spec(1) == b"1:1:[(0, 0), (1, 0)]"
    assert r.spec(1) == f"1:{FRONTEND_ID_RANGE + 1}:[(0, 0), (1, 0)]".encode()
    assert r.spec(0) == b"0:1:[(0, 0), (1, 0)]"


def test_a_dead_frontend_is_freed_then_replaced_by_the_spare_then_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fr, "with_current_log", lambda role, spec: spec)
    table, link = _Table(), _Link()
    gone: list[tuple[int, int, int]] = []
    r, queued = _restarts(table, link, gone)
    assert r.spec(1).startswith(b"1:1:")  # the first process of frontend 1, at start
    r.keep_spare()
    assert table.events == ["spawn spare"]
    spare_pid = table.children[0].process.pid  # type: ignore[union-attr]
    dead = _dead("1", 77)
    r.died(dead)
    # On the watch thread only the pipe goes and the child is claimed; the rest queues.
    assert link.events == ["detach 1"]
    assert dead.managed
    assert not gone
    (job,) = queued
    job()
    # Its arenas first, and its requests cancelled: every id below the new process's first.
    assert gone == [(1, 77, FRONTEND_ID_RANGE + 1)]
    assert dead.process is not None
    assert dead.process.pid == spare_pid
    name, spec = dead.ready_conn.sent  # type: ignore[union-attr]
    assert name == b"1"
    assert spec.startswith(f"1:{FRONTEND_ID_RANGE + 1}:".encode())
    # Frontend 0 sent its client regions to the new 1 before 1 could serve.
    assert link.events == ["detach 1", "1 to 0", "attach 1"]
    assert not dead.managed
    assert r.counts == {0: 0, 1: 1}
    assert link.updates[-1].frontend_restarts == {0: 0, 1: 1}
    # A new spare waits for the next death.
    assert table.events == ["spawn spare", "release", "spawn spare"]


def test_without_a_spare_a_dead_frontend_is_started_from_scratch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--frontend-spare=false``: no spare waits, before or after the restart."""
    monkeypatch.setattr(fr, "with_current_log", lambda role, spec: spec)
    table, link = _Table(), _Link()
    gone: list[tuple[int, int, int]] = []
    r, queued = _restarts(table, link, gone, spare=False)
    r.keep_spare()
    assert table.events == []
    dead = _dead("1", 77)
    r.died(dead)
    (job,) = queued
    job()
    assert gone == [(1, 77, 1)]  # no process of frontend 1 started here before
    assert table.events == ["spawn 1", "release"]
    assert r.counts == {0: 0, 1: 1}


def test_a_frontend_that_keeps_failing_to_start_stops_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table, link = _Table(fail_starts=MAX_RESTARTS), _Link()
    gone: list[tuple[int, int, int]] = []
    r, queued = _restarts(table, link, gone)
    dead = _dead("0", 5)
    r.died(dead)
    slept: list[float] = []
    monkeypatch.setattr("triton_mp.supervisor.processes.frontend_restart.time.sleep", slept.append)
    queued[0]()
    assert table.failed is dead
    assert r.counts == {0: 0, 1: 0}
    assert len(slept) == MAX_RESTARTS - 1
    assert slept == sorted(slept)
    assert "attach 0" not in link.events


class _StoppedWhileStarting(_Table):
    """The server's stop arrives while the new frontend starts, and ends it."""

    def await_ready(self, children: list[Child], timeout_s: float) -> dict[str, str]:
        self.stopping = True
        return {children[0].name: "exited with code -15 before ready"}


def test_a_restart_the_servers_stop_ended_is_no_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fr, "with_current_log", lambda role, spec: spec)
    table, link = _StoppedWhileStarting(), _Link()
    gone: list[tuple[int, int, int]] = []
    r, queued = _restarts(table, link, gone, spare=False)
    dead = _dead("0", 5)
    r.died(dead)
    queued[0]()
    assert table.events == ["spawn 0"]  # not killed, not started again: the stop joins it
    assert dead.restarts == 0
    assert "did not restart" not in caplog.text
