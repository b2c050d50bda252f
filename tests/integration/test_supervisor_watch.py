"""The supervisor's watch loop sees the death of a worker it killed as hung, however fast
the kill takes effect (one tiny real child process, no server)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time

from triton_mp.ipc.memory.heartbeat import HeartbeatBoard
from triton_mp.ipc.memory.topology import Topology
from triton_mp.supervisor.processes.children import Child, ChildTable
from triton_mp.supervisor.processes.health import Health


def test_a_worker_killed_as_hung_is_reported_even_when_it_dies_before_the_next_wait() -> None:
    """The timing of issue 24: the SIGKILL of the heartbeat judge takes effect before the
    watch loop builds its next wait set. Its death must still be handled: reported with
    exit code -9 (the supervisor then sends WorkerDied, and the scheduler fails the
    in-flight requests) and a restart scheduled."""
    board = HeartbeatBoard.create(Topology(str(os.getpid())).scratch("hb_watch_test"), 1)
    table = ChildTable(Health(board, timeout_s=0.2))
    deaths: list[tuple[int, int, str]] = []
    # A worker that never beats: it looks hung from the start.
    proc = mp.get_context("spawn").Process(target=time.sleep, args=(60,), daemon=True)
    proc.start()
    real_kill = proc.kill

    def kill_and_wait_for_the_death() -> None:
        real_kill()
        # Blocks until the child is dead but leaves it unreaped (WNOWAIT), as when the
        # supervisor is preempted right after the kill.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)

    proc.kill = kill_and_wait_for_the_death  # type: ignore[method-assign]
    worker = Child("worker", "hung_0_0", b"", process=proc, slot=0, instance_id=7, ready=True)
    table.add([worker])

    def died_then_stop(c: Child, pid: int, exitcode: int, reason: str) -> None:
        deaths.append((c.instance_id, exitcode, reason))
        table.stopping = True

    watch = threading.Thread(target=table.watch, args=(died_then_stop,), daemon=True)
    try:
        watch.start()
        watch.join(timeout=10)
        assert not watch.is_alive(), "the watch loop never saw the killed worker die"
        assert worker.hung_s > 0.2
        assert len(deaths) == 1
        instance_id, exitcode, reason = deaths[0]
        assert (instance_id, exitcode) == (7, -signal.SIGKILL)
        assert "unresponsive" in reason
        assert worker.process is None
        assert worker.restart_at > 0
    finally:
        table.stopping = True
        table.wake()
        watch.join(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=5)
        board.close()
        board.unlink()
