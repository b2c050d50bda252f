"""The process table: the only owner of the server's child processes.

Imported by ``supervisor.main`` (which builds it) and ``supervisor.processes.instances`` (which adds
and removes workers). ``ChildTable`` spawns every child (``supervisor.processes.child_entry`` is the
target), waits for each one's start handshake (``ipc.handshake``) with a deadline, and runs
the watch loop: one ``multiprocessing.connection.wait`` on every child's sentinel and pending
handshake (STYLE.md rule 8), heartbeat judging (``supervisor.processes.health``), and restarts of
dead
workers with exponential backoff; a dead frontend goes to ``supervisor.processes.frontend_restart``.
A child that model control is starting or stopping is ``managed`` (an expected exit): the
watch loop leaves it alone until it is released.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from triton_mp.ipc import encode
from triton_mp.ipc.handshake import CALLS_CUT_EXIT, Ready, Role, StartFailed, read_handshake
from triton_mp.ipc.protocol.specs import WorkerSpec, with_current_log
from triton_mp.supervisor.processes.child_entry import child_main
from triton_mp.supervisor.processes.health import Health

log = logging.getLogger(__name__)

MAX_RESTARTS = 5
"""Consecutive failed restarts of one instance before its model is given up."""
RESTART_BACKOFF_S = (0.1, 10.0)
"""A worker's n-th consecutive restart waits ``min(0.1 * 2**n, 10)`` seconds."""
JOIN_TIMEOUT_S = 5.0
"""How long to wait for the exit status of a child whose sentinel fired (or that was killed)."""
FRONTEND_STOP_MARGIN_S = 2.0
"""How long past the server's exit deadline a draining frontend is waited for before it is
killed: at its own deadline it still closes its transports (``frontend.main._drain``: up to
0.5 s each) and exits."""


@dataclass(eq=False)
class Child:
    """One child process of the server, across its restarts."""

    role: Role
    name: str
    spec_bytes: bytes
    """Its encoded spec (rewritten when model control rewires a worker)."""
    env: dict[str, str] = field(default_factory=dict)
    process: BaseProcess | None = None
    ready_conn: Connection | None = None
    """The supervisor's end of its pipe (a frontend's control pipe after the handshake)."""
    ready: bool = False
    restarts: int = 0
    restart_at: float = 0.0
    """``time.monotonic()`` of the next restart (0: none due)."""
    model: str = ""
    """The model a worker serves (log fields)."""
    slot: int = -1
    """Its slot on the heartbeat board (-1: none)."""
    judged_since_ns: int = 0
    """When the supervisor started judging its heartbeats (0: not yet, or not ready)."""
    hung_s: float = 0.0
    """How long it had been silent when the supervisor killed it as hung (0: it was not)."""
    instance_id: int = -1
    """A worker's instance id."""
    managed: bool = False
    """Model control starts or stops it now: the watch loop leaves it alone."""

    @property
    def fields(self) -> dict[str, str]:
        """``extra`` for log lines about this child: its model and instance."""
        return {"model": self.model, "instance": self.name} if self.role == "worker" else {}

    @classmethod
    def worker(cls, spec: WorkerSpec, env: dict[str, str] | None = None) -> Child:
        """A worker child for ``spec`` (not started), managed until model control releases
        it; ``env`` is set in it first (a GPU instance's ``CUDA_VISIBLE_DEVICES``,
        ``common.process.gpus.worker_env``)."""
        w = spec.instance
        return cls(
            "worker",
            w.name,
            encode(spec),
            dict(env or {}),
            model=w.model,
            instance_id=w.instance_id,
            managed=True,
        )


WorkerDeath = Callable[[Child, int, int, str], None]
"""Called with a dead worker, its pid, its exit code and why it died ("" or the hang)."""
FrontendDeath = Callable[[Child], None]
"""Called with a dead frontend (its process not reaped yet; it restarts it)."""


BETWEEN_S = 0.05
"""How often ``ChildTable.await_ready`` calls its ``between`` while it waits (seconds)."""


