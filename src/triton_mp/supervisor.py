"""The supervisor: ``triton-mp start`` itself.

Loads the model repository, creates every IPC object under ``/triton_mp_<pid>_*``, spawns the
scheduler, one worker per model instance and the frontends, waits for each to report ready
(a message with a deadline, never a sleep), then watches every child in one place. A dead
worker is reported to the scheduler (which fails its in-flight requests with UNAVAILABLE) and
restarted with backoff; a dead frontend or scheduler stops the server. SIGINT/SIGTERM drain:
frontends finish accepted requests within ``--exit-timeout-secs``, then the scheduler and
the workers stop, then every shared-memory object of this server is unlinked.
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
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from triton_mp.common.config import ServerConfig
from triton_mp.common.errors import StartupError
from triton_mp.common.platform import die_with_parent, set_process_title, tune_malloc
from triton_mp.ipc import Ring, Sender, encode, sweep_stale
from triton_mp.ipc.handshake import Ready, Role, StartFailed, read_handshake
from triton_mp.ipc.heartbeat import HeartbeatBoard, start_beating
from triton_mp.ipc.messages import Shutdown, WorkerDied
from triton_mp.ipc.notify import Wakeup, WakeupKind, create_wakeup
from triton_mp.ipc.shm import list_objects, remove_entry
from triton_mp.ipc.specs import (
    ChannelSpec,
    FrontendSpec,
    InboxSpec,
    LogSpec,
    MetricsSpec,
    SchedulerSpec,
    WorkerSpec,
)
from triton_mp.ipc.topology import Topology
from triton_mp.model_manager import ModelManager

log = logging.getLogger(__name__)

MAX_RESTARTS = 5
"""Consecutive failed restarts of one instance before its model is given up."""
HEARTBEAT_SLOTS = 4096
"""Room on the heartbeat board (8 bytes a child); children beyond it are not judged."""


def _probe_port(service: str, address: str, port: int) -> None:
    """Bind ``address:port`` for a moment (port 0: nothing to check).

    Raises:
        StartupError: the address is in use, worded as Triton's
            ``failed to start <service> service: Socket '<address>:<port>' already in use``.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # NOTE: as the servers themselves bind (grpc, aiohttp): connections of a server that
        # just stopped, still in TIME_WAIT, must not count as the port being in use; a
        # listening socket still does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as e:
            raise StartupError(
                f"failed to start {service} service: Socket '{address}:{port}' "
                f"already in use ({e.strerror})"
            ) from None


@dataclass
class _Child:
    role: Role
    name: str
    spec_bytes: bytes
    env: dict[str, str] = field(default_factory=dict)
    process: BaseProcess | None = None
    ready_conn: Connection | None = None
    ready: bool = False
    restarts: int = 0
    restart_at: float = 0.0
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
    """The model manager starts or stops it now: the watch loop leaves it alone."""

    @property
    def fields(self) -> dict[str, str]:
        """``extra`` for log lines about this child: its model and instance."""
        return {"model": self.model, "instance": self.name} if self.role == "worker" else {}


def _child_main(
    role: Role,
    name: str,
    parent_pid: int,
    spec_bytes: bytes,
    conn: Connection,
    env: dict[str, str],
    heartbeat: tuple[str, int, float] | None = None,
) -> None:
    """Entry of every child process: import only the role's own module, then run it.

    ``heartbeat`` is ``(board name, slot, interval_s)``: a thread beats the slot from the
    start (``ipc.heartbeat``), so a child whose interpreter stops responding is found.

    NOTE: importing lazily here keeps grpc out of workers, onnxruntime out of frontends,
    and both out of the supervisor.
    """
    die_with_parent(parent_pid)
    if heartbeat is not None:
        start_beating(*heartbeat)
    set_process_title(role, name)
    os.environ.update(env)
    tune_malloc()
    if role == "frontend":
        from triton_mp.frontend.main import run_frontend as run
    elif role == "scheduler":
        from triton_mp.scheduler.main import run_scheduler as run
    else:
        from triton_mp.workers.main import run_worker as run
    raise SystemExit(run(spec_bytes, conn))


