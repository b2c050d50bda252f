"""The supervisor's watch loop sees the death of a worker it killed as hung, however fast
the kill takes effect (one tiny real child process, no server)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

from triton_mp.common.config import ServerConfig
from triton_mp.ipc.heartbeat import HeartbeatBoard
from triton_mp.ipc.messages import WorkerDied
from triton_mp.supervisor import Supervisor, _Child


def test_a_worker_killed_as_hung_is_reported_even_when_it_dies_before_the_next_wait(
    tmp_path: Path,
) -> None:
    """The timing of issue 24: the SIGKILL of the heartbeat judge takes effect before the
    watch loop builds its next wait set. Its death must still be handled: WorkerDied with
    exit code -9 to the scheduler (which fails the in-flight requests) and a restart."""
    sup = Supervisor(ServerConfig(model_repository=str(tmp_path), heartbeat_timeout_s=0.2))
    sup._heartbeats = HeartbeatBoard.create(sup.topology.scratch("hb_watch_test"), 1)
    sent: list[object] = []
    sup.send_scheduler = sent.append  # type: ignore[method-assign]
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
    worker = _Child("worker", "hung_0_0", b"", process=proc, slot=0, instance_id=7, ready=True)
    sup._children.append(worker)
    real_died = sup._worker_died

    def died_then_stop(c: _Child) -> None:
        real_died(c)
        sup._stop_requested = True

    sup._worker_died = died_then_stop  # type: ignore[method-assign]
    watch = threading.Thread(target=sup._watch, args=(None,), daemon=True)
    try:
        watch.start()
        watch.join(timeout=10)
        assert not watch.is_alive(), "the watch loop never saw the killed worker die"
        assert worker.hung_s > 0.2
        assert [type(m) for m in sent] == [WorkerDied]
        died = sent[0]
        assert isinstance(died, WorkerDied)
        assert (died.instance_id, died.exitcode) == (7, -signal.SIGKILL)
        assert "unresponsive" in died.reason
        assert worker.process is None
        assert worker.restart_at > 0
    finally:
        sup._stop_requested = True
        sup._wake_watch()
        watch.join(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=5)
        sup._heartbeats.close()
        sup._heartbeats.unlink()
