"""Models at run time: load, reload and unload without stopping the server.

Imported by the supervisor only; runs in the supervisor process. ``ModelManager`` owns which
model versions are served and by which worker processes. Every change, whether at start,
from RepositoryModelLoad/Unload (a frontend forwards the call over its control pipe), or from
a poll of the repository, runs on one thread, one change at a time (Triton serialises them
too), in this order:

1. read and validate the model (``model_config.loader.load_model``, with the ``config``
   override and ``file:`` contents of the call) and compare each version with what is
   served: a version whose effective config and files are unchanged keeps its instances;
2. create the IPC objects of the new instances, tell the scheduler their rings
   (``InstancesAdded``) and every frontend the rings to attach (acknowledged), spawn them all
   at once and wait until each reports ready;
3. activate the versions whose instances all came up (``VersionsActivated``; a reloaded
   version's old instances finish their queue, then stop), replace the model's entry in every
   frontend's table (acknowledged: from then on no frontend routes to removed versions), and
   retire removed versions (``InstancesRetired``: the scheduler stops them once their queued
   and running requests are answered);
4. wait for the stopped workers to exit, then unlink their rings, semaphores and arenas.

BLS (python workers calling models through the scheduler, ``workers.bls_client``) follows
every change: in step 2 each new instance gets a ring to every BLS client (python worker) and
every running instance one to each new client (``BlsWorkerUpdate``, ``BlsInboxUpdate``,
written on the supervisor's own control rings into the worker's inbox and into its BLS
client's inbox, before the new instances are spawned, so before any answer can use them); in
step 3, after ``VersionsActivated`` and before retiring anything, every client gets the new
table of models it may call (``BlsWorkerUpdate``: the worker applies the updates of a drain
before its batches, so it holds the table before any batch the scheduler sends it later); in
step 4 the rings of stopped instances leave every inbox and sender set before they are
unlinked. A worker's spec is rewritten with each update, so a restarted worker starts wired
as the one it replaces.

A reload that fails leaves the previous versions serving; the reason goes to the log, the
call's answer and RepositoryIndex (the failed versions are UNAVAILABLE, so ModelReady of
such a version is false). Inference never waits on any of this: requests go from frontends
to the scheduler to workers, never through the supervisor.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

import msgspec

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.config import ServerConfig
from triton_mp.common.errors import ConfigError, ErrorCode
from triton_mp.ipc import ChannelTimeout, Sender, encode
from triton_mp.ipc.codec import Decoder
from triton_mp.ipc.messages import (
    BlsClientWiring,
    BlsInboxUpdate,
    BlsWorkerUpdate,
    ControlReply,
    ErrorInfo,
    InstancesAdded,
    InstancesRemoved,
    InstancesRetired,
    InstanceWiring,
    ModelEntry,
    ModelLoadCall,
    ModelTableUpdate,
    ModelUnloadCall,
    TableAck,
    ToSupervisor,
    VersionsActivated,
)
from triton_mp.ipc.notify import Wakeup, WakeupKind
from triton_mp.ipc.ring import RecordTooLarge
from triton_mp.ipc.shm import list_objects, remove_entry
from triton_mp.ipc.specs import (
    BlsModel,
    BlsSpec,
    ChannelSpec,
    InboxSpec,
    LogSpec,
    ModelVersionSpec,
    WorkerSpec,
)
from triton_mp.ipc.topology import Topology
from triton_mp.model_config.loader import (
    CONFIG_FILENAME,
    RepositoryModel,
    directory_fingerprint,
    load_model,
    parse_config_override,
)
from triton_mp.model_config.plan import ModelPlan, plan_models

if TYPE_CHECKING:
    from triton_mp.supervisor import _Child

log = logging.getLogger(__name__)

POLL_FAILED_MESSAGE = "failed to load '{}', failed to poll from model repository"
"""Triton's INTERNAL answer to loading a model the repository does not have."""


def is_model_name(name: str) -> bool:
    """Whether ``name`` can name a model directory of the repository: one path component,
    not hidden, not ``.``/``..``, no separators or NUL (a load must never reach outside the
    repository)."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in ("/", "\\", "\0"))


ACK_TIMEOUT_S = 30.0
"""How long a frontend may take to apply a model table update."""


class Host(Protocol):
    """What the manager needs from the supervisor (``supervisor.Supervisor``)."""

    config: ServerConfig
    server_id: str
    topology: Topology

    @property
    def log_spec(self) -> LogSpec:
        """The children's log settings."""
        ...

    def make_worker(self, spec: WorkerSpec) -> _Child:
        """A worker child (not started) for ``spec``, excluded from the watch loop."""
        ...

    def spawn(self, child: _Child) -> None:
        """Start a child process."""
        ...

    def await_ready(self, children: list[_Child], timeout_s: float) -> dict[str, str]:
        """Wait for each child's ready message; {name: error} of those that failed."""
        ...

    def kill(self, child: _Child) -> None:
        """SIGKILL a child and reap it."""
        ...

    def add_children(self, children: Iterable[_Child]) -> None:
        """Register children (the watch loop restarts those not ``managed``)."""
        ...

    def remove_children(self, children: Iterable[_Child]) -> None:
        """Forget children that exited for good."""
        ...

    def release_children(self, children: Iterable[_Child]) -> None:
        """Hand ready children to the watch loop (restart when they die)."""
        ...

    def claim_children(self, children: Iterable[_Child]) -> None:
        """Take children back from the watch loop (they are about to be stopped)."""
        ...

    def send_scheduler(self, msg: object) -> None:
        """Push a message to the scheduler (thread-safe)."""
        ...

    def ring(self, name: str, capacity_bytes: int = 0) -> str:
        """Create a ring; returns its name."""
        ...

    def wakeup(self, kind: WakeupKind, name: str) -> Wakeup:
        """Create a wake-up object."""
        ...

    @property
    def stopping(self) -> bool:
        """The server is shutting down."""
        ...


