"""Worker instances for model control: wire, start, stop and free them.

Imported by ``supervisor.models.model_control``. For a change's new instances it creates their IPC
objects (``supervisor.processes.wiring``) and BLS rings (as ``supervisor.processes.bls_wiring``
plans them),
tells the scheduler their rings (``InstancesAdded``), the running workers and BLS clients
their new peers (``BlsWorkerUpdate``, ``BlsInboxUpdate``, written on the supervisor's own
control rings into each worker's inbox and each BLS client's inbox: a worker applies the
updates of a drain before its batches, ``workers.main.control_first``) and every frontend
the rings to attach (acknowledged), then spawns them all through the process table
(``supervisor.processes.children``). After ``VersionsActivated`` and before anything is retired,
every BLS client gets the new table of models it may call (``push_bls_table``). Stopped instances
leave every BLS inbox and sender set, the scheduler and the frontends before their objects
are unlinked. A worker's spec is rewritten with each update, so a restarted worker starts
wired as the one it replaces.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from triton_mp.common.config import ServerConfig
from triton_mp.common.process.gpus import Devices, worker_env
from triton_mp.ipc import ChannelTimeout, Sender, encode
from triton_mp.ipc.direct import DirectRoute, handoff_eligible
from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.memory.ring import RecordTooLarge
from triton_mp.ipc.protocol.control_messages import ModelTableUpdate
from triton_mp.ipc.protocol.messages import (
    BlsClientWiring,
    BlsInboxUpdate,
    BlsWorkerUpdate,
    DropSegments,
    InstancesAdded,
    InstancesRemoved,
    InstanceWiring,
)
from triton_mp.ipc.protocol.specs import (
    BlsModel,
    BlsSpec,
    ChannelSpec,
    InboxSpec,
    ModelVersionSpec,
    WorkerSpec,
    current_log_spec,
)
from triton_mp.model_config.plan import ModelPlan
from triton_mp.supervisor.processes.bls_wiring import (
    BlsAddPlan,
    bls_table,
    plan_bls_add,
    plan_bls_remove,
)
from triton_mp.supervisor.processes.children import Child, ChildTable
from triton_mp.supervisor.processes.frontend_link import FrontendLink
from triton_mp.supervisor.processes.wiring import BlsClientChannels, InstanceChannels, Wiring

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0
"""At least this long (or ``--exit-timeout-secs``) for a retired worker to exit."""


BlsUpdate = tuple[int, BlsWorkerUpdate | BlsInboxUpdate]
"""An update for instance ``id``: to its worker (``BlsWorkerUpdate``) or its BLS client."""


@dataclass
class _Wired:
    """A started instance (until its objects are removed), the spec it (re)starts with and
    the supervisor's control rings to it (BLS updates go there, never through the
    scheduler)."""

    child: Child
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


class Instances:
    """Every started instance's wiring (see the module docstring).

    Args:
        config: arena sizes and ``--exit-timeout-secs``.
        wiring: creates and unlinks the objects.
        table: the process table.
        link: the frontends' control pipes.
        send_scheduler: pushes a message to the scheduler (thread-safe).
        scheduler_wakeup: the scheduler's inbox wake-up (workers' rings to it post it).
        frontend_wakeups: per frontend id, its inbox wake-up.
    """

    def __init__(
        self,
        config: ServerConfig,
        wiring: Wiring,
        table: ChildTable,
        link: FrontendLink,
        send_scheduler: Callable[[object], None],
        scheduler_wakeup: Wakeup,
        frontend_wakeups: dict[int, Wakeup],
        devices: Devices | None = None,
    ) -> None:
        self._cfg = config
        self._devices = devices if devices is not None else Devices()
        self._wiring = wiring
        self._top = wiring.topology
        self._table = table
        self._link = link
        self._send = send_scheduler
        self._sched_wakeup = scheduler_wakeup
        self._fe_wakeups = frontend_wakeups
        self._wired: dict[int, _Wired] = {}
        """Every started instance whose objects still exist, by instance id."""
        self._routes: dict[int, tuple[DirectRoute, ...]] = {}
        """Per started instance whose version may be handed requests directly: its route
        for each frontend (``ipc.direct``)."""
        self._bls_table: dict[str, BlsModel] = {}
        """The table of models the BLS clients hold (the served versions)."""
        self._bls_seq = 0
        self._control: tuple[str, bytes] = ("", b"")

    @property
    def devices(self) -> Devices:
        """The server's GPUs (discovered at start)."""
        return self._devices

    def frontend_rings(self, instance_ids: Iterable[int], frontend_id: int) -> tuple[str, ...]:
        """The rings from instances to one frontend (its spec at start)."""
        return tuple(self._top.worker_to_frontend(i, frontend_id) for i in instance_ids)

    def direct_routes(
        self, instance_ids: Iterable[int], frontend_id: int
    ) -> tuple[DirectRoute, ...]:
        """One frontend's direct routes to instances (its spec at start)."""
        return tuple(
            r for i in instance_ids for r in self._routes.get(i, ()) if r.frontend_id == frontend_id
        )

    def _worker_lease(self, model: ModelVersionSpec, ch: InstanceChannels) -> str:
        """The lease a worker re-offers after its batches (``WorkerSpec.lease``): its
        instance's, when the direct handoff serves its version."""
        return ch.lease if handoff_eligible(model, self._cfg.rate_limit != "off") else ""

    def _plan_routes(self, spec: WorkerSpec, ch: InstanceChannels) -> tuple[DirectRoute, ...]:
        """The routes of a new instance, one per frontend; none when its version's requests
        are never handed straight to it (``ipc.direct.handoff_eligible``)."""
        if not handoff_eligible(spec.model, self._cfg.rate_limit != "off"):
            return ()
        w = spec.instance
        return tuple(
            DirectRoute(
                instance_id=w.instance_id,
                model=w.model,
                version=w.version,
                frontend_id=f,
                ring=ring,
                wakeup=ch.wakeup,
                lease=ch.lease,
            )
            for f, ring in ch.from_frontends.items()
        )

    # ------------------------------------------------------------------ start
    def start(self, plans: list[ModelPlan]) -> dict[int, Child]:
        """Wire and spawn the instances of ``plans``; returns them by instance id (managed:
        the caller awaits them and releases those that serve)."""
        n_fe = len(self._fe_wakeups)
        bls = self._plan_bls(plans)
        children: dict[int, Child] = {}
        wiring: list[InstanceWiring] = []
        rings: dict[int, list[str]] = {f: [] for f in range(n_fe)}
        routes: list[DirectRoute] = []
        for p in plans:
            by_version = {v.version: v for v in p.versions}
            for w in p.instances:
                iid = w.instance_id
                ch = self._wiring.create_instance(iid, n_fe)
                for f, ring in ch.to_frontends.items():
                    rings[f].append(ring)
                spec = WorkerSpec(
                    instance=w,
                    model=p.worker_model(by_version[w.version]),
                    # NOTE: the scheduler's ring first: a drain then sees every BLS update
                    # written before the batches it sees (workers.main.control_first).
                    inbox=InboxSpec(
                        ch.wakeup, (ch.to_worker, ch.control, *ch.from_frontends.values())
                    ),
                    to_scheduler=ChannelSpec(ch.from_worker, self._sched_wakeup),
                    to_frontends={
                        i: ChannelSpec(ch.to_frontends[i], self._fe_wakeups[i]) for i in range(n_fe)
                    },
                    to_bls_clients=bls.to_clients[iid],
                    arena_prefix=self._top.worker_arenas(iid),
                    arena_bytes=self._cfg.output_arena_bytes,
                    arena_budget_bytes=self._cfg.arena_budget_bytes,
                    log=current_log_spec(),
                    bls=bls.clients.get(iid),
                    lease=self._worker_lease(by_version[w.version], ch),
                )
                env = worker_env(w.kind, w.gpu_id, self._devices)
                children[iid] = Child.worker(spec, env)
                client = bls.controls.get(iid)
                self._wired[iid] = _Wired(
                    children[iid],
                    spec,
                    Sender(ch.control, ch.wakeup),
                    None if client is None else Sender(client.control, client.wakeup),
                )
                direct = self._plan_routes(spec, ch)
                if direct:
                    self._routes[iid] = direct
                    routes.extend(direct)
                wired = _instance_wiring(spec, ch.to_worker, ch.wakeup, ch.from_worker, bls)
                if direct:
                    wired = msgspec.structs.replace(wired, lease=ch.lease)
                wiring.append(wired)
        self._send(InstancesAdded(instances=tuple(wiring)))
        # NOTE: running workers open their rings to the new clients, running clients attach
        # the new instances' rings: both before any new instance is spawned.
        self._send_bls(bls.updates)
        # NOTE: before any request can reach a new instance, every frontend reads its ring,
        # and only its own: a ring has one reader, and a frontend that drained another's
        # would take answers whose request ids (counted per frontend) may be its own too.
        self._link.update_each(
            {
                f: ModelTableUpdate(add_rings=tuple(r), add_routes=tuple(routes))
                for f, r in rings.items()
            },
            ack=True,
        )
        self._table.add(children.values())
        for child in children.values():
            self._table.spawn(child)
        return children

    def _plan_bls(self, plans: list[ModelPlan]) -> _BlsWiring:
        """Create the BLS rings of a change's new instances (``plans``) and rewire the
        running ones (their specs now, their processes by the returned ``updates``)."""
        new = [w.instance_id for p in plans for w in p.instances]
        bls = {(v.model, v.version): v.capabilities.bls for p in plans for v in p.versions}
        new_clients = [
            w.instance_id for p in plans for w in p.instances if bls[(w.model, w.version)]
        ]
        old_clients = [i for i, x in self._wired.items() if x.bls is not None]
        plan = plan_bls_add(list(self._wired), old_clients, new, new_clients)
        wakeups: dict[int, Wakeup] = {
            i: x.bls.inbox.wakeup for i, x in self._wired.items() if x.bls is not None
        }
        out = _BlsWiring()
        for c in new_clients:
            out.controls[c] = self._wiring.create_bls_client(c)
            wakeups[c] = out.controls[c].wakeup
        ring = {(p, c): self._wiring.create_bls_ring(p, c) for p, c in plan.rings}
        for w, clients in plan.answers_of_new.items():
            out.to_clients[w] = {c: ChannelSpec(ring[(w, c)], wakeups[c]) for c in clients}
        for c, producers in plan.inbox_of_new_client.items():
            inbox = (
                out.controls[c].from_scheduler,
                out.controls[c].control,
                *(ring[(p, c)] for p in producers),
            )
            out.clients[c] = BlsSpec(
                inbox=InboxSpec(wakeups[c], inbox),
                models=self._bls_table,
                seq=self._bls_seq,
                control_address=self._control[0],
                control_key=self._control[1],
            )
        self._rewire_running(plan, ring, wakeups, out)
        return out

    def _rewire_running(
        self,
        plan: BlsAddPlan,
        ring: dict[tuple[int, int], str],
        wakeups: dict[int, Wakeup],
        out: _BlsWiring,
    ) -> None:
        for i, x in self._wired.items():
            gains = plan.worker_gains.get(i, ())
            if gains:
                add = tuple(
                    BlsClientWiring(instance_id=c, ring=ring[(i, c)], wakeup=wakeups[c])
                    for c in gains
                )
                channels = {a.instance_id: ChannelSpec(a.ring, a.wakeup) for a in add}
                to_clients = x.spec.to_bls_clients | channels
                x.respec(msgspec.structs.replace(x.spec, to_bls_clients=to_clients))
                out.updates.append((i, BlsWorkerUpdate(instance_id=i, add_clients=add)))
            producers = plan.inbox_gains.get(i, ())
            if x.bls is not None and producers:
                added = tuple(ring[(n, i)] for n in producers)
                inbox = InboxSpec(x.bls.inbox.wakeup, x.bls.inbox.rings + added)
                x.respec(
                    msgspec.structs.replace(x.spec, bls=msgspec.structs.replace(x.bls, inbox=inbox))
                )
                out.updates.append((i, BlsInboxUpdate(add_rings=added)))

    def set_model_control(self, address: str, authkey: bytes) -> None:
        """Where python workers send ``pb_utils.load_model`` / ``unload_model``
        (``supervisor.models.bls_control``): given to every BLS client started from now on."""
        self._control = (address, authkey)

    def push_bls_table(
        self,
        versions: Iterable[ModelVersionSpec],
        unavailable: Mapping[str, Iterable[int]] | None = None,
    ) -> None:
        """Give every BLS client the table of ``versions`` (those served now) and of the
        versions models have but do not serve (``unavailable``), if it changed
        (``BlsWorkerUpdate`` on its worker's control ring)."""
        table = bls_table(versions, unavailable)
        if table == self._bls_table:
            return
        self._bls_table = table
        self._bls_seq += 1
        for i, x in self._wired.items():
            if x.bls is None:
                continue
            bls = msgspec.structs.replace(x.bls, models=table, seq=self._bls_seq)
            x.respec(msgspec.structs.replace(x.spec, bls=bls))
            self._send_bls([(i, BlsWorkerUpdate(instance_id=i, seq=self._bls_seq, models=table))])

    def drop_segments(
        self, prefix: str, holder: int = 0, frontend_id: int = -1, requests_below: int = 0
    ) -> None:
        """Tell every running worker to unmap the arenas named ``prefix...`` (a dead
        frontend's, unlinked already), to free the output blocks the dead process
        ``holder`` (its pid) held in place (``ipc.output_holds``) and to count the requests
        of ``frontend_id`` with ids below ``requests_below`` cancelled, on the supervisor's
        control ring into its inbox (``DropSegments``)."""
        msg = DropSegments(
            prefixes=(prefix,),
            holder=holder,
            frontend_id=frontend_id,
            requests_below=requests_below,
        )
        for instance_id, x in list(self._wired.items()):
            try:
                x.control.send(msg)
            except (ChannelTimeout, RecordTooLarge):
                # NOTE: a stuck worker keeps the mapping; the memory goes when it exits.
                log.warning("instance %d did not take the dead frontend's arenas", instance_id)

    def _send_bls(self, updates: list[BlsUpdate]) -> None:
        """Write BLS updates on the supervisor's control rings: a ``BlsWorkerUpdate`` to its
        worker's inbox, a ``BlsInboxUpdate`` to the BLS client of that instance. Each lands
        before anything that depends on it can reach the worker (see ``start``)."""
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

    # ------------------------------------------------------------------- stop
    def discard(self, children: list[Child]) -> None:
        """Kill instances that will not serve (a failed load) and free what they had."""
        for c in children:
            self._table.kill(c)
        self._cleanup(children)

    @property
    def stop_timeout_s(self) -> float:
        """Seconds a retired worker has to exit before it is killed: ``STOP_TIMEOUT_S``, or
        the server's exit timeout when longer."""
        return max(STOP_TIMEOUT_S, self._cfg.exit_timeout_s)

    def await_stopped(self, children: list[Child]) -> None:
        """Wait for retired workers to exit (the scheduler stops them once their requests
        are answered; killed after ``stop_timeout_s``), then free what they had."""
        self._table.await_exit(children, self.stop_timeout_s)
        self._cleanup(children)

    def _cleanup(self, children: list[Child]) -> None:
        """Forget stopped instances: BLS peers, scheduler, frontends, process table, shared
        memory."""
        if not children:
            return
        ids = tuple(c.instance_id for c in children)
        self._unwire_bls(ids)
        segments = tuple(self._top.worker_segments(i) for i in ids)
        self._send(InstancesRemoved(instance_ids=ids, segments=segments))
        n_fe = len(self._fe_wakeups)
        routes = tuple(i for i in ids if self._routes.pop(i, None))
        self._link.update_each(
            {
                f: ModelTableUpdate(
                    remove_rings=tuple(self._top.worker_to_frontend(i, f) for i in ids),
                    drop_segments=segments,
                    remove_routes=routes,
                )
                for f in range(n_fe)
            },
            ack=True,
        )
        self._table.remove(children)
        self._wiring.remove_instances(set(ids))

    def _unwire_bls(self, ids: tuple[int, ...]) -> None:
        """The instances ``ids`` stopped: every other worker closes its rings to their
        clients and every other client drops their rings (what those still hold is
        delivered)."""
        gone = [self._wired.pop(i) for i in ids if i in self._wired]
        for x in gone:
            x.close()
        gone_clients = [x.child.instance_id for x in gone if x.bls is not None]
        remaining_clients = [i for i, x in self._wired.items() if x.bls is not None]
        plan = plan_bls_remove(list(self._wired), remaining_clients, ids, gone_clients)
        updates: list[BlsUpdate] = []
        for w, x in self._wired.items():
            lost = plan.worker_losses.get(w, ())
            if lost:
                to_clients = {k: v for k, v in x.spec.to_bls_clients.items() if k not in lost}
                x.respec(msgspec.structs.replace(x.spec, to_bls_clients=to_clients))
                updates.append((w, BlsWorkerUpdate(instance_id=w, remove_clients=lost)))
            if x.bls is None:
                continue
            gone_rings = {self._top.worker_to_bls(p, w) for p in plan.inbox_losses.get(w, ())}
            removed = tuple(r for r in x.bls.inbox.rings if r in gone_rings)
            if not removed:
                continue
            kept = tuple(r for r in x.bls.inbox.rings if r not in gone_rings)
            bls = msgspec.structs.replace(x.bls, inbox=InboxSpec(x.bls.inbox.wakeup, kept))
            x.respec(msgspec.structs.replace(x.spec, bls=bls))
            updates.append((w, BlsInboxUpdate(remove_rings=removed)))
        self._send_bls(updates)


