"""Instances and generations through their lifecycle: staged -> active -> retiring -> removed.

Imported by the scheduler core, whose dispatch table hands it the supervisor's model changes
and the workers' comings and goings; it writes what follows to the core's ``Outbox``. The
order a model change takes (``supervisor`` model control):

- ``InstancesAdded``: the new instances' rings are attached; they are *staged*: their
  version is not active, they take no work, a ``WorkerReady`` is only remembered.
- ``VersionsActivated``: each spec starts a new *generation* of its version (a policy from
  ``scheduler.registry``) that takes the version's requests from now on; its staged
  instances become *active*, the ready ones idle. A generation it replaces (a reload)
  *retires*.
- ``InstancesRetired``: their generation takes no new requests (the version was unloaded).
- ``InstancesRegrouped``: an active version's instance group changed in place (core
  ``TritonModel::UpdateInstanceGroup``): its generation goes on with the new spec; added
  instances join it, removed ones are *leaving*: they take no new request or sequence,
  finish their batch and their live sequences (``Policy.holds``), then get ``Shutdown``.
- A retiring generation finishes its queue and its running batches, and serves the steps of
  the ensemble requests that started before it retired (``Generation.pins``), then (one
  dispatch pass after it retired at the earliest) its instances get ``Shutdown`` (*stopping*).
- ``InstancesRemoved``: the processes are gone; their rings are detached and the instances
  forgotten (*removed*).

``WorkerReady`` / ``WorkerDied`` move an instance's ``Health``; a version whose first live
instance appears, or whose last one dies, is announced to every frontend
(``ModelAvailability``: ModelReady and ServerReady follow it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import cast

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate
from triton_mp.ipc.protocol.messages import (
    InstancesAdded,
    InstancesRegrouped,
    InstancesRemoved,
    InstancesRetired,
    ModelAvailability,
    Shutdown,
    VersionsActivated,
    WarmupRun,
    WorkerDied,
    WorkerReady,
)
from triton_mp.ipc.protocol.specs import ModelVersionSpec
from triton_mp.ipc.recordio.codec import Decoder
from triton_mp.ipc.recordio.records import Request
from triton_mp.scheduler.instances import (
    Generation,
    Health,
    Instance,
    InstanceState,
    InstanceTable,
    VersionKey,
)
from triton_mp.scheduler.model_reloads import is_new_model
from triton_mp.scheduler.outbox import Outbox
from triton_mp.scheduler.plain_requests import plain_queue
from triton_mp.scheduler.registry import make_policy
from triton_mp.scheduler.stats import StatsBook
from triton_mp.scheduler.status import BatchLogs

log = logging.getLogger(__name__)

READERS_S = 10.0
"""How long a retired instance waits for the frontends (and BLS callers, ensembles) to free
its last answers' blocks before it unlinks its arenas (``Shutdown.readers_s``): its last
``BatchDone`` may reach us before a frontend has read the answer."""

STOPPING_MESSAGE = (
    "Server is stopping, scheduler for model has stopped accepting new inference requests"
)
"""Triton's error for requests a stopping scheduler (or a retired version) will not run."""


def died_running(label: str, model: str, msg: WorkerDied) -> str:
    """The error of a request the instance ``label`` was running when it died."""
    how = f"{msg.reason} (exit code {msg.exitcode})" if msg.reason else ""
    how = how or f"died with exit code {msg.exitcode}"
    return f"model instance '{label}' of '{model}' {how} while running the request"


