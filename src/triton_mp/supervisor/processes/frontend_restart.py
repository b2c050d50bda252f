"""A dead frontend's place taken by a new process, while the other frontends serve.

Imported by ``supervisor.main``. The watch loop (``supervisor.processes.children``) hands a dead
frontend to ``FrontendRestarts.died`` instead of stopping the server. What the dead process
had is reclaimed there: its control pipe is detached (``supervisor.processes.frontend_link``: model
changes stop sending to it and stop waiting for it), its input arenas are unlinked and every
worker unmaps them (``on_gone``). Its clients saw their connections drop, so the workers
count the requests it had sent on cancelled (``DropSegments.requests_below``: their ids are
below the new process's ``FrontendSpec.first_request_id``), as Triton cancels the calls of
a client that went away; what they still answer lands in its rings, where the new process
frees their output blocks. A lease it took
and never used is freed by the scheduler's claim timeout (``scheduler.direct``).

The new process is a *spare*: a frontend process started ahead (``keep_spare``) that has
imported its code and waits on its pipe for a name and a spec
(``supervisor.processes.child_entry``),
so taking a dead frontend's place costs its bind and start-up, not the seconds of importing
grpc, aiohttp and numpy (without a spare, a process is started from scratch). It is chosen
on model control's change thread, the only thread that changes
the model table and sends the frontends its updates: its spec is built from the table as
it is then (the same rings, the current models, routes and restart counts), and it joins
the control pipes before the next change, so it misses none. It binds the same ports
(``SO_REUSEPORT``), reads the same rings and wake-up, and gets new arenas and a new range of
request ids; a frontend that serves sends it the client shared-memory registrations (each
frontend knows all of them). A start that fails is retried with the workers' backoff; after
``MAX_RESTARTS`` failures in a row the server stops, as it did before restarts existed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from triton_mp.ipc.protocol.control_messages import ModelTableUpdate
from triton_mp.ipc.protocol.specs import FRONTEND_ID_RANGE, with_current_log
from triton_mp.supervisor.processes.children import (
    MAX_RESTARTS,
    RESTART_BACKOFF_S,
    Child,
    ChildTable,
)
from triton_mp.supervisor.processes.frontend_link import FrontendLink

log = logging.getLogger(__name__)

BuildSpec = Callable[[int, int, dict[int, int]], bytes]
"""Frontend id, first request id, restart counts -> the encoded ``FrontendSpec``."""
OnGone = Callable[[int, int, int], None]
"""Frontend id, the dead process's pid, the bound below which every request id of that
frontend is a dead process's (the next process's first request id)."""


def first_request_id(start: int) -> int:
    """The first request id of a frontend's ``start``-th process (0: the first one)."""
    return start * FRONTEND_ID_RANGE + 1