@dataclass
class _Wired:
    """A started instance (until its objects are removed), the spec it (re)starts with and
    the supervisor's control rings to it (BLS updates go there, never through the
    scheduler)."""

    child: _Child
    spec: WorkerSpec
    control: Sender
    """To the worker's inbox (``BlsWorkerUpdate``), beside the scheduler's ring."""
    bls_control: Sender | None = None
    """To its BLS client's inbox (``BlsInboxUpdate``): python workers only."""

    def close(self) -> None:
        """Unmap the control rings (their objects are unlinked with the instance's)."""
        self.control.close()
        if self.bls_control is not None:
            self.bls_control.close()

    @property
    def bls(self) -> BlsSpec | None:
        """Its BLS client: python workers only."""
        return self.spec.bls

    def respec(self, spec: WorkerSpec) -> None:
        """Rewire: a restart of the worker starts from ``spec`` from now on."""
        self.spec = spec
        self.child.spec_bytes = encode(spec)


@dataclass
class _Version:
    """One served model version and its worker processes."""

    spec: ModelVersionSpec
    children: list[_Child]
    fingerprint: str


@dataclass
class _Model:
    """A model the manager knows: served versions, failures, where it was loaded from."""

    name: str
    config: bytes = b""
    """The effective config of the served versions (serialized ``ModelConfig``)."""
    versions: dict[int, _Version] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    """Versions that failed to load -> why."""
    failed_fingerprints: dict[int, str] = field(default_factory=dict)
    reason: str = ""
    """Why the model (as a whole) is unavailable."""
    unloaded: bool = False
    temp_dir: Path | None = None
    """Where ``file:`` contents of the load that is served were written."""

    def entry(self, transition: str = "") -> ModelEntry:
        """The frontends' view of this model."""
        if self.unloaded:
            return ModelEntry(
                name=self.name, config=b"", ready_versions=(), reason=self.reason, unloaded=True
            )
        reason = self.reason or "; ".join(
            f"version {v}: {r}" for v, r in sorted(self.failed.items())
        )
        return ModelEntry(
            name=self.name,
            config=self.config,
            ready_versions=tuple(sorted(self.versions)),
            failed_versions=tuple(sorted(v for v in self.failed if v not in self.versions)),
            reason=reason,
            transition=transition,
            version_reasons=dict(self.failed),
        )


@dataclass
class _Request:
    """One model to (re)load in a change."""

    name: str
    config_json: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    result: ErrorInfo | None = None


@dataclass
class _Frontend:
    conn: Connection
    lock: threading.Lock = field(default_factory=threading.Lock)


def _version_fingerprint(model_dir: Path, config: bytes, version: int) -> str:
    """What decides whether a served version must be reloaded: its effective config, its
    version directory and the model directory's other files (``config.pbtxt`` counts only
    through the effective config, so a comment never reloads a model)."""
    digest = hashlib.sha256(config)
    digest.update(directory_fingerprint(model_dir / str(version)).encode())
    others = {p.name for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()}
    digest.update(directory_fingerprint(model_dir, skip={CONFIG_FILENAME, *others}).encode())
    return digest.hexdigest()