class Lifecycle:
    """The instance table and the generations of every served version.

    Args:
        models: versions active from the start (their instances start unready).
        out: where messages that follow a change go.
        stats: per-version statistics, started and dropped with the versions.
        logs: per-version batch logs, likewise.

    Attributes:
        instances: every known instance.
        active: the generation that takes each version's new requests.
        retiring: generations finishing their queues, oldest first.
        leaving: instances a regroup removed, until they stop.
    """

    def __init__(
        self,
        models: Iterable[ModelVersionSpec],
        out: Outbox,
        stats: StatsBook,
        logs: BatchLogs,
    ) -> None:
        self.instances = InstanceTable()
        self.active: dict[VersionKey, Generation] = {}
        self.retiring: list[Generation] = []
        self.leaving: list[Instance] = []
        self.log_settings: LogSettingsUpdate | None = None
        """The log settings a client set (None: the start-up ones); a worker that becomes
        ready gets them, as it started from the supervisor's spec."""
        self._out = out
        self._stats = stats
        self._logs = logs
        self._decoder: Decoder[ModelVersionSpec] = Decoder(ModelVersionSpec)
        for spec in models:
            gen = self._start_generation(spec)
            for i, name in self._names(spec):
                self.instances.add(Instance(i, name, gen.key, InstanceState.ACTIVE, generation=gen))

    # -------------------------------------------------------------------- queries
    def generation_for(self, key: VersionKey) -> Generation | None:
        """The generation a request for ``key`` joins: the active one, else the newest
        retiring one (a request a frontend sent just before it dropped the version)."""
        gen = self.active.get(key)
        if gen is None:
            gen = next((g for g in reversed(self.retiring) if g.key == key), None)
        return gen

    def generations(self) -> list[Generation]:
        """Every generation with a queue: the active ones, then the retiring ones."""
        return [*self.active.values(), *self.retiring]

    def retirement_due(self) -> bool:
        """Whether a retirement may end on the next pass without any message arriving."""
        return any(
            not g.policy.queue_depth()
            and not g.pins
            and not any(i.busy for i in self.instances.members(g))
            for g in self.retiring
        ) or any(self._may_leave(i) for i in self.leaving)

    # ------------------------------------------------------------- model changes
    def on_added(self, msg: InstancesAdded, now_ns: int) -> None:
        """Attach and stage new instances."""
        for w in msg.instances:
            self._out.attach(w)
            self.instances.add(Instance(w.instance_id, w.name, (w.model, w.version)))

    def _restart_callers(self, model: str) -> None:
        """``model`` was reloaded as a new model: the statistics of every active ensemble
        that calls it, directly or through another ensemble, start again too (2.51's
        repository manager reloads a loaded model's dependents after it)."""
        called, restarted = [model], set()
        while called:
            name = called.pop()
            for key, gen in self.active.items():
                ensemble = gen.spec.ensemble
                if key in restarted or ensemble is None:
                    continue
                if any(step.model == name for step in ensemble.steps):
                    restarted.add(key)
                    self._stats.restart(*key)
                    called.append(key[0])

    def on_activated(self, msg: VersionsActivated, now_ns: int) -> None:
        """New versions (or new generations of loaded ones) take the version's requests
        from now on; a generation they replace finishes its queue, then stops."""
        for raw in msg.specs:
            spec = self._decoder.decode(raw)
            old = self.active.get((spec.model, spec.version))
            gen = self._start_generation(spec)
            if old is not None and is_new_model(old.spec.config_json, spec.config_json):
                self._stats.restart(*gen.key)
                self._restart_callers(spec.model)
            if old is not None:
                self._retire(old)
                for member in self.instances:
                    if member.generation is old:
                        member.state = InstanceState.RETIRING
            for i, name in self._names(spec):
                self._join(gen, i, name, now_ns)
            log.info(
                "model '%s' version %d active on %d instances",
                spec.model,
                spec.version,
                len(spec.instance_ids),
                extra={"model": spec.model},
            )

    def on_retired(self, msg: InstancesRetired, now_ns: int) -> None:
        """Frontends no longer route to these instances' generations, or to these
        versions (an ensemble's, which has no instances): retire them."""
        for key in msg.versions:
            gen = self.active.get(key)
            if gen is not None:
                self._retire(gen)
        for i in msg.instance_ids:
            inst = self.instances.get(i)
            if inst is None or inst.generation is None:
                continue
            self._retire(inst.generation)
            inst.state = InstanceState.RETIRING

    def on_regrouped(self, msg: InstancesRegrouped, now_ns: int) -> None:
        """The version's generation goes on with ``msg.spec``'s instances (see the module
        docstring): no new generation, its statistics and queue stay."""
        spec = self._decoder.decode(msg.spec)
        gen = self.active.get((spec.model, spec.version))
        if gen is None:
            log.warning("regroup of '%s' version %d: not active", spec.model, spec.version)
            return
        before, after = set(gen.spec.instance_ids), set(spec.instance_ids)
        added = [i for i in spec.instance_ids if i not in before]
        gone = [i for i in gen.spec.instance_ids if i not in after]
        gen.spec = spec
        gen.policy.regroup(added, gone)
        for i in gone:
            inst = self.instances.get(i)
            if inst is not None and inst.state is InstanceState.ACTIVE:
                inst.state = InstanceState.LEAVING
                self.leaving.append(inst)
        for i, name in self._names(spec):
            if i in added:
                self._join(gen, i, name, now_ns)
        log.info(
            "model '%s' version %d: instances regrouped in place (%d added, %d leaving)",
            spec.model,
            spec.version,
            len(added),
            len(gone),
            extra={"model": spec.model},
        )

    def on_removed(self, msg: InstancesRemoved, now_ns: int) -> None:
        """The processes are gone: forget the instances, detach their rings."""
        for i in msg.instance_ids:
            inst = self.instances.pop(i)
            if inst is not None and inst.generation is not None:
                inst.generation.policy.instance_gone(i)
            self._out.detach(i)

    def finish_retirements(self, now_ns: int) -> None:
        """Stop the instances of retired generations whose queues ran dry (see
        ``Generation.armed``), and the leaving instances that hold nothing any more."""
        if self.leaving:
            self._finish_leaving()
        keep = []
        for gen in self.retiring:
            members = self.instances.members(gen)
            busy = any(inst.busy for inst in members)
            alive = [inst for inst in members if inst.health is not Health.DEAD]
            if not alive and gen.policy.queue_depth():
                for item in gen.policy.drain_queue():
                    req = cast(Request, item.payload)
                    self._out.fail(req, ErrorCode.UNAVAILABLE, STOPPING_MESSAGE, now_ns)
            if not gen.armed or busy or gen.policy.queue_depth() or gen.pins:
                gen.armed = True
                keep.append(gen)
                continue
            for inst in members:
                gen.policy.instance_gone(inst.instance_id)
                inst.state = InstanceState.STOPPING
                if inst.health is not Health.DEAD:
                    self._out.to_instance(inst.instance_id, Shutdown(readers_s=READERS_S))
            if gen.key not in self.active:
                self._stats.remove(*gen.key)
                self._logs.remove(gen.key)
            log.info(
                "model '%s' version %d: %d retired instances stopping",
                gen.key[0],
                gen.key[1],
                len(alive),
                extra={"model": gen.key[0]},
            )
        self.retiring = keep

    def _may_leave(self, inst: Instance) -> bool:
        """Whether a leaving instance runs nothing and holds no live sequence (one of a
        generation that retired since gets no more requests: it holds nothing)."""
        gen = inst.generation
        held = gen is not None and not gen.retiring and gen.policy.holds(inst.instance_id)
        return not inst.busy and inst.behind is None and not inst.staged and not held

    def _finish_leaving(self) -> None:
        """Send ``Shutdown`` to the leaving instances that may leave now."""
        keep = []
        for inst in self.leaving:
            if inst.state is InstanceState.STOPPING:
                continue
            if not self._may_leave(inst):
                keep.append(inst)
                continue
            if inst.generation is not None:
                inst.generation.policy.instance_gone(inst.instance_id)
            inst.state = InstanceState.STOPPING
            if inst.health is not Health.DEAD:
                self._out.to_instance(inst.instance_id, Shutdown(readers_s=READERS_S))
            log.info(
                "instance %s of model '%s' left its instance group: stopping",
                inst.label,
                inst.key[0],
                extra={"model": inst.key[0], "instance": inst.label},
            )
        self.leaving = keep

    # ------------------------------------------------------------------ workers
    def on_ready(self, msg: WorkerReady, now_ns: int) -> None:
        """A worker loaded its model: a staged one waits for its version, another one idles
        (and counts a restart when it had died)."""
        inst = self.instances.get(msg.instance_id)
        if inst is None:
            return
        inst.ready_check = msg.ready_check
        if self.log_settings is not None:
            self._out.to_instance(inst.instance_id, self.log_settings)
        if inst.state is InstanceState.STAGED:
            inst.health = Health.READY
            inst.warmup = msg.warmup  # NOTE: its version's books start at its activation
            return
        self._count_warmup(inst.key, msg.warmup)
        log.info(
            "instance %s ready (pid %d)",
            inst.label,
            msg.pid,
            extra={"model": inst.key[0], "instance": inst.name},
        )
        if inst.health is Health.DEAD:
            inst.restarts += 1
        with self._availability(inst.key):
            inst.health = Health.READY
            if inst.generation is not None:
                inst.generation.policy.instance_idle(inst.instance_id, now_ns)

    def on_died(self, msg: WorkerDied, now_ns: int) -> None:
        """A worker exited: its batch fails, its open decoupled requests end."""
        inst = self.instances.get(msg.instance_id)
        if inst is None:
            return
        if inst.state is InstanceState.STAGED:
            inst.health = Health.STARTING
            return
        if inst.generation is not None:
            inst.generation.policy.instance_gone(inst.instance_id)
        with self._availability(inst.key):
            inst.health = Health.DEAD
        flight, inst.batch = inst.batch, None
        open_requests, inst.open = inst.open, {}
        model = inst.key[0]
        log.warning(
            "instance %s of model '%s' died with exit code %d; failing %d in-flight requests",
            inst.label,
            model,
            msg.exitcode,
            len(flight.requests) if flight else 0,
            extra={"model": model, "instance": inst.label},
        )
        if flight is not None:
            text = died_running(inst.label, model, msg)
            for r in flight.requests:
                open_requests.pop((r.reply_to, r.request_id), None)
                self._out.fail(r, ErrorCode.UNAVAILABLE, text, now_ns)
        # NOTE: decoupled requests whose execute had returned: counted already, so only
        # their streams are ended here.
        text = (
            f"model instance '{inst.label}' of '{model}' died with exit code {msg.exitcode} "
            "before the final response of the request"
        )
        for r in open_requests.values():
            self._out.end(r, ErrorCode.UNAVAILABLE, text)

    # ------------------------------------------------------------------ helpers
    def _join(self, gen: Generation, instance_id: int, name: str, now_ns: int) -> None:
        """Make an instance of ``gen`` active; one that reported ready while staged idles."""
        inst = self.instances.get(instance_id)
        if inst is None:
            inst = Instance(instance_id, name, gen.key)
            self.instances.add(inst)
        inst.name = name or inst.name
        staged_ready = inst.state is InstanceState.STAGED and inst.health is Health.READY
        with self._availability(gen.key):
            inst.key, inst.generation, inst.state = gen.key, gen, InstanceState.ACTIVE
            if staged_ready:
                gen.policy.instance_idle(instance_id, now_ns)
        if staged_ready:
            self._count_warmup(gen.key, inst.warmup)
            inst.warmup = ()

    def _count_warmup(self, key: VersionKey, runs: Iterable[WarmupRun]) -> None:
        """Count an instance's warmup executions in its version's statistics, as Triton's
        core counts them (``WarmUp`` stamps each request's start: every request a success
        that queued for no time, each execution one batch of its requests)."""
        for requests, start_ns, input_ns, infer_ns, end_ns in runs:
            # NOTE: positional (StatsBook.record_execution's order).
            self._stats.record_execution(
                key, requests, requests * start_ns, start_ns, requests, requests,
                input_ns, infer_ns, 0, end_ns,
            )  # fmt: skip

    def _start_generation(self, spec: ModelVersionSpec) -> Generation:
        gen = Generation(spec, make_policy(spec), spec.enforced_inputs, spec.has_optional_inputs)
        gen.plain = plain_queue(gen)
        self.active[gen.key] = gen
        self._stats.add(*gen.key)
        self._logs.add(gen.key)
        return gen

    def _retire(self, gen: Generation) -> None:
        if not gen.retiring:
            gen.retiring = True
            self.retiring.append(gen)
        if self.active.get(gen.key) is gen:
            del self.active[gen.key]

    @staticmethod
    def _names(spec: ModelVersionSpec) -> list[tuple[int, str]]:
        names = list(spec.instance_names)
        return [(i, names[n] if n < len(names) else "") for n, i in enumerate(spec.instance_ids)]

    def _availability(self, key: VersionKey) -> _Availability:
        return _Availability(self, key)


class _Availability:
    """``with lifecycle._availability(key): <change>``: after the change, tell every
    frontend when ``key`` gained its first live instance or lost its last one."""

    def __init__(self, lifecycle: Lifecycle, key: VersionKey) -> None:
        self._lifecycle = lifecycle
        self._key = key
        self._before = False

    def __enter__(self) -> None:
        self._before = self._lifecycle.instances.any_live(self._key)

    def __exit__(self, *exc: object) -> None:
        after = self._lifecycle.instances.any_live(self._key)
        if after != self._before:
            model, version = self._key
            self._lifecycle._out.broadcast(
                ModelAvailability(model=model, version=version, ready=after)
            )