@dataclass
class _BlsWiring:
    """The BLS side of a change's new instances (``Instances._plan_bls``)."""

    clients: dict[int, BlsSpec] = field(default_factory=dict)
    """Per new python instance id: its BLS client."""
    controls: dict[int, BlsClientChannels] = field(default_factory=dict)
    """Per new python instance id: its BLS inbox's semaphore and rings from the scheduler
    and the supervisor."""
    to_clients: dict[int, dict[int, ChannelSpec]] = field(default_factory=dict)
    """Per new instance id: python worker instance id -> its ring to that worker's BLS
    client."""
    updates: list[BlsUpdate] = field(default_factory=list)
    """For running workers and clients (``Instances._send_bls``)."""


def _instance_wiring(
    spec: WorkerSpec, to_worker: str, wakeup: Wakeup, from_worker: str, bls: _BlsWiring
) -> InstanceWiring:
    """What the scheduler needs to reach a new instance (and its BLS client)."""
    w, client = spec.instance, bls.controls.get(spec.instance.instance_id)
    return InstanceWiring(
        instance_id=w.instance_id,
        name=w.name,
        model=w.model,
        version=w.version,
        to_worker_ring=to_worker,
        to_worker_wakeup=wakeup,
        from_worker_ring=from_worker,
        bls_client=None
        if client is None
        else BlsClientWiring(
            instance_id=w.instance_id, ring=client.from_scheduler, wakeup=client.wakeup
        ),
    )