class ChildTable:
    """Every child process of one server (see the module docstring).

    Attributes:
        health: the heartbeat judge; None (the default) while heartbeats are off.
    """

    def __init__(self, health: Health | None = None) -> None:
        self._ctx = mp.get_context("spawn")
        self.health = health
        self._children: list[Child] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self.stopping = False
        """A stop signal arrived: nothing more is spawned and the watch loop returns."""
        self._fatal: Child | None = None
        """A child whose failure stops the server (``fail``), for the watch loop."""

    # --------------------------------------------------------------- membership
    def children(self, role: Role | None = None) -> list[Child]:
        """A snapshot of the table (of one role)."""
        with self._lock:
            return [c for c in self._children if role is None or c.role == role]

    def add(self, children: Iterable[Child]) -> None:
        """Register children with the watch loop (it restarts those not ``managed``)."""
        with self._lock:
            self._children.extend(children)
        self.wake()

    def remove(self, children: Iterable[Child]) -> None:
        """Forget children that exited for good."""
        gone = {id(c) for c in children}
        with self._lock:
            self._children = [c for c in self._children if id(c) not in gone]

    def release(self, children: Iterable[Child]) -> None:
        """Hand children to the watch loop (restarted when they die)."""
        with self._lock:
            for c in children:
                c.managed = False
        self.wake()

    def claim(self, children: Iterable[Child]) -> None:
        """Take children back from the watch loop: they are about to stop for good."""
        with self._lock:
            for c in children:
                c.managed = True

    def fail(self, c: Child) -> None:
        """Stop the server because of ``c`` (any thread): the watch loop returns it."""
        self._fatal = c
        self.wake()

    def wake(self) -> None:
        """Make the watch loop look again (a stop signal, a new child); any thread."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # ------------------------------------------------------------ processes
    def spawn(self, child: Child) -> None:
        """Start ``child``'s process (nothing once stopping); its handshake is awaited by
        ``await_ready`` or, for a restart, by the watch loop."""
        if self.stopping:
            return
        # NOTE: a frontend's pipe stays open as its control pipe
        # (supervisor.processes.frontend_link).
        recv_end, send_end = self._ctx.Pipe(duplex=child.role == "frontend")
        heartbeat = None
        if self.health is not None:
            # NOTE: model control's thread spawns too: pick the slot under the lock.
            with self._lock:
                used = {c.slot for c in self._children if c is not child}
                heartbeat = self.health.prepare(child, used)
        proc = self._ctx.Process(
            target=child_main,
            args=(
                child.role,
                child.name,
                os.getpid(),
                with_current_log(child.role, child.spec_bytes) if child.spec_bytes else b"",
                send_end,
                child.env,
                heartbeat,
            ),
            name=f"triton-mp {child.role} {child.name}",
        )
        proc.start()
        send_end.close()
        log.info("started %s %s (pid %d)", child.role, child.name, proc.pid, extra=child.fields)
        child.process = proc
        child.ready_conn = recv_end
        child.ready = False

    def hand_over(self, spare: Child, c: Child) -> bool:
        """Give frontend ``c`` the process of ``spare``, a frontend started with no spec that
        has imported its code and waits on its pipe (``child_entry._await_role``): ``c``'s
        name and spec go down that pipe, and ``c`` is then awaited as if spawned. ``spare``
        leaves the table either way.

        Returns:
            False when the spare is gone (``c`` has no process then: spawn it).
        """
        self.remove([spare])
        if spare.process is None or spare.ready_conn is None or not spare.process.is_alive():
            self.kill(spare)
            return False
        c.process, c.ready_conn, c.slot = spare.process, spare.ready_conn, spare.slot
        c.ready, c.judged_since_ns = False, 0
        try:
            c.ready_conn.send_bytes(c.name.encode())
            c.ready_conn.send_bytes(with_current_log(c.role, c.spec_bytes))
        except OSError:
            self.kill(c)  # NOTE: it died just now
            c.process, c.ready_conn = None, None
            return False
        log.info(
            "%s %s runs in pid %d, started ahead of its spec", c.role, c.name, c.process.pid or 0
        )
        return True

    def await_ready(
        self,
        children: list[Child],
        timeout_s: float,
        between: Callable[[], None] | None = None,
    ) -> dict[str, str]:
        """Wait up to ``timeout_s`` for each started child's handshake; with ``between``,
        call it every ``BETWEEN_S`` while waiting (model control serves python models'
        calls there).

        Returns:
            ``{name: why}`` for each child that sent StartFailed, died first (its exit code)
            or missed the deadline (it is killed).
        """
        deadline = time.monotonic() + timeout_s
        waiting = {c.ready_conn: c for c in children if c.ready_conn and c.process}
        errors: dict[str, str] = {}
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for c in waiting.values():
                    errors[c.name] = f"{c.role} {c.name} did not report ready within {timeout_s}s"
                    self.kill(c)
                break
            sentinels = {c.process.sentinel: c for c in waiting.values() if c.process}
            if between is not None:
                between()
                remaining = min(remaining, BETWEEN_S)
            for obj in wait([*waiting, *sentinels], timeout=remaining):
                found = waiting.get(obj) if isinstance(obj, Connection) else sentinels.get(obj)  # type: ignore[arg-type]
                if found is None or found.ready_conn not in waiting:
                    continue
                error = self._handshake(found)
                if error:
                    errors[found.name] = error
                del waiting[found.ready_conn]
        return errors

    def _handshake(self, c: Child) -> str:
        """Read ``c``'s handshake: "" when Ready, else why it will not serve."""
        assert c.ready_conn is not None
        assert c.process is not None
        msg = read_handshake(c.ready_conn)
        if isinstance(msg, Ready):
            c.ready = True
            return ""
        c.process.join(timeout=JOIN_TIMEOUT_S)
        if isinstance(msg, StartFailed):
            return msg.reason
        return f"{c.role} {c.name} exited with code {c.process.exitcode} before ready"

    def kill(self, c: Child) -> None:
        """SIGKILL a child and reap it."""
        p = c.process
        if p is not None:
            _kill(p)

    def await_exit(self, children: list[Child], timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for children told to stop (claimed: an expected exit) to
        exit; kill those still running then. Returns early once the server is stopping (its
        shutdown stops everything)."""
        deadline = time.monotonic() + timeout_s
        waiting = {c.process.sentinel: c for c in children if c.process is not None}
        while waiting and not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                for c in waiting.values():
                    log.warning("retired instance %s did not stop; killing it", c.name)
                    self.kill(c)
                break
            for s in wait(list(waiting), timeout=min(left, 0.5)):
                waiting.pop(s)  # type: ignore[arg-type]
        for c in children:
            if c.process is not None:
                c.process.join(timeout=JOIN_TIMEOUT_S)

    # ---------------------------------------------------------------- watch
    def watch(
        self, on_worker_death: WorkerDeath, on_frontend_death: FrontendDeath | None = None
    ) -> Child | None:
        """Watch every child not ``managed`` until a stop signal or a fatal death.

        A dead worker is reported to ``on_worker_death`` and restarted with backoff; a
        restarted worker's handshake resets its restart count; a dead frontend goes to
        ``on_frontend_death`` (None: it stops the server); a hung child is killed.

        Returns:
            The frontend or scheduler whose death stops the server; None after a stop signal.
        """
        while not self.stopping:
            if self._fatal is not None:
                return self._fatal
            objs: list[object] = [self._wake_r]
            by_sentinel: dict[object, Child] = {}
            children = [c for c in self.children() if not c.managed]
            for c in children:
                # NOTE: a dead child's sentinel stays readable: watch it whatever its
                # exitcode says. Reading exitcode reaps, so a child that died since the last
                # wait (one the heartbeat judge just killed) would never be reported.
                if c.process is not None:
                    objs.append(c.process.sentinel)
                    by_sentinel[c.process.sentinel] = c
                if c.ready_conn is not None and not c.ready and c.process is not None:
                    objs.append(c.ready_conn)
            waits = (self._next_restart_in(), self.health.interval_s if self.health else None)
            timeouts = [t for t in waits if t is not None]
            for obj in wait(objs, timeout=min(timeouts, default=None)):  # type: ignore[arg-type]
                if obj is self._wake_r:
                    self._wake_r.recv(64)
                elif obj in by_sentinel:
                    c = by_sentinel[obj]
                    if c.managed:
                        continue  # NOTE: model control stopped or is stopping it.
                    if c.role == "frontend" and on_frontend_death is not None:
                        c.process.join(timeout=JOIN_TIMEOUT_S)  # type: ignore[union-attr]
                        on_frontend_death(c)
                        continue
                    if c.role != "worker":
                        self._log_fatal(c)
                        return c
                    self._worker_died(c, on_worker_death)
                else:
                    self._restarted_handshake(obj)  # type: ignore[arg-type]
            self._restart_due()
            self._kill_hung()
        return None

    def _log_fatal(self, c: Child) -> None:
        assert c.process is not None
        c.process.join(timeout=JOIN_TIMEOUT_S)
        log.error(
            "%s %s died with exit code %s%s; stopping the server",
            c.role,
            c.name,
            c.process.exitcode,
            " after it hung" if c.hung_s else "",
        )

    def _worker_died(self, c: Child, on_worker_death: WorkerDeath) -> None:
        assert c.process is not None
        # NOTE: the sentinel can fire a moment before the exit status is collectable.
        c.process.join(timeout=JOIN_TIMEOUT_S)
        code = c.process.exitcode if c.process.exitcode is not None else -1
        reason = (
            f"was unresponsive (no heartbeat for {c.hung_s:.1f} s) and was killed"
            if c.hung_s
            else ""
        )
        log.warning(
            "worker %s died with exit code %d%s",
            c.name,
            code,
            f" ({reason})" if reason else "",
            extra=c.fields,
        )
        on_worker_death(c, c.process.pid or 0, code, reason)
        c.process = None
        if c.restarts >= MAX_RESTARTS:
            log.error(
                "instance %s failed %d times; not restarting it", c.name, c.restarts, extra=c.fields
            )
            return
        first_s, max_s = RESTART_BACKOFF_S
        c.restart_at = time.monotonic() + min(first_s * 2**c.restarts, max_s)
        c.restarts += 1

    def _next_restart_in(self) -> float | None:
        children = [c for c in self.children() if not c.managed]
        due = [c.restart_at for c in children if c.process is None and c.restart_at]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _restart_due(self) -> None:
        now = time.monotonic()
        for c in [c for c in self.children() if not c.managed]:
            if c.process is None and c.restart_at and c.restart_at <= now:
                c.restart_at = 0.0
                log.info("restarting worker %s (attempt %d)", c.name, c.restarts, extra=c.fields)
                self.spawn(c)

    def _restarted_handshake(self, conn: Connection) -> None:
        c = next((c for c in self.children() if c.ready_conn is conn), None)
        if c is None:
            return
        if isinstance(read_handshake(conn), Ready):
            c.ready = True
            c.restarts = 0
            log.info("worker %s restarted", c.name, extra=c.fields)
        else:
            c.ready = True  # NOTE: no more messages; the sentinel reports the exit.

    def _kill_hung(self) -> None:
        """Kill every child the heartbeat judge finds hung; its sentinel then fires and the
        usual death handling runs (a worker or frontend restarts, the scheduler stops the
        server)."""
        if self.health is None:
            return
        for c, silent_s in self.health.hung([c for c in self.children() if not c.managed]):
            assert c.process is not None
            c.hung_s = silent_s
            log.error(
                "%s %s (pid %d) sent no heartbeat for %.1f s (--heartbeat-timeout-secs "
                "%g): it is hung; killing it",
                c.role,
                c.name,
                c.process.pid,
                silent_s,
                self.health.timeout_s,
                extra=c.fields,
            )
            c.process.kill()

    # ------------------------------------------------------------- shutdown
    def stop_frontends(self, drain: bool, deadline: float) -> bool:
        """SIGTERM every frontend (it drains until its own exit timeout; SIGKILL when
        ``drain`` is False), wait for them until ``deadline`` (``time.monotonic()``) plus
        ``FRONTEND_STOP_MARGIN_S``, and kill those still running then. Returns whether one
        had to be killed or cut calls at its exit timeout (exited ``CALLS_CUT_EXIT``)."""
        frontends = self.children("frontend")
        seen: list[BaseProcess] = []
        for c in frontends:
            p = c.process  # NOTE: a restart on the change thread may set it to None meanwhile
            if p is not None:
                seen.append(p)
                if p.is_alive():
                    if drain:
                        p.terminate()
                    else:
                        p.kill()
        killed = self._join_until(frontends, deadline + FRONTEND_STOP_MARGIN_S)
        cut = [p.pid for p in seen if p.exitcode == CALLS_CUT_EXIT]
        if cut:
            log.warning("frontend pid(s) %s cut calls at the exit timeout", cut)
        return killed or bool(cut)

    def crashed_frontends(self) -> list[int]:
        """Pids of frontends that a signal the stop did not send ended (not SIGTERM, its drain,
        nor SIGKILL, its kill): a crash while draining, whose calls were lost unanswered."""
        sent = (-signal.SIGTERM, -signal.SIGKILL)
        return [
            p.pid
            for c in self.children("frontend")
            if (p := c.process) is not None
            and p.pid is not None
            and p.exitcode is not None
            and p.exitcode < 0
            and p.exitcode not in sent
        ]

    def kill_workers(self) -> None:
        """SIGKILL every worker (nothing else can stop them once the scheduler is dead)."""
        for c in self.children("worker"):
            self.kill(c)

    def join_all(self, deadline: float) -> bool:
        """Wait until ``deadline`` (``time.monotonic()``) for every child to exit; kill what
        lingers. Returns whether one had to be killed."""
        return self._join_until(self.children(), deadline)

    def _join_until(self, children: list[Child], deadline: float) -> bool:
        killed = False
        for c in children:
            p = c.process
            if p is None:
                continue
            # NOTE: the process seen, not ``c.process`` again: a frontend's restart (change
            # thread) that the stop failed sets it to None at any time. And its sentinel
            # says whether it exited, not ``is_alive()``: that restart may reap the same
            # process meanwhile (``_handshake``), and the thread that loses the waitpid
            # race sees no exit code, so is_alive() stayed True for a process already gone
            # and a Ctrl-C during a frontend's restart "killed" it and exited 1.
            if wait([p.sentinel], timeout=max(0.0, deadline - time.monotonic())):
                p.join(timeout=JOIN_TIMEOUT_S)
                continue
            log.warning("%s %s did not stop; killing it", c.role, c.name)
            _kill(p)
            killed = True
        return killed


def _kill(p: BaseProcess) -> None:
    """SIGKILL ``p`` unless it exited, and reap it."""
    if p.is_alive() and not wait([p.sentinel], timeout=0):
        p.kill()
        p.join(timeout=JOIN_TIMEOUT_S)


def stop_resource_tracker() -> None:
    """Stop multiprocessing's resource tracker (the helper process ``spawn`` starts in the
    supervisor) and reap it; called once every child has exited.

    NOTE: left running, it exits only after the supervisor, as an orphan that the machine's
    init must reap; until then the server's process group still exists (``kill -0 -PGID``),
    and whoever waits for the group to be gone (a test, a container runtime) waited for that
    init: about 2 s per stop on this project's machines. ``_stop`` is CPython's own (3.8+):
    it closes the tracker's pipe, which it takes as "unregister nothing more, clean up what
    is left, exit", then waits for it.
    """
    from multiprocessing import resource_tracker  # noqa: PLC0415 - only at shutdown

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop is not None:
        stop()
