"""Model control: load, reload and unload models without stopping the server.

Imported by ``supervisor.main``; runs in the supervisor process. ``ModelControl`` owns which
model versions are served and by which worker processes. Every change, whether at start,
from RepositoryModelLoad/Unload (a frontend forwards the call over its control pipe,
``supervisor.processes.frontend_link``), or from a poll of the repository, runs on one thread, one
change at a time (Triton serialises them too), in this order:

1. read and validate the model (``supervisor.models.staging``, which refuses what does not
   load) and decide which versions need new instances
   (``supervisor.models.model_changes.versions_to_start``): a version whose effective config
   and files are unchanged keeps its instances;
2. wire and spawn the new instances (``supervisor.processes.instances``: scheduler, frontends and
BLS
   peers learn their rings first) and wait until each reports ready;
3. apply the plan of each model (``supervisor.models.change_effects.apply_plan``, which asks
   ``model_changes.plan_change``), then commit every model's effects: activate the versions whose
   instances all came up (``VersionsActivated``; a reloaded version's old instances finish
   their queue, then stop), give every BLS client the new table of models, replace the
   model's entry in every frontend's table (acknowledged: from then on no frontend routes to
   removed versions), and retire removed versions (``InstancesRetired``: the scheduler stops
   them once their queued and running requests are answered);
4. answer the change; once the stopped workers exit (in the background: a reloaded
   sequence model's old instances keep their live sequences), free their rings, semaphores
   and arenas, and show the retired versions UNAVAILABLE. An unload answers as soon as the
   frontends dropped the model, as 2.51's does; its versions drain the same way (UNLOADING
   until then).

A reload that fails leaves the previous versions serving; the reason goes to the log, the
call's answer and RepositoryIndex (the failed versions are UNAVAILABLE, so ModelReady of
such a version is false). Inference never waits on any of this: requests go from frontends
to the scheduler to workers, never through the supervisor.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection

from triton_mp.common.config import ServerConfig
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc import encode
from triton_mp.ipc.protocol.control_messages import (
    DirectRoute,
    ModelEntry,
    ModelLoadCall,
    ModelTableUpdate,
    ModelUnloadCall,
)
from triton_mp.ipc.protocol.messages import (
    ErrorInfo,
    InstancesRegrouped,
    InstancesRetired,
    VersionsActivated,
)
from triton_mp.model_config.loader import directory_fingerprint
from triton_mp.model_config.plan import ModelPlan, plan_models
from triton_mp.supervisor.models.bls_control import BlsControl, Reply
from triton_mp.supervisor.models.change_effects import Effects, apply_plan, remove_temp_dirs
from triton_mp.supervisor.models.ensemble_deps import (
    broken_dependents,
    composing_failure,
    dependents,
    ensemble_load_failure,
    reloadable,
    steps_of,
    unused_steps,
)
from triton_mp.supervisor.models.load_requests import (
    LoadRequest,
    Staged,
)
from triton_mp.supervisor.models.model_changes import versions_to_start
from triton_mp.supervisor.models.regroups import find_regroups, plan_regroups
from triton_mp.supervisor.models.served_models import ServedModel, served_configs
from triton_mp.supervisor.models.staging import Stager
from triton_mp.supervisor.processes.children import Child, ChildTable
from triton_mp.supervisor.processes.frontend_link import Call, FrontendLink
from triton_mp.supervisor.processes.instances import Instances

log = logging.getLogger(__name__)


class ModelControl:
    """The served models and every change to them (see the module docstring).

    Args:
        config: the server's flags (repository, control mode, timeouts).
        server_id: the supervisor's pid (names temporary model directories).
        table: the process table.
        instances: wires, starts and frees worker instances.
        link: the frontends' control pipes.
        send_scheduler: pushes a message to the scheduler (thread-safe).
        stopping: whether the server is shutting down.
    """

    def __init__(
        self,
        config: ServerConfig,
        server_id: str,
        table: ChildTable,
        instances: Instances,
        link: FrontendLink,
        send_scheduler: Callable[[object], None],
        stopping: Callable[[], bool],
    ) -> None:
        self._cfg = config
        self._table = table
        self._instances = instances
        self._link = link
        self._send = send_scheduler
        self._stopping = stopping
        self._models: dict[str, ServedModel] = {}
        self._seen: dict[str, str] = {}
        """Per model directory, its fingerprint at the last load attempt (poll mode)."""
        self._next_id = 0
        self._work: queue.Queue[tuple[int, Call] | tuple[()] | Callable[[], None] | None] = (
            queue.Queue()
        )
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._loading: set[str] = set()
        """Models the change in progress loads (a nested load of one is refused)."""
        self._drains: Counter[tuple[str, int]] = Counter()
        """(model, version) -> generations of it still draining (``_drain``)."""
        self._draining: dict[int, Child] = {}
        """Instances that stopped serving and still finish their requests and sequences
        (``_free_when_gone``), by instance id; changed on the change thread only."""
        self._orphans: dict[str, tuple[str, ...]] = {}
        """Ensembles a composing model's unload took down -> the models their steps call:
        loaded again once those all serve (``_reload_orphans``)."""
        # NOTE: a python model's call wakes the change thread (an empty item), which takes it
        # between changes, or during one while the change waits for starting workers (the
        # documented load_model from initialize).
        self._stager = Stager(
            config,
            server_id,
            self._models,
            self._seen,
            instances.devices.supported_ids,
            lambda update: link.update(update, ack=False),
        )
        self._bls = BlsControl(config.model_control_mode, lambda: self._work.put(()))
        instances.set_model_control(self._bls.address, self._bls.authkey)

    # ---------------------------------------------------------------- queries
    def entries(self) -> tuple[ModelEntry, ...]:
        """Every model's entry, for the frontends' specs at start."""
        return tuple(m.entry() for m in sorted(self._models.values(), key=lambda m: m.name))

    def _serving(self) -> list[Child]:
        return [c for m in self._models.values() for v in m.versions.values() for c in v.children]

    def frontend_rings(self, frontend_id: int) -> tuple[str, ...]:
        """The rings from every running instance to one frontend (its spec at start, or at
        a restart: the instances that still drain answer there too)."""
        ids = [*(c.instance_id for c in self._serving()), *self._draining]
        return self._instances.frontend_rings(ids, frontend_id)

    def direct_routes(self, frontend_id: int) -> tuple[DirectRoute, ...]:
        """Every running instance's direct route for one frontend (its spec at start)."""
        return self._instances.direct_routes((c.instance_id for c in self._serving()), frontend_id)

    def instance_count(self) -> int:
        """Instances serving now."""
        return len(self._serving())

    def ready_model_count(self) -> int:
        """Models with at least one ready version."""
        return sum(1 for m in self._models.values() if m.versions)

    # ------------------------------------------------------------------ start
    def load_at_start(self, names: list[str]) -> None:
        """Load models before any frontend runs (all of them in parallel)."""
        requests = [LoadRequest(n) for n in names]
        self._load(requests)
        self._mark_by_name(requests)

    def attach_frontends(self, conns: dict[int, Connection]) -> None:
        """Serve the frontends' control pipes and start the change thread (and, in poll
        mode, the repository poll)."""
        self._threads.extend(self._link.attach(conns, lambda i, call: self._work.put((i, call))))
        worker = threading.Thread(target=self._run, name="model-changes", daemon=True)
        worker.start()
        self._threads.append(worker)

    def on_change_thread(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the change thread, between two changes (a frontend's restart:
        ``supervisor.processes.frontend_restart``)."""
        self._work.put(fn)

    def close(self) -> None:
        """Stop taking changes (server shutdown); remove temporary model directories."""
        self._closed = True
        self._link.close()
        self._bls.close()
        self._work.put(None)
        for m in self._models.values():
            remove_temp_dirs(m)

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
                item = ()
            if item is None or self._stopping():
                return
            if callable(item):
                try:
                    item()
                except Exception:  # noqa: BLE001 - a failed restart must not end the thread
                    log.exception("frontend restart failed")
                continue
            try:
                self._bls.drain(self._bls_call)
                if item:
                    self._link.reply(item[0], item[1].call_id, self._handle_call(item[1]))
                elif next_poll is not None and time.monotonic() >= next_poll:
                    self.poll()
            except Exception as e:  # noqa: BLE001 - a failed change must not end the thread
                log.exception("model change failed")
                if item:
                    self._link.reply(
                        item[0], item[1].call_id, ErrorInfo(ErrorCode.INTERNAL, str(e))
                    )
                # NOTE: what the frontends were told during the change (LOADING) must not stay.
                with contextlib.suppress(Exception):
                    self._link.update(ModelTableUpdate(models=self.entries()), ack=False)
            if next_poll is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + poll_s

    def _bls_call(self, call: Call, reply: Reply) -> None:
        """A python model's call (``bls_control.BlsControl.drain``); a load of a model this
        change is loading (its own ``initialize`` reloading it) is refused."""
        if isinstance(call, ModelLoadCall) and call.model in self._loading:
            why = f"failed to load '{call.model}': the model is being loaded"
            reply(ErrorInfo(ErrorCode.UNAVAILABLE, why))
            return
        reply(self._handle_call(call, reply))

    def _handle_call(self, call: Call, target: int | Reply = 0) -> ErrorInfo | None:
        if isinstance(call, ModelUnloadCall):
            log.info("unload of '%s' requested", call.model, extra={"model": call.model})
            # NOTE: a python model's unload_model returns once the unload began, as
            # TRITONSERVER_ServerUnloadModel does (its own execute may be what drains).
            started = (lambda: target(None)) if callable(target) else None
            self._unload_by_name(call.model, call.unload_dependents, started)
            return None
        log.info("load of '%s' requested", call.model, extra={"model": call.model})
        req = LoadRequest(call.model, call.config_json, dict(call.files))
        self._load([req])
        self._mark_by_name([req])
        return req.result

    def _unload_by_name(
        self, name: str, with_dependents: bool, started: Callable[[], None] | None
    ) -> None:
        """RepositoryModelUnload. The ensembles that call the model are unloaded with it,
        ``unload_dependents`` or not (and come back when it does, as in 2.51); with it, the
        composing models of an ensemble that were loaded only for it go too
        (``ensemble_deps.unused_steps``)."""
        served = served_configs(self._models.values())
        steps: list[str] = []
        if with_dependents and name in served:
            by_name = [n for n, m in self._models.items() if m.by_name and n != name]
            steps = unused_steps({name: served[name]}, served, self._orphans, by_name)
            if steps:
                log.info("unloading %s with '%s' (unload_dependents)", steps, name)
        # NOTE: in one change, so that the ensemble drains with its steps' instances.
        self._unload([name, *steps], reason="unloaded", on_started=started)
        for n in [name, *steps]:
            if n in self._models:
                self._models[n].by_name = False

    def _mark_by_name(self, requests: list[LoadRequest]) -> None:
        """The models these loads by name serve now stay when an ensemble that calls them
        is unloaded with ``unload_dependents`` (``ServedModel.by_name``)."""
        for r in requests:
            model = self._models.get(r.name)
            if r.result is None and model is not None and model.versions:
                model.by_name = True

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
            self._load([LoadRequest(n) for n in changed])
        if gone:
            log.info("repository poll: unloading %s (removed from the repository)", gone)
            self._unload(gone, reason="unloaded")
            for n in gone:
                self._seen.pop(n, None)

    # ------------------------------------------------------------------ load
    def _load(self, requests: list[LoadRequest], poll_steps: bool = True) -> None:
        """(Re)load models, all at once (see the module docstring); then the ensembles
        waiting for them (``_reload_orphans``). ``poll_steps``: the served composing models
        of the ensembles loaded are read again too (a load from outside; core's
        ``PollModels``), not only those that do not serve (an ensemble brought back,
        2.51's ``LoadModelByDependency``)."""
        for r in requests:
            self._orphans.pop(r.name, None)
            self._stager.keep_override(r)
        self._load_now(requests, poll_steps)
        self._remember_overrides(requests)
        self._unload_broken_dependents(requests)
        self._reload_orphans()

    def _remember_overrides(self, requests: list[LoadRequest]) -> None:
        """Each served model's ``config`` override, with its directory's fingerprint at the
        load (``_keep_override``); a load without one forgets it."""
        for r in requests:
            model = self._models.get(r.name)
            if r.result is not None or model is None or not model.versions:
                continue
            seen = self._seen.get(r.name)
            if r.config_json is not None and not r.files and seen is not None:
                model.override = (r.config_json, seen)
            else:
                model.override = None

    def _unload_broken_dependents(self, requests: list[LoadRequest]) -> None:
        """The served ensembles a load made invalid (a composing model reloaded with a
        smaller max_batch_size, renamed inputs...) stop serving, "unloaded", and wait for a
        later load to make them valid again (``_reload_orphans``), as 2.51's repository
        manager does (``ensemble_deps.broken_dependents``; its reason goes to the log)."""
        loaded = [
            r.name
            for r in requests
            if r.result is None and r.name in self._models and self._models[r.name].versions
        ]
        if not loaded:
            return
        served = served_configs(self._models.values())
        for name, why in broken_dependents(loaded, served).items():
            if not self._models[name].versions:
                continue
            log.error("Invalid argument: %s", why, extra={"model": name})
            self._unload([name], reason="unloaded")
            self._orphans[name] = tuple(steps_of(served[name]))

    def _load_now(self, requests: list[LoadRequest], poll_steps: bool) -> None:
        staged = self._stager.with_ensembles(
            [s for s in map(self._stager.stage, requests) if s is not None], requests, poll_steps
        )
        start = {
            s.req.name: set(versions_to_start(self._models[s.req.name].served(), s.fingerprints))
            for s in staged
        }
        for s in staged:
            find_regroups(self._models[s.req.name], s, start[s.req.name])
        plans, instances = plan_models(
            [s.rm for s in staged],
            first_instance_id=self._next_id,
            only_versions=start,
            host_policies=self._cfg.host_policies,
            configs=served_configs(self._models.values()),
        )
        self._next_id += len(instances)
        plan_of = {p.repo.name: p for p in plans}
        kept: dict[int, Child] = {}
        for s in staged:
            if plan_of[s.req.name].error:
                s.req.result = ErrorInfo(ErrorCode.INVALID_ARG, plan_of[s.req.name].error)
            else:
                kept.update(plan_regroups(self._models[s.req.name], s, plan_of[s.req.name]))
        # NOTE: unserved models show LOADING while starting; served ones stay READY.
        loading = [
            ModelEntry(name=s.req.name, config=b"", ready_versions=(), transition="LOADING")
            for s in staged
            if start.get(s.req.name) and not self._models[s.req.name].versions
        ]
        if loading:
            self._link.update(ModelTableUpdate(models=tuple(loading)), ack=False)
        children = self._instances.start(plans) if any(p.instances for p in plans) else {}
        self._loading |= {s.req.name for s in staged}
        try:
            errors = self._table.await_ready(
                list(children.values()),
                self._cfg.startup_timeout_s,
                between=lambda: self._bls.drain(self._bls_call),
            )
        finally:
            self._loading -= {s.req.name for s in staged}
        effects = Effects()
        for s in staged:
            self._check_composing(s, plan_of[s.req.name])
            model = self._models[s.req.name]
            apply_plan(model, s, plan_of[s.req.name], children, errors, effects, kept)
        self._commit(effects)

    def _reload_orphans(self) -> None:
        """Load the ensembles a composing model's unload took down once every model their
        steps call serves again, as 2.51 does; one that still cannot load (its check
        against the new composing models fails) stays UNAVAILABLE "unloaded", as in 2.51,
        and waits for the next load (the reason goes to the log)."""
        serving = [n for n, m in self._models.items() if m.versions]
        names = reloadable(self._orphans, serving)
        if not names:
            return
        waiting = {n: self._orphans[n] for n in names}
        requests = [LoadRequest(n) for n in names]
        log.info("loading ensembles %s again: their composing models serve", names)
        self._load(requests, poll_steps=False)  # NOTE: their ensembles follow in its own pass
        failed = [self._models[r.name] for r in requests if r.result is not None]
        for m in failed:
            self._orphans[m.name] = waiting[m.name]
            if not m.versions:
                m.reason, m.unloaded = "unloaded", True
        if failed:
            self._link.update(ModelTableUpdate(models=tuple(m.entry() for m in failed)), ack=True)

    def _check_composing(self, s: Staged, plan: ModelPlan) -> None:
        """An ensemble whose composing models did not come up does not load either."""
        versions = {n: set(m.versions) for n, m in self._models.items()}
        why = composing_failure(s.req.name, s.rm.config, versions)
        if why and not plan.error:
            plan.error = why
            s.req.result = ensemble_load_failure(s.req.name, why)

    def _commit(self, fx: Effects) -> None:
        """Steps 3 and 4 for every model of a change at once."""
        if fx.rollback:
            self._instances.discard(fx.rollback)
        # NOTE: the scheduler stops replaced instances on its own once activated; they must
        # not look like deaths to the watch loop.
        self._table.claim(fx.retire + fx.to_stop + fx.leaving)
        if fx.activate:
            self._send(VersionsActivated(specs=tuple(encode(s) for s in fx.activate)))
        for spec in fx.regroup:
            self._send(InstancesRegrouped(spec=encode(spec)))
        if fx.activate or fx.regroup:
            self._table.release(
                c for m in fx.changed for v in m.versions.values() for c in v.children
            )
        # NOTE: after activation (the scheduler knows the new versions when the clients learn
        # of them) and before retirement (no client calls a retired version any more).
        self._push_bls_table()
        if fx.changed:
            entries = tuple(m.entry() for m in fx.changed)
            self._link.update(ModelTableUpdate(models=entries), ack=True)
        if fx.retire:
            self._send(InstancesRetired(instance_ids=tuple(c.instance_id for c in fx.retire)))
        if fx.leaving:
            self._free_when_gone(fx.leaving)
        if fx.retire or fx.to_stop:
            # NOTE: the load answers now, as 2.51's does once the new version serves; the old
            # generation drains behind it (its live sequences up to max_sequence_idle).
            self._drain(fx.retire + fx.to_stop, list(fx.unloading))

    def _free_when_gone(
        self, children: list[Child], then: Callable[[], None] | None = None
    ) -> None:
        """Free what stopping instances (removed by a regroup, replaced or retired by a
        reload) had once they exit, then call ``then``, on the change thread. The scheduler
        stops each when its queued requests and live sequences end, maybe long after the
        load answered, as 2.51 releases an old model once its last request is done; none is
        killed for taking long. A server stop ends the wait and leaves the ones still
        running alone: the stop's drain sends their last answers, its shutdown stops every
        process and frees the server's shared memory."""

        def free() -> None:
            self._instances.await_stopped(children)
            for c in children:
                self._draining.pop(c.instance_id, None)
            if then is not None:
                then()

        def wait() -> None:
            self._table.await_exit(children, math.inf)
            if self._table.stopping and any(c.process and c.process.is_alive() for c in children):
                return  # NOTE: the stop's drain has their answers to send: it ends them
            self.on_change_thread(free)

        self._draining.update((c.instance_id, c) for c in children)
        threading.Thread(target=wait, name="stopping-instances", daemon=True).start()

    def _drain(self, children: list[Child], versions: list[tuple[ServedModel, int]]) -> None:
        """Free retired or replaced instances once they exit (``_free_when_gone``); then
        ``versions`` leave UNLOADING. No bound, as 2.51's lifecycle keeps an old model until
        its last request is released: a stop ends them at its exit budget."""
        for m, v in versions:
            self._drains[m.name, v] += 1
        self._free_when_gone(children, lambda: self._drained(versions))

    def _drained(self, versions: list[tuple[ServedModel, int]]) -> None:
        """Retired versions whose workers have exited: UNLOADING -> UNAVAILABLE (as Triton's
        lifecycle once the last reference to the old model goes), each once no other
        generation of it still drains (unloaded, loaded and unloaded again meanwhile)."""
        gone = []
        for m, v in versions:
            self._drains[m.name, v] -= 1
            if self._drains[m.name, v] <= 0:
                del self._drains[m.name, v]
                gone.append((m, v))
        models = {m.name: m for m, v in gone if v in m.unloading}
        for m, v in gone:
            m.unloading.discard(v)
        if models:
            entries = tuple(m.entry() for m in models.values())
            self._link.update(ModelTableUpdate(models=entries), ack=True)

    def _push_bls_table(self) -> None:
        self._instances.push_bls_table(
            (v.spec for m in self._models.values() for v in m.versions.values()),
            {m.name: set(m.failed) | m.retired for m in self._models.values()},
        )

    # ---------------------------------------------------------------- unload
    def _unload(
        self, names: list[str], reason: str, on_started: Callable[[], None] | None = None
    ) -> None:
        """Stop serving models: frontends drop them (acknowledged), and the unload answers;
        the scheduler answers what is queued and running, then their workers stop and their
        memory is freed (``_free_when_gone``); until then the versions are UNLOADING, as in
        Triton's lifecycle (``ModelInfo::Release``), then UNAVAILABLE ``reason``. The
        ensembles that call them stop with them, ``reason`` too (2.51 says "unloaded"
        whether or not RepositoryModelUnload asked ``unload_dependents``), and wait for
        their composing models to serve again (``_reload_orphans``)."""
        for n in names:
            self._orphans.pop(n, None)
        served = served_configs(self._models.values())
        deps = [d for d in dependents(names, served) if d not in names]
        for dep in deps:
            self._orphans[dep] = tuple(steps_of(served[dep]))
        models = [self._models[n] for n in [*deps, *names] if n in self._models]
        if not models:
            return
        children = [c for m in models for v in m.versions.values() for c in v.children]
        # NOTE: an ensemble's versions run on no instance: the scheduler retires them by key
        bare = tuple((m.name, v) for m in models for v, x in m.versions.items() if not x.children)
        # NOTE: an ensemble's in-flight requests run on the instances unloaded with it: it
        # drains with them (alone, it has nothing to wait for here).
        draining = [(m, v) for m in models for v in m.versions] if children else []
        for m in models:
            versions = sorted(m.versions)
            # NOTE: failed versions keep their state through an unload, as in Triton's lifecycle.
            m.failed = {v: r for v, r in m.failed.items() if v not in m.versions}
            m.failed_fingerprints = {}
            m.retired |= set(versions)
            m.unloading |= {v for n, v in draining if n is m}
            m.versions = {}
            m.reason, m.unloaded, m.config = reason, True, b""
            remove_temp_dirs(m)
            log.info("model '%s' unloading (versions %s)", m.name, versions,
                     extra={"model": m.name})  # fmt: skip
        self._push_bls_table()
        # NOTE: the frontends route no request to the models any more once acknowledged.
        self._link.update(ModelTableUpdate(models=tuple(m.entry() for m in models)), ack=True)
        if on_started is not None:
            on_started()
        if children or bare:
            self._table.claim(children)
            ids = tuple(c.instance_id for c in children)
            self._send(InstancesRetired(instance_ids=ids, versions=bare))
        if children:
            # NOTE: the unload answers now, as TRITONSERVER_ServerUnloadModel does: the
            # versions are UNLOADING until their queued and running requests are answered.
            self._drain(children, draining)
