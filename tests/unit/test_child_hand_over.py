"""``ChildTable.hand_over`` without processes: a frontend started early with no spec (the
supervisor starts them before the scheduler, so their imports overlap the models' start)
gets its name and spec down its pipe and becomes the frontend; a spare that is gone, or
whose pipe is closed, leaves the frontend to be spawned."""

from __future__ import annotations

import os
import time
from multiprocessing import Pipe

import pytest

import triton_mp.supervisor.processes.children as children_mod
from triton_mp.supervisor.processes.children import Child, ChildTable


class _Process:
    """A child process: its sentinel (a pipe's read end) is readable once it is not alive."""

    def __init__(self, pid: int, alive: bool = True) -> None:
        self.pid = pid
        self.exitcode: int | None = None
        self._r, self._w = os.pipe()
        self.alive = alive
        self.killed = False

    @property
    def alive(self) -> bool:
        return self._w >= 0

    @alive.setter
    def alive(self, alive: bool) -> None:
        if not alive and self._w >= 0:
            os.close(self._w)
            self._w = -1

    @property
    def sentinel(self) -> int:
        return self._r

    def is_alive(self) -> bool:
        return self.alive

    def kill(self) -> None:
        self.killed, self.alive = True, False

    def join(self, timeout: float | None = None) -> None:
        pass

    def __del__(self) -> None:
        self.alive = False
        os.close(self._r)


@pytest.fixture(autouse=True)
def _spec_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: the specs here are not encoded FrontendSpecs; the log rewrite is tested elsewhere
    monkeypatch.setattr(children_mod, "with_current_log", lambda _role, spec: spec)


def _spare(table: ChildTable, alive: bool = True) -> tuple[Child, object]:
    ours, theirs = Pipe(duplex=True)
    spare = Child("frontend", "spare", b"", managed=True, slot=7)
    spare.process, spare.ready_conn = _Process(4242, alive), ours  # type: ignore[assignment]
    table.add([spare])
    return spare, theirs


def test_a_waiting_spare_becomes_the_frontend_and_reads_its_name_then_its_spec() -> None:
    table = ChildTable()
    spare, theirs = _spare(table)
    fe = Child("frontend", "0", b"the spec")
    table.add([fe])
    assert table.hand_over(spare, fe)
    assert fe.process is spare.process
    assert fe.ready_conn is spare.ready_conn
    assert fe.slot == 7
    assert not fe.ready
    assert fe.judged_since_ns == 0
    assert theirs.recv_bytes() == b"0"  # type: ignore[attr-defined]
    assert theirs.recv_bytes() == b"the spec"  # type: ignore[attr-defined]
    assert table.children() == [fe]


def test_a_dead_spare_leaves_the_frontend_to_be_spawned() -> None:
    table = ChildTable()
    spare, _theirs = _spare(table, alive=False)
    fe = Child("frontend", "0", b"the spec")
    assert not table.hand_over(spare, fe)
    assert fe.process is None
    assert fe.ready_conn is None
    assert table.children() == []


def test_a_spare_whose_pipe_closed_is_killed_and_the_frontend_spawned() -> None:
    table = ChildTable()
    spare, theirs = _spare(table)
    theirs.close()  # type: ignore[attr-defined]
    proc = spare.process
    fe = Child("frontend", "0", b"the spec")
    assert not table.hand_over(spare, fe)
    assert proc.killed  # type: ignore[union-attr]
    assert fe.process is None
    assert fe.ready_conn is None


class _ProcessTakenAway(_Process):
    """A process whose ``join`` lets the change thread give up its frontend's restart
    (``FrontendRestarts._restart`` sets ``Child.process`` to None) while the stop waits."""

    def __init__(self, child: Child, pid: int) -> None:
        super().__init__(pid)
        self.child = child
        self.terminated = False

    def terminate(self) -> None:
        self.terminated = True

    @property
    def sentinel(self) -> int:
        self.child.process = None
        self.alive = False
        return self._r


def test_the_stop_joins_the_process_it_saw_when_a_restart_drops_it_meanwhile() -> None:
    """A SIGINT during a frontend's restart: the supervisor's stop raised AttributeError
    ('NoneType' has no 'is_alive') and left the server's shared memory behind."""
    table = ChildTable()
    c = Child("frontend", "0", b"")
    p = _ProcessTakenAway(c, 41)
    c.process = p  # type: ignore[assignment]
    table.add([c])
    assert not table.stop_frontends(drain=True, deadline=0.0)
    assert p.terminated
    assert c.process is None


class _ReapedElsewhere(_Process):
    """A process that exited and that another thread reaped: ``is_alive()`` stays True
    (multiprocessing's waitpid lost the race), its sentinel is readable (end of file)."""

    def is_alive(self) -> bool:
        return True


def test_a_child_reaped_by_another_thread_counts_as_stopped_not_killed() -> None:
    """Ctrl-C during a frontend's restart: the restart's handshake reaped the new process
    while the stop waited for it; the stop killed a process that was gone and exited 1."""
    table = ChildTable()
    gone, stuck = Child("frontend", "0", b""), Child("frontend", "1", b"")
    pg = _ReapedElsewhere(41, alive=False)
    ps = _Process(42)
    gone.process, stuck.process = pg, ps  # type: ignore[assignment]
    table.add([gone])
    assert not table.join_all(time.monotonic() + 5)
    assert not pg.killed
    table.add([stuck])
    assert table.join_all(time.monotonic() + 0.05)
    assert ps.killed
