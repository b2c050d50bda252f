"""The supervisor: ``triton-mp start`` itself. Bootstrap, signals, ordered shutdown.

Imported by ``cli.main``. ``Supervisor.run`` creates the server-wide IPC objects
(``supervisor.processes.wiring``, named by ``ipc.memory.topology``), spawns the frontend processes
(they import their code meanwhile), spawns the scheduler, loads the models
(``supervisor.models.model_control``: one worker per model instance) and hands the
frontends their specs, waiting for each child's start handshake (``ipc.handshake``, with
``--startup-timeout-secs``, never a sleep), then watches every child in one place
(``supervisor.processes.children``). A dead worker is reported to the scheduler (which
fails its in-flight requests with UNAVAILABLE) and restarted with backoff; a dead frontend
is restarted in its place while the others serve (``supervisor.processes.frontend_restart``);
a dead scheduler stops the server. SIGINT/SIGTERM
drain: frontends finish accepted requests, then the scheduler and the workers stop, all within
``--exit-timeout-secs`` of the signal (one budget, as tritonserver's: what still runs then is
killed, and the server exits 1 as 2.51 does; so does a frontend's stop that had to cancel gRPC
calls, answers not sent by then: ``ipc.handshake.CALLS_CUT_EXIT``), then every shared-memory
object of this server is unlinked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from typing import NoReturn

from triton_mp.common.config import ServerConfig
from triton_mp.common.errors import StartupError
from triton_mp.common.process import process_dirs
from triton_mp.common.process.gpus import Devices, discover
from triton_mp.ipc import Sender, encode
from triton_mp.ipc.memory.topology import Topology
from triton_mp.ipc.protocol.control_messages import ModelEntry
from triton_mp.ipc.protocol.messages import Shutdown, WorkerDied
from triton_mp.ipc.protocol.specs import (
    ChannelSpec,
    FrontendSpec,
    GrpcTls,
    InboxSpec,
    MetricsSpec,
    SchedulerSpec,
    current_log_spec,
)
from triton_mp.supervisor.models.load_requests import models_at_start
from triton_mp.supervisor.models.model_control import ModelControl
from triton_mp.supervisor.processes.children import Child, ChildTable, stop_resource_tracker
from triton_mp.supervisor.processes.frontend_link import FrontendLink
from triton_mp.supervisor.processes.frontend_restart import FrontendRestarts
from triton_mp.supervisor.processes.health import HEARTBEAT_SLOTS, Health
from triton_mp.supervisor.processes.instances import Instances
from triton_mp.supervisor.processes.start_signal import (
    StartInterrupted,
    die_by,
    kill_children,
    resource_tracker_pid,
)
from triton_mp.supervisor.processes.wiring import ServerChannels, Wiring

log = logging.getLogger(__name__)

STOP_GRACE_S = 1.0
"""How long the scheduler and workers get to stop after ``Shutdown`` when the exit deadline
(``--exit-timeout-secs`` after the signal) has passed already; before it, they have until it.
Those still running then are killed."""

EXIT_TIMEOUT_EXPIRED = (
    "failed to stop server: Internal - Exit timeout expired. Exiting immediately."
)
"""tritonserver 2.51's words (main.cc, from core's ``InferenceServer::Stop``) when its exit
timeout ran out with requests in flight or models not unloaded; it then exits with 1."""


def probe_port(service: str, address: str, port: int) -> None:
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


def failed_at_start(entries: tuple[ModelEntry, ...]) -> list[str]:
    """The models that failed to load (a version failed, or the model as a whole: no ready
    version and a reason), for ``--exit-on-error``."""
    return [
        e.name
        for e in entries
        if e.failed_versions or (e.reason and not e.ready_versions and not e.unloaded)
    ]


class Supervisor:
    """Runs one triton-mp server (see the module docstring).

    Args:
        config: validated ``triton-mp start`` flags.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.server_id = str(os.getpid())
        self.topology = Topology(self.server_id)
        self.wiring = Wiring(config, self.topology)
        self.children = ChildTable()
        self._scheduler_lock = threading.Lock()
        self._to_scheduler: Sender | None = None
        self._drain_frontends = True
        self._loading = True
        """Until the models at start have loaded: a signal then ends the start at once
        (``_abort_start``)."""
        self._stop_deadline: float | None = None
        """``time.monotonic()`` by which everything has stopped (the signal plus
        ``--exit-timeout-secs``); None until a signal."""
        self.models: ModelControl | None = None
        self._instances: Instances | None = None
        self.devices = Devices(min_compute_capability=config.min_compute_capability)

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        """Start everything, serve until a signal, shut down. Returns the exit status; a
        signal before the models have loaded ends the process by that signal instead
        (``supervisor.processes.start_signal``)."""
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._on_signal)
            return self._run_and_stop()
        except StartInterrupted as stop:
            self._abort_start(stop.signum)

    def _run_and_stop(self) -> int:
        """``run`` once the handlers are in: the start, serving, the ordered shutdown."""
        try:
            self.wiring.sweep_stale()
            # NOTE: the socket directories of frontends whose server was killed with -9
            process_dirs.sweep(process_dirs.NATIVE_GRPC)
            if self.config.heartbeat_timeout_s > 0:
                board = self.wiring.create_heartbeat_board(HEARTBEAT_SLOTS)
                self.children.health = Health(board, self.config.heartbeat_timeout_s)
            cache = self.config.cache
            if cache is not None and cache.kind == "local":
                # NOTE: the supervisor keeps no handle: remove_all unlinks it with the rest.
                self.wiring.create_response_cache(cache.size_bytes).close()
            status = self._run()
        except StartInterrupted:
            raise  # NOTE: run's _abort_start stops it all, with no drain
        except BaseException:
            self._stop_and_clean()
            raise
        return 1 if self._stop_and_clean() else status

    def _stop_and_clean(self) -> bool:
        """The ordered shutdown (``_stop_all``), then unlink this server's shared memory.
        Returns whether the stop was not clean: the exit deadline expired, or a frontend
        crashed while it drained (``_stop_all``)."""
        # NOTE: first: a signal from here on drains (a failed start's shutdown); one before
        # this line leaves for run's StartInterrupted.
        self._loading = False
        expired = self._stop_all()
        self.wiring.remove_all()
        stop_resource_tracker()
        log.info("server stopped; shared memory removed")
        return expired

    def _abort_start(self, signum: int) -> NoReturn:
        """A signal before the models loaded: SIGKILL every child (models being loaded
        included), unlink every shared-memory object and temporary directory of this
        server, then end by ``signum`` as 2.51 does (``start_signal``)."""
        log.info("received %s before serving: stopping the start", signal.Signals(signum).name)
        self.children.stopping = True
        for c in self.children.children():
            if c.process is not None and c.process.pid:
                with contextlib.suppress(OSError):
                    os.kill(c.process.pid, signal.SIGKILL)
        tracker = resource_tracker_pid()
        for pid in kill_children(set() if tracker is None else {tracker}):
            process_dirs.remove(process_dirs.NATIVE_GRPC, pid)
        if self.models is not None:
            try:
                self.models.close()  # NOTE: its temporary model directories
            except Exception:  # noqa: BLE001 - the start was cut anywhere: clean up and die
                log.exception("could not close model control")
        self.wiring.remove_all()
        stop_resource_tracker()
        die_by(signum)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._loading:
            # NOTE: 2.51 has no handler yet while its models load (start_signal); a second
            # signal while the start is torn down is ignored.
            self._loading = False
            self.children.stopping = True
            raise StartInterrupted(signum)
        if self.children.stopping:
            return
        self.children.stopping = True
        self._stop_deadline = time.monotonic() + self.config.exit_timeout_s
        log.info("received %s: draining", signal.Signals(signum).name)
        self.children.wake()

    def _stopping(self) -> bool:
        return self.children.stopping

    def _check_port_free(self) -> None:
        """Fail fast, before loading any model, when a port the server needs is taken (gRPC
        frontends bind with SO_REUSEPORT, which would otherwise share it silently with
        another server; the metrics port would only fail once every model has loaded).

        Raises:
            StartupError: an address is in use.
        """
        cfg = self.config
        if cfg.allow_grpc and not cfg.reuse_grpc_port:
            probe_port("GRPC", cfg.grpc_address, cfg.grpc_port)
        if cfg.allow_http and not cfg.reuse_http_port:
            probe_port("HTTP", cfg.http_address, cfg.http_port)
        if cfg.allow_metrics:
            probe_port("Metrics", self._metrics_address, cfg.metrics_port)

    @property
    def _metrics_address(self) -> str:
        return self.config.metrics_address or self.config.http_address

    def _spawn_spares(self, n: int) -> list[Child]:
        """Start ``n`` frontend processes with no spec yet: each imports grpc, aiohttp and
        numpy (about a CPU-second) while the scheduler and the models start, then waits for
        the spec of the frontend whose place it takes (``ChildTable.hand_over``) once the
        models are ready. A server that stops first stops them with the frontends."""
        spares = [Child("frontend", "spare", b"", managed=True) for _ in range(n)]
        self.children.add(spares)
        for spare in spares:
            self.children.spawn(spare)
        return spares

    def _run(self) -> int:
        cfg = self.config
        _grpc_tls(cfg)  # NOTE: refuse a TLS flag without its files before loading models
        self._check_port_free()
        # NOTE: once, before any model is read: instance groups are normalised for these.
        self.devices = discover(cfg.min_compute_capability)
        n_fe = cfg.frontend_processes
        early = self._spawn_spares(n_fe)
        channels = self.wiring.create_server(n_fe)
        self._start_scheduler(channels)
        link = FrontendLink(self._stopping)
        instances = Instances(
            cfg,
            self.wiring,
            self.children,
            link,
            self.send_scheduler,
            channels.scheduler_wakeup,
            channels.frontend_wakeups,
            self.devices,
        )
        self._instances = instances
        self.models = ModelControl(
            cfg, self.server_id, self.children, instances, link, self.send_scheduler, self._stopping
        )
        at_start = models_at_start(cfg)
        self.models.load_at_start(at_start)
        # NOTE: a --load-model name the repository lacks fails too (2.51 exits on it).
        unknown = set(cfg.load_models) - {"*"} - set(at_start)
        if cfg.exit_on_error and (unknown or failed_at_start(self.models.entries())):
            # NOTE: tritonserver's words (server.cc, exit_on_error); its models unload first
            # too, which _stop_all does.
            raise StartupError("creating server: Internal - failed to load all models")
        # NOTE: 2.51 installs its signal handler here, before its endpoints start: a signal
        # from now on drains.
        self._loading = False
        restarts = FrontendRestarts(
            self.children,
            link,
            self.models.on_change_thread,
            lambda i, first_id, counts: encode(self._frontend_spec(i, channels, first_id, counts)),
            self._on_frontend_gone,
            cfg.startup_timeout_s,
            n_fe,
            cfg.frontend_spare,
        )
        frontends = [Child("frontend", str(i), restarts.spec(i)) for i in range(n_fe)]
        self.children.add(frontends)
        for child, spare in zip(frontends, early, strict=True):
            if not self.children.hand_over(spare, child):
                self.children.spawn(child)
        errors = self.children.await_ready(frontends, cfg.startup_timeout_s)
        if errors:
            raise StartupError("; ".join(errors.values()))
        self.models.attach_frontends(
            {i: c.ready_conn for i, c in enumerate(frontends) if c.ready_conn is not None}
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
        restarts.keep_spare()
        fatal = self.children.watch(self._on_worker_death, restarts.died)
        if fatal is None:
            return 0
        if fatal.role == "scheduler":
            # NOTE: nothing in flight can finish without the scheduler; draining would only
            # hold clients until the exit timeout.
            self._drain_frontends = False
        return 1

    def _start_scheduler(self, channels: ServerChannels) -> None:
        """Spawn the scheduler and wait for its handshake.

        Raises:
            StartupError: it did not come up.
        """
        # NOTE: the scheduler starts with no model; every instance, at start or later, is
        # wired to it by InstancesAdded / VersionsActivated (model_control).
        spec = SchedulerSpec(
            models=(),
            # NOTE: the supervisor's ring first: a pass sees a model change before the
            # requests that followed it (see SchedulerCore.defer_unknown).
            inbox=InboxSpec(
                channels.scheduler_wakeup,
                (channels.supervisor_ring, *channels.frontend_inbox_rings),
            ),
            to_workers={},
            to_frontends=channels.scheduler_to_frontends,
            log=current_log_spec(),
            rate_limit=self.config.rate_limit == "execution_count",
            rate_limit_resources=self.config.rate_limit_resources,
        )
        scheduler = Child("scheduler", "scheduler", encode(spec))
        self.children.add([scheduler])
        self.children.spawn(scheduler)
        errors = self.children.await_ready([scheduler], self.config.startup_timeout_s)
        if errors:
            raise StartupError(errors["scheduler"])
        self._to_scheduler = Sender(channels.supervisor_ring, channels.scheduler_wakeup)

    def _frontend_spec(
        self,
        i: int,
        channels: ServerChannels,
        first_request_id: int = 1,
        restarts: dict[int, int] | None = None,
    ) -> FrontendSpec:
        """Frontend ``i``'s spec: its rings (from the scheduler, the other frontends and every
        serving instance), the model table, ports, limits, where its request ids start and
        the frontends' restart counts; frontend 0 also serves the metrics endpoint."""
        cfg = self.config
        assert self.models is not None
        others = [j for j in range(cfg.frontend_processes) if j != i]
        return FrontendSpec(
            frontend_id=i,
            grpc_address=cfg.grpc_address,
            grpc_port=cfg.grpc_port,
            http_address=cfg.http_address,
            http_port=cfg.http_port,
            allow_http=cfg.allow_http,
            server_name=cfg.server_id_name,
            models=self.models.entries(),
            inbox=InboxSpec(
                channels.frontend_wakeups[i],
                (
                    channels.scheduler_to_frontends[i].ring,
                    *(channels.peer_rings[(j, i)] for j in others),
                    *self.models.frontend_rings(i),
                ),
            ),
            to_scheduler=ChannelSpec(channels.frontend_inbox_rings[i], channels.scheduler_wakeup),
            direct_routes=self.models.direct_routes(i),
            to_peers={
                j: ChannelSpec(channels.peer_rings[(i, j)], channels.frontend_wakeups[j])
                for j in others
            },
            arena_prefix=self.topology.frontend_arenas(i),
            arena_bytes=cfg.input_arena_bytes,
            arena_budget_bytes=cfg.arena_budget_bytes,
            exit_timeout_s=cfg.exit_timeout_s,
            model_control_mode=cfg.model_control_mode,
            allow_client_shm=cfg.allow_client_shm,
            client_shm_prefix=cfg.client_shm_prefix,
            gpu_ids=tuple(g.cuda_id for g in self.devices.gpus),
            trace=cfg.trace,
            allow_grpc=cfg.allow_grpc,
            grpc_tls=_grpc_tls(cfg),
            grpc_channel_args=cfg.grpc_channel_args,
            grpc_compression_level=cfg.grpc_compression_level,
            grpc_frontend=cfg.grpc_frontend,
            http_max_input_bytes=cfg.http_max_input_bytes,
            grpc_header_forward_pattern=cfg.grpc_header_forward_pattern,
            http_header_forward_pattern=cfg.http_header_forward_pattern,
            strict_readiness=cfg.strict_readiness,
            grpc_restricted=cfg.grpc_restricted,
            http_restricted=cfg.http_restricted,
            log=current_log_spec(),
            # NOTE: Triton has one metrics endpoint; frontend 0 serves it for the server.
            metrics=MetricsSpec(
                address=self._metrics_address,
                port=cfg.metrics_port,
                cpu_metrics=cfg.allow_cpu_metrics,
                interval_ms=cfg.metrics_interval_ms,
                server_id=self.server_id,
                gpus=self.devices.gpus if cfg.allow_gpu_metrics else (),
            )
            if cfg.allow_metrics and i == 0
            else None,
            latency_histograms=cfg.allow_metrics
            and dict(cfg.metrics_config).get("histogram_latencies") == "true",
            repository=str(cfg.repository_path),
            cache=cfg.cache,
            cache_segment=self.topology.response_cache()
            if cfg.cache is not None and cfg.cache.kind == "local"
            else "",
            first_request_id=first_request_id,
            frontend_restarts=dict(restarts or {}),
        )

    def send_scheduler(self, msg: object) -> None:
        """Push a message to the scheduler from any thread."""
        assert self._to_scheduler is not None
        with self._scheduler_lock:
            self._to_scheduler.send(msg)

    def _on_worker_death(self, c: Child, pid: int, exitcode: int, reason: str) -> None:
        """Free a dead worker process's arenas and tell the scheduler (which fails its
        in-flight requests with UNAVAILABLE)."""
        self.wiring.remove_worker_process(c.instance_id, pid)
        segments = self.topology.worker_process_segments(c.instance_id, pid)
        self.send_scheduler(
            WorkerDied(
                instance_id=c.instance_id, exitcode=exitcode, reason=reason, segments=segments
            )
        )

    def _on_frontend_gone(self, frontend_id: int, pid: int, requests_below: int) -> None:
        """Free a dead frontend process's input arenas (unlink them, and every worker unmaps
        them), the workers' output blocks its replies held (``ipc.output_holds``) and its
        temporary directories, and have the workers cancel its requests (those of
        ``frontend_id`` with ids below ``requests_below``) (model control's change thread:
        ``supervisor.processes.frontend_restart``)."""
        process_dirs.remove(process_dirs.NATIVE_GRPC, pid)
        self.wiring.remove_frontend_process(frontend_id, pid)
        if self._instances is not None:
            self._instances.drop_segments(
                self.topology.frontend_process_segments(frontend_id, pid),
                holder=pid,
                frontend_id=frontend_id,
                requests_below=requests_below,
            )

    # ------------------------------------------------------------- shutdown
    def _stop_all(self) -> bool:
        """Drain frontends, then stop the scheduler and workers, by the exit deadline; kill
        what lingers. Returns whether the deadline expired with a child still running or a
        frontend's calls unfinished (then logged in tritonserver's words), or a frontend
        crashed while it drained (then logged as that): either makes the exit status 1."""
        deadline = self._stop_deadline
        if deadline is None:  # NOTE: no signal: a dead scheduler, a failed start
            deadline = time.monotonic() + self.config.exit_timeout_s
        expired = self.children.stop_frontends(self._drain_frontends, deadline)
        crashed = self.children.crashed_frontends()
        if crashed:
            log.error("frontend pid(s) %s died by a signal during the stop: the calls they "
                      "held were not answered", crashed)  # fmt: skip
        for c in self.children.children("frontend"):
            if c.process is not None and c.process.pid:
                # NOTE: one killed at the exit timeout (or before) never removed its own.
                process_dirs.remove(process_dirs.NATIVE_GRPC, c.process.pid)
        if self.models is not None:
            self.models.close()
        scheduler = next(iter(self.children.children("scheduler")), None)
        if (
            scheduler is not None
            and scheduler.process is not None
            and not scheduler.process.is_alive()
        ):
            # NOTE: workers stop when the scheduler relays Shutdown and ignore SIGTERM;
            # with the scheduler dead, nothing would reach them: do not wait for them.
            self.children.kill_workers()
        elif self._to_scheduler is not None:
            try:
                self.send_scheduler(Shutdown())
            except Exception:  # noqa: BLE001 - the scheduler may be dead already
                log.warning("could not tell the scheduler to stop")
        # NOTE: a worker still executing at the deadline never reads its Shutdown; tritonserver
        # exits then too (core InferenceServer::Stop), not after a further wait.
        expired |= self.children.join_all(max(deadline, time.monotonic() + STOP_GRACE_S))
        if expired:
            log.error(EXIT_TIMEOUT_EXPIRED)
        return expired or bool(crashed)


def _grpc_tls(cfg: ServerConfig) -> GrpcTls | None:
    """The frontends' TLS settings from ``--grpc-use-ssl*`` (None: plaintext).

    Raises:
        StartupError: TLS asked for without a server certificate and key.
    """
    if not (cfg.grpc_use_ssl or cfg.grpc_use_ssl_mutual):
        return None
    if not cfg.grpc_server_cert or not cfg.grpc_server_key:
        raise StartupError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if cfg.grpc_use_ssl_mutual and not cfg.grpc_root_cert:
        raise StartupError("--grpc-use-ssl-mutual needs --grpc-root-cert")
    return GrpcTls(
        server_cert=cfg.grpc_server_cert,
        server_key=cfg.grpc_server_key,
        root_cert=cfg.grpc_root_cert,
        mutual=cfg.grpc_use_ssl_mutual,
    )