class Supervisor:
    """Runs one triton-mp server (see the module docstring).

    Args:
        config: validated ``triton-mp start`` flags.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.server_id = str(os.getpid())
        self.topology = Topology(self.server_id)
        self._ctx = mp.get_context("spawn")
        self._log = LogSpec(config.log_verbose, config.log_format)
        self._stop_requested = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._children: list[_Child] = []
        self._children_lock = threading.Lock()
        self._scheduler_lock = threading.Lock()
        self._drain_frontends = True
        self._heartbeats: HeartbeatBoard | None = None

    # ------------------------------------------------------------------ IPC
    def _ring(self, name: str, capacity_bytes: int = 0) -> str:
        Ring.create(name, capacity_bytes or self.config.ring_bytes).close()
        return name

    def _wakeup(self, kind: WakeupKind, name: str) -> Wakeup:
        return create_wakeup(kind, name)

    # ------------------------------------------------------------- children
    def _spawn(self, child: _Child) -> None:
        # NOTE: a frontend's pipe stays open as its control pipe (model_manager).
        recv_end, send_end = self._ctx.Pipe(duplex=child.role == "frontend")
        proc = self._ctx.Process(
            target=_child_main,
            args=(
                child.role,
                child.name,
                os.getpid(),
                child.spec_bytes,
                send_end,
                child.env,
                self._heartbeat_for(child),
            ),
            name=f"triton-mp {child.role} {child.name}",
        )
        proc.start()
        send_end.close()
        log.info("started %s %s (pid %d)", child.role, child.name, proc.pid, extra=child.fields)
        child.process = proc
        child.ready_conn = recv_end
        child.ready = False

    def _await_ready(self, children: list[_Child], timeout_s: float) -> dict[str, str]:
        """Wait for each child's ready message; returns {name: error} for those that failed."""
        deadline = time.monotonic() + timeout_s
        waiting = {c.ready_conn: c for c in children if c.ready_conn is not None}
        errors: dict[str, str] = {}
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for c in waiting.values():
                    errors[c.name] = f"{c.role} {c.name} did not report ready within {timeout_s}s"
                    self._kill(c)
                break
            sentinels = {c.process.sentinel: c for c in waiting.values() if c.process}
            ready_list = wait(list(waiting) + list(sentinels), timeout=remaining)
            for obj in ready_list:
                found = waiting.get(obj) if isinstance(obj, Connection) else sentinels.get(obj)  # type: ignore[arg-type]
                if found is None:
                    continue
                c = found
                if c.ready_conn not in waiting:
                    continue
                msg = read_handshake(c.ready_conn)
                if isinstance(msg, Ready):
                    c.ready = True
                else:
                    assert c.process is not None
                    c.process.join(timeout=5)
                    errors[c.name] = (
                        msg.reason
                        if isinstance(msg, StartFailed)
                        else f"{c.role} {c.name} exited with code {c.process.exitcode} before ready"
                    )
                del waiting[c.ready_conn]
        return errors

    def _kill(self, c: _Child) -> None:
        if c.process is not None and c.process.is_alive():
            c.process.kill()
            c.process.join(timeout=5)

    # ----------------------------------------------------------- heartbeats
    @property
    def _heartbeat_interval_s(self) -> float:
        """How often children beat and the supervisor looks: a quarter of the timeout,
        at most 1 s."""
        return min(1.0, self.config.heartbeat_timeout_s / 4)

    def _heartbeat_for(self, child: _Child) -> tuple[str, int, float] | None:
        """Give ``child`` a slot (once), clear it for a fresh start, and return what
        ``_child_main`` needs to beat it; None when heartbeats are off or the board is full."""
        board = self._heartbeats
        if board is None:
            return None
        if child.slot < 0:
            # NOTE: the model manager's thread spawns too (model_manager).
            with self._children_lock:
                used = {c.slot for c in self._children}
                child.slot = next((i for i in range(board.slots) if i not in used), -1)
            if child.slot < 0:
                log.warning("no heartbeat slot left for %s %s", child.role, child.name)
                return None
        board.reset(child.slot)
        child.judged_since_ns = 0
        child.hung_s = 0.0
        return (board.segment.name, child.slot, self._heartbeat_interval_s)

    def _check_heartbeats(self) -> None:
        """Kill every ready child silent for longer than ``--heartbeat-timeout-secs``.

        Its sentinel then fires and the usual death handling runs: a worker's in-flight
        requests fail with UNAVAILABLE and it is restarted; a frontend or the scheduler
        stops the server. A child is judged only once it reported ready (loading a model
        has ``startup_timeout_s``), from the moment the supervisor first saw it ready.
        """
        board = self._heartbeats
        timeout_s = self.config.heartbeat_timeout_s
        if board is None:
            return
        now = time.monotonic_ns()
        with self._children_lock:
            children = [c for c in self._children if not c.managed]
        for c in children:
            p = c.process
            if p is None or c.slot < 0 or not c.ready or c.hung_s or p.exitcode is not None:
                continue
            if not c.judged_since_ns:
                c.judged_since_ns = now
                continue
            silent_s = board.silent_for_s(c.slot, c.judged_since_ns, now)
            if silent_s > timeout_s:
                c.hung_s = silent_s
                log.error(
                    "%s %s (pid %d) sent no heartbeat for %.1f s (--heartbeat-timeout-secs "
                    "%g): it is hung; killing it",
                    c.role,
                    c.name,
                    p.pid,
                    silent_s,
                    timeout_s,
                    extra=c.fields,
                )
                p.kill()

    def _next_heartbeat_check_in(self) -> float | None:
        return self._heartbeat_interval_s if self._heartbeats is not None else None

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        """Start everything, serve until a signal, shut down. Returns the exit status."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        sweep_stale(self.server_id)
        if self.config.heartbeat_timeout_s > 0:
            self._heartbeats = HeartbeatBoard.create(self.topology.heartbeat(), HEARTBEAT_SLOTS)
        try:
            return self._run()
        finally:
            self._stop_all()
            for name in list_objects(self.server_id):
                remove_entry(name)
            log.info("server stopped; shared memory removed")

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._stop_requested:
            return
        self._stop_requested = True
        log.info("received %s: draining", signal.Signals(signum).name)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _check_port_free(self) -> None:
        """Fail fast, before loading any model, when a port the server needs is taken (gRPC
        frontends bind with SO_REUSEPORT, which would otherwise share it silently with
        another server; the metrics port would only fail once every model has loaded).

        Raises:
            StartupError: an address is in use.
        """
        cfg = self.config
        _probe_port("GRPC", cfg.grpc_address, cfg.grpc_port)
        if cfg.allow_http:
            _probe_port("HTTP", cfg.http_address, cfg.http_port)
        if cfg.allow_metrics:
            _probe_port("Metrics", self._metrics_address, cfg.metrics_port)

    @property
    def _metrics_address(self) -> str:
        return self.config.metrics_address or self.config.http_address

    def _run(self) -> int:
        cfg = self.config
        self._check_port_free()
        n_fe = cfg.frontend_processes
        top = self.topology
        fe_inbox_rings = [self._ring(top.frontend_inbox_ring(i)) for i in range(n_fe)]
        sup_ring = self._ring(top.supervisor_ring())
        sched_sem = self._wakeup("semaphore", top.scheduler_wakeup())
        # NOTE: frontends run asyncio loops that watch a FIFO; see ipc/notify.py.
        fe_sems = {i: self._wakeup("fifo", top.frontend_wakeup(i)) for i in range(n_fe)}
        to_frontends_from_sched = {
            i: ChannelSpec(self._ring(top.scheduler_to_frontend(i)), fe_sems[i])
            for i in range(n_fe)
        }
        # NOTE: client shared-memory registrations go from frontend to frontend directly.
        peer_rings = {
            (i, j): self._ring(top.frontend_to_frontend(i, j), cfg.answer_ring_bytes)
            for i in range(n_fe)
            for j in range(n_fe)
            if i != j
        }
        # NOTE: the scheduler starts with no model; every instance, at start or later, is
        # wired to it by InstancesAdded / VersionsActivated (model_manager).
        scheduler = _Child(
            "scheduler",
            "scheduler",
            encode(
                SchedulerSpec(
                    models=(),
                    # NOTE: the supervisor's ring first: a pass sees a model change before
                    # the requests that followed it (see SchedulerCore.defer_unknown).
                    inbox=InboxSpec(sched_sem, (sup_ring, *fe_inbox_rings)),
                    to_workers={},
                    to_frontends=to_frontends_from_sched,
                    log=self._log,
                )
            ),
        )
        self._children.append(scheduler)
        self._spawn(scheduler)
        errors = self._await_ready([scheduler], cfg.startup_timeout_s)
        if errors:
            raise StartupError(errors["scheduler"])
        self._to_scheduler = Sender(sup_ring, sched_sem)

        self.models = ModelManager(self, n_fe, sched_sem, fe_sems)
        self.models.load_at_start(self._models_at_start())

        self._frontends = []
        for i in range(n_fe):
            spec_fe = FrontendSpec(
                frontend_id=i,
                grpc_address=cfg.grpc_address,
                grpc_port=cfg.grpc_port,
                http_address=cfg.http_address,
                http_port=cfg.http_port,
                allow_http=cfg.allow_http,
                server_name=cfg.server_id_name,
                models=self.models.entries(),
                inbox=InboxSpec(
                    fe_sems[i],
                    (
                        to_frontends_from_sched[i].ring,
                        *(peer_rings[(j, i)] for j in range(n_fe) if j != i),
                        *self.models.frontend_rings(i),
                    ),
                ),
                to_scheduler=ChannelSpec(fe_inbox_rings[i], sched_sem),
                to_peers={
                    j: ChannelSpec(peer_rings[(i, j)], fe_sems[j]) for j in range(n_fe) if j != i
                },
                arena_prefix=top.frontend_arenas(i),
                arena_bytes=cfg.input_arena_bytes,
                arena_budget_bytes=cfg.arena_budget_bytes,
                exit_timeout_s=cfg.exit_timeout_s,
                model_control_mode=cfg.model_control_mode,
                allow_client_shm=cfg.allow_client_shm,
                client_shm_prefix=cfg.client_shm_prefix,
                grpc_restricted=cfg.grpc_restricted,
                http_restricted=cfg.http_restricted,
                log=self._log,
                # NOTE: Triton has one metrics endpoint; frontend 0 serves it for the server.
                metrics=MetricsSpec(
                    address=self._metrics_address,
                    port=cfg.metrics_port,
                    cpu_metrics=cfg.allow_cpu_metrics,
                    interval_ms=cfg.metrics_interval_ms,
                    server_id=self.server_id,
                )
                if cfg.allow_metrics and i == 0
                else None,
                repository=str(cfg.repository_path),
            )
            child = _Child("frontend", str(i), encode(spec_fe))
            self._frontends.append(child)
            self.add_children([child])
            self._spawn(child)
        errors = self._await_ready(self._frontends, cfg.startup_timeout_s)
        if errors:
            raise StartupError("; ".join(errors.values()))
        self.models.attach_frontends(
            {i: c.ready_conn for i, c in enumerate(self._frontends) if c.ready_conn is not None}
        )
        log.info(
            "triton-mp serving %d models (%d instances) on gRPC %s:%d with %d frontend(s), "
            "model control mode %s",
            self.models.ready_model_count(),
            self.models.instance_count(),
            cfg.grpc_address,
            cfg.grpc_port,
            n_fe,
            cfg.model_control_mode,
        )
        return self._watch(scheduler)

    def _models_at_start(self) -> list[str]:
        """The models to load at start: all (none, poll, explicit with ``*``) or the
        ``--load-model`` ones (explicit)."""
        cfg = self.config
        repo = cfg.repository_path
        if not repo.is_dir():
            raise StartupError(f"failed to stat file {repo}: model repository not found")
        present = sorted(
            p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
        if cfg.model_control_mode != "explicit" or "*" in cfg.load_models:
            return present
        # NOTE: Triton's explicit mode loads only --load-model models at start.
        for name in sorted(set(cfg.load_models) - set(present)):
            log.error("failed to load '%s': model not found in the repository", name)
        return [n for n in present if n in set(cfg.load_models)]

    # ------------------------------------------------- the model manager's host
    @property
    def log_spec(self) -> LogSpec:
        """The children's log settings."""
        return self._log

    @property
    def stopping(self) -> bool:
        """A stop signal arrived."""
        return self._stop_requested

    def make_worker(self, spec: WorkerSpec) -> _Child:
        """A worker child for ``spec``, managed by the model manager until released."""
        w = spec.instance
        env = {"CUDA_VISIBLE_DEVICES": str(w.gpu_id)} if w.kind == "KIND_GPU" else {}
        return _Child(
            "worker",
            w.name,
            encode(spec),
            env,
            model=w.model,
            instance_id=w.instance_id,
            managed=True,
        )

    def spawn(self, child: _Child) -> None:
        """Start a child process (see ``_spawn``)."""
        if self._stop_requested:
            return
        self._spawn(child)

    def await_ready(self, children: list[_Child], timeout_s: float) -> dict[str, str]:
        """Wait for each child's ready message (see ``_await_ready``)."""
        return self._await_ready([c for c in children if c.process is not None], timeout_s)

    def kill(self, child: _Child) -> None:
        """SIGKILL a child and reap it."""
        self._kill(child)

    def add_children(self, children: Iterable[_Child]) -> None:
        """Register children with the watch loop."""
        with self._children_lock:
            self._children.extend(children)
        self._wake_watch()

    def remove_children(self, children: Iterable[_Child]) -> None:
        """Forget children that exited for good."""
        gone = {id(c) for c in children}
        with self._children_lock:
            self._children = [c for c in self._children if id(c) not in gone]

    def release_children(self, children: Iterable[_Child]) -> None:
        """Hand children to the watch loop (restarted when they die)."""
        with self._children_lock:
            for c in children:
                c.managed = False
        self._wake_watch()

    def claim_children(self, children: Iterable[_Child]) -> None:
        """Take children back from the watch loop: they are about to stop for good."""
        with self._children_lock:
            for c in children:
                c.managed = True

    def send_scheduler(self, msg: object) -> None:
        """Push a message to the scheduler from any thread."""
        with self._scheduler_lock:
            self._to_scheduler.send(msg)

    def ring(self, name: str, capacity_bytes: int = 0) -> str:
        """Create a ring (see ``_ring``; ``capacity_bytes`` 0: ``ring_bytes``)."""
        return self._ring(name, capacity_bytes)

    def wakeup(self, kind: WakeupKind, name: str) -> Wakeup:
        """Create a wake-up object."""
        return self._wakeup(kind, name)

    def _wake_watch(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _watch(self, scheduler: _Child) -> int:
        """Watch every child until a stop signal or a fatal death. Returns the exit status."""
        status = 0
        while not self._stop_requested:
            objs: list[object] = [self._wake_r]
            by_sentinel = {}
            with self._children_lock:
                children = [c for c in self._children if not c.managed]
            for c in children:
                # NOTE: a dead child's sentinel stays readable: watch it whatever its
                # exitcode says. Reading exitcode reaps, so a child that died since the last
                # wait (one the heartbeat judge just killed) would never be reported.
                if c.process is not None:
                    objs.append(c.process.sentinel)
                    by_sentinel[c.process.sentinel] = c
                if c.ready_conn is not None and not c.ready and c.process is not None:
                    objs.append(c.ready_conn)
            waits = (self._next_restart_in(), self._next_heartbeat_check_in())
            timeouts = [t for t in waits if t is not None]
            fired = wait(objs, timeout=min(timeouts, default=None))  # type: ignore[arg-type]
            for obj in fired:
                if obj is self._wake_r:
                    self._wake_r.recv(64)
                elif obj in by_sentinel:
                    c = by_sentinel[obj]
                    if c.managed:
                        continue  # NOTE: the model manager stopped or is stopping it.
                    if c.role != "worker":
                        assert c.process is not None
                        c.process.join(timeout=5)
                        log.error(
                            "%s %s died with exit code %s%s; stopping the server",
                            c.role,
                            c.name,
                            c.process.exitcode,
                            " after it hung" if c.hung_s else "",
                        )
                        if c.role == "scheduler":
                            # NOTE: nothing in flight can finish without the scheduler;
                            # draining would only hold clients until the exit timeout.
                            self._drain_frontends = False
                        return 1
                    self._worker_died(c)
                else:
                    self._worker_ready_msg(obj)  # type: ignore[arg-type]
            self._restart_due()
            self._check_heartbeats()
        return status

    def _worker_died(self, c: _Child) -> None:
        assert c.process is not None
        # NOTE: the sentinel can fire a moment before the exit status is collectable.
        c.process.join(timeout=5)
        code = c.process.exitcode if c.process.exitcode is not None else -1
        iid = c.instance_id
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
        # NOTE: its output arenas are named after its pid; frontends that still read a block
        # keep their mapping, so removing the names is safe and frees the memory later.
        pid = c.process.pid or 0
        for name in self.topology.of_worker_process(list_objects(self.server_id), iid, pid):
            remove_entry(name)
        self.send_scheduler(WorkerDied(instance_id=iid, exitcode=code, reason=reason))
        c.process = None
        if c.restarts >= MAX_RESTARTS:
            log.error(
                "instance %s failed %d times; not restarting it", c.name, c.restarts, extra=c.fields
            )
            return
        c.restart_at = time.monotonic() + min(0.1 * 2**c.restarts, 10.0)
        c.restarts += 1

    def _next_restart_in(self) -> float | None:
        with self._children_lock:
            children = [c for c in self._children if not c.managed]
        due = [c.restart_at for c in children if c.process is None and c.restart_at]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _restart_due(self) -> None:
        now = time.monotonic()
        with self._children_lock:
            children = [c for c in self._children if not c.managed]
        for c in children:
            if c.process is None and c.restart_at and c.restart_at <= now:
                c.restart_at = 0.0
                log.info("restarting worker %s (attempt %d)", c.name, c.restarts, extra=c.fields)
                self._spawn(c)

    def _worker_ready_msg(self, conn: Connection) -> None:
        with self._children_lock:
            c = next((c for c in self._children if c.ready_conn is conn), None)
        if c is None:
            return
        if isinstance(read_handshake(conn), Ready):
            c.ready = True
            c.restarts = 0
            log.info("worker %s restarted", c.name, extra=c.fields)
        else:
            c.ready = True  # NOTE: no more messages; the sentinel reports the exit.

    # ------------------------------------------------------------- shutdown
    def _stop_all(self) -> None:
        """Drain frontends, then stop the scheduler and workers; kill what lingers."""
        cfg = self.config
        for c in getattr(self, "_frontends", []):
            if c.process is not None and c.process.is_alive():
                if self._drain_frontends:
                    c.process.terminate()  # SIGTERM: the frontend drains
                else:
                    c.process.kill()
        for c in getattr(self, "_frontends", []):
            if c.process is not None:
                c.process.join(timeout=cfg.exit_timeout_s + 5)
        manager = getattr(self, "models", None)
        if manager is not None:
            manager.close()
        sender = getattr(self, "_to_scheduler", None)
        scheduler = next((c for c in self._children if c.role == "scheduler"), None)
        if (
            scheduler is not None
            and scheduler.process is not None
            and not scheduler.process.is_alive()
        ):
            # NOTE: workers stop when the scheduler relays Shutdown and ignore SIGTERM;
            # with the scheduler dead, nothing would reach them: do not wait for them.
            for c in self._children:
                if c.role == "worker":
                    self._kill(c)
        elif sender is not None:
            try:
                self.send_scheduler(Shutdown())
            except Exception:  # noqa: BLE001 - the scheduler may be dead already
                log.warning("could not tell the scheduler to stop")
        deadline = time.monotonic() + 10
        with self._children_lock:
            children = list(self._children)
        for c in children:
            if c.process is not None:
                c.process.join(timeout=max(0.1, deadline - time.monotonic()))
                if c.process.is_alive():
                    log.warning("%s %s did not stop; killing it", c.role, c.name)
                    self._kill(c)