class FrontendRestarts:
    """Restarts dead frontends (see the module docstring).

    Args:
        table: the process table.
        link: the frontends' control pipes.
        on_change_thread: runs a function on model control's change thread.
        build_spec: a frontend's spec as the server is now.
        on_gone: frees what a dead frontend process had and cancels its requests
            (``OnGone``).
        startup_timeout_s: how long a new frontend may take to report ready.
        frontends: how many frontends the server runs (``--frontend-processes``).
        spare: whether to keep a spare (``--frontend-spare``); without one, ``keep_spare``
            starts nothing and a restart starts a process from scratch.
    """

    def __init__(
        self,
        table: ChildTable,
        link: FrontendLink,
        on_change_thread: Callable[[Callable[[], None]], None],
        build_spec: BuildSpec,
        on_gone: OnGone,
        startup_timeout_s: float,
        frontends: int = 1,
        spare: bool = True,
    ) -> None:
        self._keep_spare = spare
        self._table = table
        self._link = link
        self._on_change_thread = on_change_thread
        self._build_spec = build_spec
        self._on_gone = on_gone
        self._timeout_s = startup_timeout_s
        self.counts: dict[int, int] = dict.fromkeys(range(frontends), 0)
        """Per frontend id: restarts that came up (cumulative; ``triton-mp stat``)."""
        self._starts: dict[int, int] = {}
        """Per frontend id: processes started so far (each gets its own id range)."""
        self._spare: Child | None = None

    def keep_spare(self) -> None:
        """Start a spare unless one waits already (after the frontends serve; after each
        restart, on the change thread)."""
        spare = self._spare
        if (
            not self._keep_spare
            or self._table.stopping
            or (spare is not None and spare.process is not None and spare.process.is_alive())
        ):
            return
        if spare is not None:
            self._table.remove([spare])
        spare = Child("frontend", "spare", b"", managed=True)
        self._table.add([spare])
        self._table.spawn(spare)
        self._spare = spare

    def _start(self, c: Child) -> None:
        """Start frontend ``c``'s next process: the spare when one waits, else a new one."""
        fid = int(c.name)
        c.spec_bytes = self.spec(fid)
        spare, self._spare = self._spare, None
        if spare is not None and spare.process is not None and spare.process.is_alive():
            assert spare.ready_conn is not None
            self._table.remove([spare])
            c.process, c.ready_conn, c.slot = spare.process, spare.ready_conn, spare.slot
            c.ready, c.judged_since_ns = False, 0
            try:
                c.ready_conn.send_bytes(c.name.encode())
                c.ready_conn.send_bytes(with_current_log("frontend", c.spec_bytes))
                log.info("frontend %s takes over spare pid %d", c.name, c.process.pid or 0)
                return
            except OSError:
                self._table.kill(c)  # NOTE: it died just now; start one from scratch
        elif spare is not None:
            self._table.remove([spare])
        self._table.spawn(c)

    def spec(self, frontend_id: int) -> bytes:
        """The spec of frontend ``frontend_id``'s next process (the first ones' too)."""
        start = self._starts.get(frontend_id, 0)
        self._starts[frontend_id] = start + 1
        return self._build_spec(frontend_id, first_request_id(start), dict(self.counts))

    def _gone(self, fid: int, pid: int) -> None:
        """``on_gone`` for process ``pid`` of frontend ``fid``: every id that frontend's
        processes took so far is below the next one's first."""
        self._on_gone(fid, pid, first_request_id(self._starts.get(fid, 0)))

    def died(self, c: Child) -> None:
        """The watch loop saw frontend ``c`` exit (watch thread): reclaim what it had and
        queue its restart. The child stays ``managed`` until its successor serves."""
        assert c.process is not None
        pid = c.process.pid or 0
        code = c.process.exitcode if c.process.exitcode is not None else -1
        log.warning(
            "frontend %s (pid %d) died with exit code %d%s; restarting it",
            c.name,
            pid,
            code,
            " after it hung" if c.hung_s else "",
        )
        self._table.claim([c])
        fid = int(c.name)
        self._link.detach(fid)
        c.process = None
        c.ready_conn = None
        c.hung_s = 0.0
        self._on_change_thread(lambda: self._restart(c, pid))

    def _restart(self, c: Child, dead_pid: int) -> None:
        """Free what the dead process had, start ``c`` again and join it to the control
        pipes (change thread: the supervisor's rings into the workers have one writer)."""
        fid = int(c.name)
        self._gone(fid, dead_pid)
        # NOTE: client shared-memory registrations live in the frontends: one that serves
        # puts all it knows into its ring to the new one, before the new one can serve.
        peers = sorted(self._link.attached() - {fid})
        if peers:
            self._link.update_each({peers[0]: ModelTableUpdate(resend_shm_to=fid)}, ack=True)
        while not self._table.stopping:
            self._start(c)
            errors = self._table.await_ready([c], self._timeout_s)
            if not errors and c.ready_conn is not None:
                self.counts[fid] = self.counts.get(fid, 0) + 1
                c.restarts = 0
                self._link.attach_one(fid, c.ready_conn)
                self._table.release([c])
                log.info("frontend %s restarted (restart %d)", c.name, self.counts[fid])
                # NOTE: every frontend learns the count (the new one's spec predates it).
                self._link.update(ModelTableUpdate(frontend_restarts=dict(self.counts)), ack=False)
                self.keep_spare()
                return
            if self._table.stopping:
                return  # NOTE: the server's stop ended the new process; nothing failed
            c.restarts += 1
            pid = c.process.pid if c.process is not None else 0
            log.error("frontend %s did not restart: %s", c.name, "; ".join(errors.values()))
            if c.process is not None:
                self._table.kill(c)
                self._gone(fid, pid or 0)
            c.process = None
            if c.restarts >= MAX_RESTARTS:
                log.error("frontend %s failed %d times; stopping the server", c.name, c.restarts)
                self._table.fail(c)
                return
            first_s, max_s = RESTART_BACKOFF_S
            time.sleep(min(first_s * 2**c.restarts, max_s))