class ModelManager:
    """The served models and every change to them (see the module docstring).

    Args:
        host: the supervisor.
        n_frontends: frontend processes (every instance gets a ring to each).
        scheduler_wakeup: the scheduler's inbox wake-up (workers' rings to it post it).
        frontend_wakeups: per frontend id, its inbox wake-up.
    """

    def __init__(
        self,
        host: Host,
        n_frontends: int,
        scheduler_wakeup: Wakeup,
        frontend_wakeups: dict[int, Wakeup],
    ) -> None:
        self._host = host
        self._cfg = host.config
        self._n_fe = n_frontends
        self._sched_wakeup = scheduler_wakeup
        self._fe_wakeups = frontend_wakeups
        self._models: dict[str, _Model] = {}
        self._seen: dict[str, str] = {}
        """Per model directory, its fingerprint at the last load attempt (poll mode)."""
        self._next_id = 0
        self._frontends: dict[int, _Frontend] = {}
        self._seq = 0
        self._acks: dict[int, set[int]] = {}
        self._ack_cv = threading.Condition()
        self._work: queue.Queue[tuple[int, ModelLoadCall | ModelUnloadCall] | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._wired: dict[int, _Wired] = {}
        """Every started instance whose objects still exist, by instance id (BLS wiring)."""
        self._bls_table: dict[str, BlsModel] = {}
        """The table of models the BLS clients hold (the served versions)."""
        self._bls_seq = 0

    # ---------------------------------------------------------------- queries
    def entries(self) -> tuple[ModelEntry, ...]:
        """Every model's entry, for the frontends' specs at start."""
        return tuple(m.entry() for m in sorted(self._models.values(), key=lambda m: m.name))

    def frontend_rings(self, frontend_id: int) -> tuple[str, ...]:
        """The rings from every running instance to one frontend (its spec at start)."""
        return tuple(
            self._host.topology.worker_to_frontend(c.instance_id, frontend_id)
            for m in self._models.values()
            for v in m.versions.values()
            for c in v.children
        )

    def instance_count(self) -> int:
        """Instances serving now."""
        return sum(len(v.children) for m in self._models.values() for v in m.versions.values())

    def ready_model_count(self) -> int:
        """Models with at least one ready version."""
        return sum(1 for m in self._models.values() if m.versions)

    # ------------------------------------------------------------------ start
    def load_at_start(self, names: list[str]) -> None:
        """Load models before any frontend runs (all of them in parallel)."""
        self._load([_Request(n) for n in names])

    def attach_frontends(self, conns: dict[int, Connection]) -> None:
        """Serve the frontends' control pipes and start the change thread (and, in poll
        mode, the repository poll)."""
        self._frontends = {i: _Frontend(c) for i, c in conns.items()}
        for i, fe in self._frontends.items():
            t = threading.Thread(
                target=self._read_frontend, args=(i, fe.conn), name=f"control-f{i}", daemon=True
            )
            t.start()
            self._threads.append(t)
        worker = threading.Thread(target=self._run, name="model-changes", daemon=True)
        worker.start()
        self._threads.append(worker)

    def close(self) -> None:
        """Stop taking changes (server shutdown); remove temporary model directories."""
        self._closed = True
        self._work.put(None)
        for m in self._models.values():
            if m.temp_dir is not None:
                shutil.rmtree(m.temp_dir, ignore_errors=True)

    # ------------------------------------------------------- control pipes
    def _read_frontend(self, frontend_id: int, conn: Connection) -> None:
        decoder: Decoder[ModelLoadCall | ModelUnloadCall | TableAck] = Decoder(ToSupervisor)
        while not self._closed:
            try:
                msg = decoder.decode(conn.recv_bytes())
            except (EOFError, OSError):
                return
            except Exception:  # noqa: BLE001 - a bad message must not end the thread
                log.exception("bad control message from frontend %d", frontend_id)
                continue
            if isinstance(msg, TableAck):
                with self._ack_cv:
                    self._acks.setdefault(msg.seq, set()).add(frontend_id)
                    self._ack_cv.notify_all()
            else:
                self._work.put((frontend_id, msg))

    def _reply(self, frontend_id: int, call_id: int, error: ErrorInfo | None) -> None:
        fe = self._frontends.get(frontend_id)
        if fe is None:
            return
        with fe.lock, contextlib.suppress(OSError):
            fe.conn.send_bytes(encode(ControlReply(call_id=call_id, error=error)))

    def _update_frontends(self, update: ModelTableUpdate, ack: bool) -> None:
        """Send one update to every frontend; with ``ack``, wait until each applied it."""
        if not self._frontends:
            return
        if ack:
            self._seq += 1
            update = msgspec.structs.replace(update, seq=self._seq)
        data = encode(update)
        for fe in self._frontends.values():
            with fe.lock, contextlib.suppress(OSError):
                fe.conn.send_bytes(data)
        if not ack:
            return
        deadline = time.monotonic() + ACK_TIMEOUT_S
        with self._ack_cv:
            while len(self._acks.get(update.seq, set())) < len(self._frontends):
                left = deadline - time.monotonic()
                if left <= 0 or self._host.stopping:
                    log.warning("frontends did not acknowledge model table update %d", update.seq)
                    break
                self._ack_cv.wait(min(left, 0.5))
            self._acks.pop(update.seq, None)

    # ---------------------------------------------------------------- changes
    def _run(self) -> None:
        """The change thread: calls from frontends, and repository polls."""
        poll_s = self._cfg.repository_poll_s if self._cfg.model_control_mode == "poll" else 0.0
        next_poll = time.monotonic() + poll_s if poll_s > 0 else None
        while not self._closed:
            timeout = None if next_poll is None else max(0.0, next_poll - time.monotonic())
            try:
                item = self._work.get(timeout=timeout)
            except queue.Empty:
                item = ()  # type: ignore[assignment]
            if item is None or self._host.stopping:
                return
            try:
                if item:
                    frontend_id, call = item
                    self._reply(frontend_id, call.call_id, self._handle_call(call))
                elif next_poll is not None:
                    self.poll()
            except Exception as e:  # noqa: BLE001 - a failed change must not end the thread
                log.exception("model change failed")
                if item:
                    self._reply(item[0], item[1].call_id, ErrorInfo(ErrorCode.INTERNAL, str(e)))
                # NOTE: what the frontends were told during the change (LOADING) must not stay.
                with contextlib.suppress(Exception):
                    self._update_frontends(ModelTableUpdate(models=self.entries()), ack=False)
            if next_poll is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + poll_s

    def _handle_call(self, call: ModelLoadCall | ModelUnloadCall) -> ErrorInfo | None:
        if isinstance(call, ModelUnloadCall):
            log.info("unload of '%s' requested", call.model, extra={"model": call.model})
            self._unload([call.model], reason="unloaded")
            return None
        log.info("load of '%s' requested", call.model, extra={"model": call.model})
        req = _Request(call.model, call.config_json, dict(call.files))
        self._load([req])
        return req.result

    def poll(self) -> None:
        """Poll mode: load models that are new or changed on disk, unload removed ones."""
        repo = self._cfg.repository_path
        try:
            names = {p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith(".")}
        except OSError as e:
            log.error("failed to poll the model repository %s: %s", repo, e)
            return
        changed = [n for n in sorted(names) if self._seen.get(n) != directory_fingerprint(repo / n)]
        gone = [n for n, m in self._models.items() if n not in names and not m.unloaded]
        if changed:
            log.info("repository poll: loading %s", changed)
            self._load([_Request(n) for n in changed])
        if gone:
            log.info("repository poll: unloading %s (removed from the repository)", gone)
            self._unload(gone, reason="unloaded")
            for n in gone:
                self._seen.pop(n, None)

    # ------------------------------------------------------------------ load
    def _read(self, req: _Request) -> tuple[RepositoryModel | None, Path | None]:
        """Step 1 for one request: its directory (a temporary one for ``file:`` contents)
        and the loaded model; sets ``req.result`` on failure."""
        if not is_model_name(req.name):
            # NOTE: a name is one directory entry of the repository, never a path.
            req.result = ErrorInfo(ErrorCode.INTERNAL, POLL_FAILED_MESSAGE.format(req.name))
            log.error("%s", req.result.message)
            return None, None
        repo_dir = self._cfg.repository_path / req.name
        override: mc.ModelConfig | None = None
        temp_dir: Path | None = None
        try:
            if req.config_json is not None:
                override = parse_config_override(req.name, req.config_json)
            if req.files:
                temp_dir = Path(tempfile.mkdtemp(prefix=f"triton_mp_{self._host.server_id}_"))
                directory = temp_dir / req.name
                for rel, content in req.files.items():
                    path = PurePosixPath(rel)
                    if path.is_absolute() or ".." in path.parts or not path.parts:
                        raise ConfigError(
                            f"failed to load '{req.name}': invalid file path '{rel}' "
                            "(it must be relative to the model directory)"
                        )
                    target = directory.joinpath(*path.parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(content)
            else:
                directory = repo_dir
                if not directory.is_dir():
                    req.result = ErrorInfo(ErrorCode.INTERNAL, POLL_FAILED_MESSAGE.format(req.name))
                    log.error("%s", req.result.message)
                    return None, None
        except ConfigError as e:
            if temp_dir is not None:
                shutil.rmtree(temp_dir, ignore_errors=True)
            req.result = ErrorInfo(e.code, e.message)
            return None, None
        if not req.files:
            self._seen[req.name] = directory_fingerprint(directory)
        rm = load_model(
            directory,
            auto_complete=self._cfg.auto_complete,
            default_max_batch_size=self._cfg.default_max_batch_size,
            config_override=override,
        )
        return rm, temp_dir

    def _load(self, requests: list[_Request]) -> None:
        """(Re)load models, all at once (see the module docstring)."""
        staged: list[tuple[_Request, RepositoryModel, Path | None, dict[int, str]]] = []
        for req in requests:
            rm, temp_dir = self._read(req)
            if rm is None:
                continue
            model = self._models.setdefault(req.name, _Model(req.name))
            if rm.error is not None or rm.config is None:
                req.result = ErrorInfo(ErrorCode.INVALID_ARG, rm.error or "failed to load")
                if temp_dir is not None:
                    shutil.rmtree(temp_dir, ignore_errors=True)
                if not model.versions:
                    model.unloaded = False
                    model.reason = req.result.message
                    model.config = b""
                else:
                    # NOTE: the served versions stay; versions newer than them on disk are
                    # what this reload would have added: they are the UNAVAILABLE ones.
                    newest = max(model.versions)
                    for v in _version_dirs(rm.directory):
                        if v > newest:
                            model.failed[v] = req.result.message
                log.error("failed to load model '%s': %s", req.name, req.result.message)
                self._update_frontends(ModelTableUpdate(models=(model.entry(),)), ack=False)
                continue
            config = rm.config.SerializeToString(deterministic=True)
            fps = {
                v.version: _version_fingerprint(rm.directory, config, v.version)
                for v in rm.versions
            }
            staged.append((req, rm, temp_dir, fps))

        # NOTE: which versions need new instances: new ones, and served ones whose config
        # or files changed; unchanged failures are not retried (a poll would retry forever).
        start: dict[str, set[int]] = {}
        for req, _rm, _temp, fps in staged:
            model = self._models[req.name]
            start[req.name] = {
                v
                for v, fp in fps.items()
                if (v in model.versions and model.versions[v].fingerprint != fp)
                or (
                    v not in model.versions
                    and not (v in model.failed and model.failed_fingerprints.get(v) == fp)
                )
            }
        plans, instances = plan_models(
            [rm for _r, rm, _t, _f in staged], first_instance_id=self._next_id, only_versions=start
        )
        self._next_id += len(instances)
        plan_of = {p.repo.name: p for p in plans}
        for p in plans:
            if p.error:
                req = next(r for r, *_ in staged if r.name == p.repo.name)
                req.result = ErrorInfo(ErrorCode.INVALID_ARG, p.error)

        # NOTE: a model with no served version shows LOADING while its instances start
        # (RepositoryIndex); a served model keeps answering as READY during a reload.
        loading = [
            ModelEntry(name=r.name, config=b"", ready_versions=(), transition="LOADING")
            for r, *_ in staged
            if start.get(r.name) and not self._models[r.name].versions
        ]
        if loading:
            self._update_frontends(ModelTableUpdate(models=tuple(loading)), ack=False)
        children = self._start_instances(plans) if instances else {}
        errors = self._host.await_ready(list(children.values()), self._cfg.startup_timeout_s)

        to_activate: list[ModelVersionSpec] = []
        to_stop: list[_Child] = []
        rollback: list[_Child] = []
        retire: list[_Child] = []
        changed: list[_Model] = []
        for req, rm, temp_dir, fps in staged:
            model = self._models[req.name]
            plan = plan_of[req.name]
            if plan.error:
                self._fail_whole(model, req, temp_dir)
                changed.append(model)
                continue
            failed: dict[int, str] = {}
            new_versions: dict[int, _Version] = {}
            # NOTE: versions that failed before and are unchanged: still failed, not retried.
            carry = {
                v: model.failed[v]
                for v in fps
                if v not in model.versions and v not in start[req.name] and v in model.failed
            }
            for spec in plan.versions:
                kids = [children[i] for i in spec.instance_ids]
                err = next((errors[c.name] for c in kids if c.name in errors), None)
                if err is not None:
                    failed[spec.version] = err
                    rollback.extend(kids)
                else:
                    new_versions[spec.version] = _Version(spec, kids, fps[spec.version])
            wanted = set(fps)
            if failed and model.versions:
                # NOTE: a failed reload keeps every served version as it is.
                rollback.extend(c for v in new_versions.values() for c in v.children)
                self._record_failures(model, failed, fps)
                req.result = _load_failure(req.name, failed)
                if temp_dir is not None:
                    shutil.rmtree(temp_dir, ignore_errors=True)
                changed.append(model)
                continue
            if not new_versions and not failed and set(model.versions) | set(carry) == wanted:
                # NOTE: nothing changed on disk or in the config: nothing to do.
                model.failed = carry
                if carry:
                    req.result = _load_failure(req.name, carry)
                if temp_dir is not None:
                    shutil.rmtree(temp_dir, ignore_errors=True)
                if model.unloaded or model.reason:
                    model.unloaded, model.reason = False, ""
                    changed.append(model)
                continue
            to_activate.extend(v.spec for v in new_versions.values())
            for v, old in list(model.versions.items()):
                if v in new_versions or v not in wanted:
                    (retire if v not in wanted else to_stop).extend(old.children)
                if v not in wanted or v in new_versions:
                    del model.versions[v]
            model.versions.update(new_versions)
            model.config = config_bytes(rm)
            model.failed = dict(carry)
            model.failed_fingerprints = {v: fps[v] for v in carry}
            self._record_failures(model, failed, fps)
            model.unloaded = False
            if failed or carry:
                req.result = _load_failure(req.name, {**carry, **failed})
            model.reason = "" if model.versions else (req.result.message if req.result else "")
            if model.temp_dir is not None and model.temp_dir != temp_dir:
                shutil.rmtree(model.temp_dir, ignore_errors=True)
            model.temp_dir = temp_dir
            changed.append(model)
            log.info(
                "model '%s' ready: versions %s",
                model.name,
                sorted(model.versions),
                extra={"model": model.name},
            )

        if rollback:
            self._discard(rollback)
        # NOTE: the scheduler stops replaced instances on its own once activated; they must
        # not look like deaths to the watch loop.
        self._host.claim_children(retire + to_stop)
        if to_activate:
            self._host.send_scheduler(
                VersionsActivated(specs=tuple(encode(s) for s in to_activate))
            )
            self._host.release_children(
                c for m in changed for v in m.versions.values() for c in v.children
            )
        # NOTE: after activation (the scheduler knows the new versions when the clients learn
        # of them) and before retirement (no client calls a retired version any more).
        self._push_bls_table()
        if changed:
            self._update_frontends(
                ModelTableUpdate(models=tuple(m.entry() for m in changed)), ack=True
            )
        if retire:
            self._host.send_scheduler(
                InstancesRetired(instance_ids=tuple(c.instance_id for c in retire))
            )
        if retire or to_stop:
            self._await_stopped(retire + to_stop)

    def _record_failures(self, model: _Model, failed: dict[int, str], fps: dict[int, str]) -> None:
        for v, reason in failed.items():
            model.failed[v] = reason
            model.failed_fingerprints[v] = fps[v]
            log.error(
                "failed to load model '%s' version %d: %s",
                model.name,
                v,
                reason,
                extra={"model": model.name},
            )

    def _fail_whole(self, model: _Model, req: _Request, temp_dir: Path | None) -> None:
        assert req.result is not None
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        if not model.versions:
            model.reason = req.result.message
            model.unloaded = False
        log.error("failed to load model '%s': %s", model.name, req.result.message)

    def _start_instances(self, plans: list[ModelPlan]) -> dict[int, _Child]:
        """Step 2: IPC objects, scheduler, frontend and BLS wiring, then spawn every instance."""
        host = self._host
        top = host.topology
        n_fe = self._n_fe
        children: dict[int, _Child] = {}
        controls: dict[int, ChannelSpec] = {}
        wiring = []
        rings: list[str] = []
        specs: list[WorkerSpec] = []
        bls = self._wire_bls(plans)
        for p in plans:
            by_version = {v.version: v for v in p.versions}
            for w in p.instances:
                iid = w.instance_id
                sem = host.wakeup("semaphore", top.worker_wakeup(iid))
                to_worker = host.ring(top.scheduler_to_worker(iid))
                control = host.ring(top.supervisor_to_worker(iid), self._cfg.answer_ring_bytes)
                from_worker = host.ring(top.worker_to_scheduler(iid), self._cfg.worker_ring_bytes)
                to_fe = {
                    i: host.ring(top.worker_to_frontend(iid, i), self._cfg.answer_ring_bytes)
                    for i in range(n_fe)
                }
                rings.extend(to_fe.values())
                client = bls.clients.get(iid)
                spec = WorkerSpec(
                    instance=w,
                    model=by_version[w.version],
                    # NOTE: the scheduler's ring first: a drain then sees every BLS update
                    # written before the batches it sees (workers.main.control_first).
                    inbox=InboxSpec(sem, (to_worker, control)),
                    to_scheduler=ChannelSpec(from_worker, self._sched_wakeup),
                    to_frontends={
                        i: ChannelSpec(to_fe[i], self._fe_wakeups[i]) for i in range(n_fe)
                    },
                    to_bls_clients=bls.to_clients[iid],
                    arena_prefix=top.worker_arenas(iid),
                    arena_bytes=self._cfg.output_arena_bytes,
                    arena_budget_bytes=self._cfg.arena_budget_bytes,
                    log=host.log_spec,
                    bls=client,
                )
                specs.append(spec)
                controls[iid] = ChannelSpec(control, sem)
                children[iid] = host.make_worker(spec)
                wiring.append(
                    InstanceWiring(
                        instance_id=iid,
                        name=w.name,
                        model=w.model,
                        version=w.version,
                        to_worker_ring=to_worker,
                        to_worker_wakeup=sem,
                        from_worker_ring=from_worker,
                        bls_client=None
                        if client is None
                        else BlsClientWiring(
                            instance_id=iid,
                            ring=bls.from_scheduler[iid],
                            wakeup=client.inbox.wakeup,
                        ),
                    )
                )
        host.send_scheduler(InstancesAdded(instances=tuple(wiring)))
        # NOTE: running workers open their rings to the new clients, running clients attach
        # the new instances' rings: both before any new instance is spawned.
        self._send_bls(bls.updates)
        for spec in specs:
            iid = spec.instance.instance_id
            bls_control = bls.controls.get(iid)
            self._wired[iid] = _Wired(
                children[iid],
                spec,
                Sender(controls[iid].ring, controls[iid].wakeup),
                None if bls_control is None else Sender(bls_control.ring, bls_control.wakeup),
            )
        # NOTE: before any request can reach a new instance, every frontend reads its ring.
        self._update_frontends(ModelTableUpdate(add_rings=tuple(rings)), ack=True)
        host.add_children(children.values())
        for child in children.values():
            host.spawn(child)
        return children

    # ------------------------------------------------------------------- BLS
    def _wire_bls(self, plans: list[ModelPlan]) -> _BlsWiring:
        """Create the BLS rings of a change's new instances (``plans``): each new python
        worker gets an inbox (a ring from the scheduler, one from the supervisor, one from
        every instance, running or new, woken by its own semaphore), and each new instance a
        ring to every client.
        Running instances and clients are rewired (their specs now, their processes by the
        returned ``updates``)."""
        host = self._host
        top = host.topology
        size = self._cfg.answer_ring_bytes
        new = [w for p in plans for w in p.instances]
        backend = {(v.model, v.version): v.backend for p in plans for v in p.versions}
        new_clients = [w.instance_id for w in new if backend[(w.model, w.version)] == "python"]
        old_clients = [i for i, x in self._wired.items() if x.bls is not None]
        wakeups: dict[int, Wakeup] = {
            i: x.bls.inbox.wakeup for i, x in self._wired.items() if x.bls is not None
        }
        out = _BlsWiring()
        for c in new_clients:
            wakeups[c] = host.wakeup("semaphore", top.bls_wakeup(c))
            out.from_scheduler[c] = host.ring(top.scheduler_to_bls(c), size)
            out.controls[c] = ChannelSpec(host.ring(top.supervisor_to_bls(c), size), wakeups[c])
        ring: dict[tuple[int, int], str] = {}
        """(producer instance, client instance) -> ring."""
        for w in new:
            for c in old_clients + new_clients:
                ring[(w.instance_id, c)] = host.ring(top.worker_to_bls(w.instance_id, c), size)
        for i in self._wired:
            for c in new_clients:
                ring[(i, c)] = host.ring(top.worker_to_bls(i, c), size)
        for w in new:
            out.to_clients[w.instance_id] = {
                c: ChannelSpec(ring[(w.instance_id, c)], wakeups[c])
                for c in old_clients + new_clients
            }
        producers = [*self._wired, *(w.instance_id for w in new)]
        for c in new_clients:
            out.clients[c] = BlsSpec(
                inbox=InboxSpec(
                    wakeups[c],
                    (
                        out.from_scheduler[c],
                        out.controls[c].ring,
                        *(ring[(p, c)] for p in producers),
                    ),
                ),
                models=self._bls_table,
                seq=self._bls_seq,
            )
        for i, x in self._wired.items():
            if new_clients:
                add = tuple(
                    BlsClientWiring(instance_id=c, ring=ring[(i, c)], wakeup=wakeups[c])
                    for c in new_clients
                )
                x.respec(
                    msgspec.structs.replace(
                        x.spec,
                        to_bls_clients=x.spec.to_bls_clients
                        | {a.instance_id: ChannelSpec(a.ring, a.wakeup) for a in add},
                    )
                )
                out.updates.append((i, BlsWorkerUpdate(instance_id=i, add_clients=add)))
            if x.bls is not None and new:
                added = tuple(ring[(n.instance_id, i)] for n in new)
                x.respec(
                    msgspec.structs.replace(
                        x.spec,
                        bls=msgspec.structs.replace(
                            x.bls,
                            inbox=InboxSpec(x.bls.inbox.wakeup, x.bls.inbox.rings + added),
                        ),
                    )
                )
                out.updates.append((i, BlsInboxUpdate(add_rings=added)))
        return out

    def _unwire_bls(self, ids: tuple[int, ...]) -> None:
        """Step 4 for BLS: the instances ``ids`` stopped; every other worker closes its
        rings to their clients and every other client drops their rings (what those still
        hold is delivered)."""
        gone = [self._wired.pop(i) for i in ids if i in self._wired]
        for x in gone:
            x.close()
        gone_clients = {x.spec.instance.instance_id for x in gone if x.bls is not None}
        updates: list[tuple[int, BlsWorkerUpdate | BlsInboxUpdate]] = []
        top = self._host.topology
        gone_rings = {top.worker_to_bls(i, c) for i in ids for c in self._wired}
        for w, x in self._wired.items():
            if gone_clients:
                x.respec(
                    msgspec.structs.replace(
                        x.spec,
                        to_bls_clients={
                            k: v for k, v in x.spec.to_bls_clients.items() if k not in gone_clients
                        },
                    )
                )
                updates.append(
                    (w, BlsWorkerUpdate(instance_id=w, remove_clients=tuple(sorted(gone_clients))))
                )
            if x.bls is not None:
                removed = tuple(r for r in x.bls.inbox.rings if r in gone_rings)
                if not removed:
                    continue
                kept = tuple(r for r in x.bls.inbox.rings if r not in gone_rings)
                x.respec(
                    msgspec.structs.replace(
                        x.spec,
                        bls=msgspec.structs.replace(
                            x.bls, inbox=InboxSpec(x.bls.inbox.wakeup, kept)
                        ),
                    )
                )
                updates.append((w, BlsInboxUpdate(remove_rings=removed)))
        self._send_bls(updates)

    def _push_bls_table(self) -> None:
        """Give every BLS client the table of the versions served now, if it changed."""
        table = bls_table(v.spec for m in self._models.values() for v in m.versions.values())
        if table == self._bls_table:
            return
        self._bls_table = table
        self._bls_seq += 1
        for i, x in self._wired.items():
            if x.bls is None:
                continue
            x.respec(
                msgspec.structs.replace(
                    x.spec,
                    bls=msgspec.structs.replace(x.bls, models=table, seq=self._bls_seq),
                )
            )
            self._send_bls([(i, BlsWorkerUpdate(instance_id=i, seq=self._bls_seq, models=table))])

    def _send_bls(self, updates: list[tuple[int, BlsWorkerUpdate | BlsInboxUpdate]]) -> None:
        """Write BLS updates on the supervisor's control rings: a ``BlsWorkerUpdate`` to its
        worker's inbox, a ``BlsInboxUpdate`` to the BLS client of that instance. Each lands
        before anything that depends on it can reach the worker (see ``_wire_bls``)."""
        for instance_id, msg in updates:
            x = self._wired[instance_id]
            sender = x.control if isinstance(msg, BlsWorkerUpdate) else x.bls_control
            assert sender is not None
            try:
                sender.send(msg)
            except RecordTooLarge as e:
                log.error("BLS update to instance %d not delivered: %s", instance_id, e)
            except ChannelTimeout:
                # NOTE: a worker stuck or dead with a full inbox: its spec holds the update
                # already (respec), so its restart starts wired.
                log.warning(
                    "BLS update to instance %d not delivered: its inbox is full", instance_id
                )

    def _discard(self, children: list[_Child]) -> None:
        """Kill instances that will not serve (a failed load) and free what they had."""
        for c in children:
            self._host.kill(c)
        self._cleanup(children)

    def _await_stopped(self, children: list[_Child]) -> None:
        """Step 4: wait for retired workers to exit (the scheduler stops them once their
        requests are answered), then free what they had."""
        timeout_s = max(30.0, self._cfg.exit_timeout_s)
        deadline = time.monotonic() + timeout_s
        waiting = {c.process.sentinel: c for c in children if c.process is not None}
        while waiting and not self._host.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                for c in waiting.values():
                    log.warning("retired instance %s did not stop; killing it", c.name)
                    self._host.kill(c)
                break
            for s in wait(list(waiting), timeout=min(left, 0.5)):
                waiting.pop(s)  # type: ignore[arg-type]
        for c in children:
            if c.process is not None:
                c.process.join(timeout=5)
        self._cleanup(children)

    def _cleanup(self, children: list[_Child]) -> None:
        """Forget stopped instances: scheduler, frontends, children list, shared memory."""
        if not children:
            return
        ids = tuple(c.instance_id for c in children)
        top = self._host.topology
        self._unwire_bls(ids)
        self._host.send_scheduler(InstancesRemoved(instance_ids=ids))
        self._update_frontends(
            ModelTableUpdate(
                remove_rings=tuple(
                    top.worker_to_frontend(i, f) for i in ids for f in range(self._n_fe)
                ),
                drop_segments=tuple(top.worker_segments(i) for i in ids),
            ),
            ack=True,
        )
        self._host.remove_children(children)
        for entry in top.of_instances(list_objects(self._host.server_id), set(ids)):
            remove_entry(entry)

    # ---------------------------------------------------------------- unload
    def _unload(self, names: list[str], reason: str) -> None:
        """Stop serving models: frontends drop them (acknowledged), the scheduler answers
        what is queued and running, then their workers stop and their memory is freed."""
        models = [self._models[n] for n in names if n in self._models]
        if not models:
            return
        children = [c for m in models for v in m.versions.values() for c in v.children]
        versions = {m.name: sorted(m.versions) for m in models}
        for m in models:
            m.failed = {v: "unloading" for v in m.versions}
            m.versions = {}
            m.reason = "unloading"
        self._push_bls_table()
        self._update_frontends(
            ModelTableUpdate(models=tuple(m.entry("UNLOADING") for m in models)), ack=True
        )
        if children:
            self._host.claim_children(children)
            self._host.send_scheduler(
                InstancesRetired(instance_ids=tuple(c.instance_id for c in children))
            )
            self._await_stopped(children)
        for m in models:
            m.failed, m.failed_fingerprints = {}, {}
            m.reason, m.unloaded, m.config = reason, True, b""
            if m.temp_dir is not None:
                shutil.rmtree(m.temp_dir, ignore_errors=True)
                m.temp_dir = None
            log.info(
                "model '%s' unloaded (versions %s)",
                m.name,
                versions[m.name],
                extra={"model": m.name},
            )
        self._update_frontends(ModelTableUpdate(models=tuple(m.entry() for m in models)), ack=True)


@dataclass
class _BlsWiring:
    """The BLS side of a change's new instances (``ModelManager._wire_bls``)."""

    clients: dict[int, BlsSpec] = field(default_factory=dict)
    """Per new python instance id: its BLS client."""
    to_clients: dict[int, dict[int, ChannelSpec]] = field(default_factory=dict)
    """Per new instance id: python worker instance id -> its ring to that worker's BLS
    client."""
    from_scheduler: dict[int, str] = field(default_factory=dict)
    """Per new python instance id: the scheduler's ring into its BLS inbox."""
    controls: dict[int, ChannelSpec] = field(default_factory=dict)
    """Per new python instance id: the supervisor's ring into its BLS inbox."""
    updates: list[tuple[int, BlsWorkerUpdate | BlsInboxUpdate]] = field(default_factory=list)
    """(instance id, update) for running workers and clients (``ModelManager._send_bls``)."""


def bls_table(versions: Iterable[ModelVersionSpec]) -> dict[str, BlsModel]:
    """The models a BLS client may call, from the versions served now.

    Each model lists its versions in ascending order; batching, outputs, decoupled and the
    instance count are its newest version's (a request without a version goes there, as
    Triton's default version policy picks the newest).
    """
    models: dict[str, BlsModel] = {}
    for v in sorted(versions, key=lambda v: (v.model, v.version)):
        prev = models.get(v.model)
        models[v.model] = BlsModel(
            versions=(prev.versions if prev else ()) + (v.version,),
            max_batch_size=v.max_batch_size,
            outputs=tuple(t.name for t in v.outputs),
            decoupled=v.decoupled,
            instance_count=len(v.instance_ids),
        )
    return models


def _version_dirs(directory: Path) -> list[int]:
    """The numeric version directories of a model directory."""
    try:
        return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())
    except OSError:
        return []


def config_bytes(rm: RepositoryModel) -> bytes:
    """The effective config of a loaded model, serialized for the frontends."""
    assert rm.config is not None
    return rm.config.SerializeToString()


def _load_failure(name: str, failed: dict[int, str]) -> ErrorInfo:
    """Triton's answer when versions fail to load (core model_lifecycle.cc)."""
    detail = "".join(
        f"version {v} is at UNAVAILABLE state: {r};" for v, r in sorted(failed.items())
    )
    return ErrorInfo(ErrorCode.INTERNAL, f"load failed for model '{name}': {detail}")
