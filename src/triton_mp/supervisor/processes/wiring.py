"""IPC wiring: the only creator and unlinker of the server's rings, semaphores and boards.

Imported by ``supervisor.main`` (the server-wide objects, and the final cleanup) and
``supervisor.processes.instances`` (each instance's objects and BLS rings, and their removal). Names
come from ``ipc.memory.topology``. Tensor arenas are the exception to "only creator": each
frontend and worker allocates its own (STYLE.md rule 6); this module unlinks those of dead
worker processes and, at exit, everything left of the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from triton_mp.common.config import ServerConfig
from triton_mp.ipc import Ring, sweep_stale
from triton_mp.ipc.direct import create_lease
from triton_mp.ipc.memory.heartbeat import HeartbeatBoard
from triton_mp.ipc.memory.notify import Wakeup, create_wakeup
from triton_mp.ipc.memory.shm import claim_server_id, list_objects, remove_entry
from triton_mp.ipc.memory.topology import Topology
from triton_mp.ipc.protocol.specs import ChannelSpec

if TYPE_CHECKING:
    from triton_mp.ipc.memory.response_cache import SharedResponseCache


@dataclass(frozen=True)
class ServerChannels:
    """The server-wide objects between frontends, scheduler and supervisor."""

    frontend_inbox_rings: tuple[str, ...]
    """Per frontend id: its ring to the scheduler."""
    supervisor_ring: str
    """The supervisor's ring to the scheduler."""
    scheduler_wakeup: Wakeup
    frontend_wakeups: dict[int, Wakeup]
    """Per frontend id: its inbox FIFO (asyncio frontends watch a descriptor)."""
    scheduler_to_frontends: dict[int, ChannelSpec]
    """Per frontend id: the scheduler's channel to it."""
    peer_rings: dict[tuple[int, int], str]
    """``(frontend, peer)`` -> the ring from one frontend into another's inbox (client
    shared-memory registrations; none with a single frontend)."""


@dataclass(frozen=True)
class InstanceChannels:
    """One instance's objects (its BLS rings are created apart)."""

    wakeup: Wakeup
    """The worker's inbox semaphore."""
    to_worker: str
    """Ring scheduler -> worker."""
    control: str
    """Ring supervisor -> worker (``BlsWorkerUpdate``), beside the scheduler's."""
    from_worker: str
    """Ring worker -> scheduler."""
    to_frontends: dict[int, str]
    """Per frontend id: the worker's answer ring to it."""
    from_frontends: dict[int, str]
    """Per frontend id: its ring into the worker's inbox (direct handoffs, ``ipc.direct``)."""
    lease: str
    """The instance's lease semaphore (``ipc.direct``)."""


@dataclass(frozen=True)
class BlsClientChannels:
    """A python instance's BLS client inbox objects (the answer rings are created apart)."""

    wakeup: Wakeup
    """The BLS inbox's semaphore."""
    from_scheduler: str
    """Ring scheduler -> BLS client (failures the scheduler answers)."""
    control: str
    """Ring supervisor -> BLS client (``BlsInboxUpdate``)."""


class Wiring:
    """Creates and unlinks one server's IPC objects.

    Args:
        config: ring sizes (``ring_bytes``, ``worker_ring_bytes``, ``answer_ring_bytes``).
        topology: the server's names.
    """

    def __init__(self, config: ServerConfig, topology: Topology) -> None:
        self._cfg = config
        self.topology = topology

    def _ring(self, name: str, capacity_bytes: int) -> str:
        Ring.create(name, capacity_bytes).close()
        return name

    # ------------------------------------------------------------ server-wide
    def sweep_stale(self) -> None:
        """Remove what dead servers of this pid namespace (or a dead process with this pid)
        left behind, then mark this server's id as this namespace's (before any object)."""
        sweep_stale(self.topology.server_id)
        claim_server_id(self.topology.server_id)

    def create_heartbeat_board(self, slots: int) -> HeartbeatBoard:
        """The heartbeat board (``ipc.memory.heartbeat``), zeroed."""
        return HeartbeatBoard.create(self.topology.heartbeat(), slots)

    def create_response_cache(self, capacity_bytes: int) -> SharedResponseCache:
        """The local response cache (``--cache-config local,size=N``), empty. Its module
        (numpy) is imported here: only a server with the cache on loads numpy for it."""
        from triton_mp.ipc.memory.response_cache import SharedResponseCache  # noqa: PLC0415

        return SharedResponseCache.create(self.topology.response_cache(), capacity_bytes)

    def create_server(self, n_frontends: int) -> ServerChannels:
        """The rings and wake-ups between ``n_frontends`` frontends, the scheduler and the
        supervisor."""
        top, size = self.topology, self._cfg.ring_bytes
        inbox_rings = tuple(
            self._ring(top.frontend_inbox_ring(i), size) for i in range(n_frontends)
        )
        supervisor_ring = self._ring(top.supervisor_ring(), size)
        scheduler_wakeup = create_wakeup("semaphore", top.scheduler_wakeup())
        # NOTE: frontends run asyncio loops that watch a FIFO; see ipc/memory/notify.py.
        fe_wakeups = {i: create_wakeup("fifo", top.frontend_wakeup(i)) for i in range(n_frontends)}
        to_frontends = {
            i: ChannelSpec(self._ring(top.scheduler_to_frontend(i), size), fe_wakeups[i])
            for i in range(n_frontends)
        }
        # NOTE: client shared-memory registrations go from frontend to frontend directly.
        peers = {
            (i, j): self._ring(top.frontend_to_frontend(i, j), self._cfg.answer_ring_bytes)
            for i in range(n_frontends)
            for j in range(n_frontends)
            if i != j
        }
        return ServerChannels(
            inbox_rings, supervisor_ring, scheduler_wakeup, fe_wakeups, to_frontends, peers
        )

    # ----------------------------------------------------------- per instance
    def create_instance(self, instance_id: int, n_frontends: int) -> InstanceChannels:
        """One new instance's inbox semaphore and its rings to and from the scheduler and to
        every frontend."""
        top, cfg, iid = self.topology, self._cfg, instance_id
        return InstanceChannels(
            wakeup=create_wakeup("semaphore", top.worker_wakeup(iid)),
            to_worker=self._ring(top.scheduler_to_worker(iid), cfg.ring_bytes),
            control=self._ring(top.supervisor_to_worker(iid), cfg.answer_ring_bytes),
            from_worker=self._ring(top.worker_to_scheduler(iid), cfg.worker_ring_bytes),
            to_frontends={
                i: self._ring(top.worker_to_frontend(iid, i), cfg.answer_ring_bytes)
                for i in range(n_frontends)
            },
            from_frontends={
                i: self._ring(top.frontend_to_worker(iid, i), cfg.answer_ring_bytes)
                for i in range(n_frontends)
            },
            lease=create_lease(top.worker_lease(iid)),
        )

    def create_bls_client(self, client: int) -> BlsClientChannels:
        """A new BLS client's inbox semaphore and its rings from the scheduler and from the
        supervisor."""
        top, size = self.topology, self._cfg.answer_ring_bytes
        return BlsClientChannels(
            wakeup=create_wakeup("semaphore", top.bls_wakeup(client)),
            from_scheduler=self._ring(top.scheduler_to_bls(client), size),
            control=self._ring(top.supervisor_to_bls(client), size),
        )

    def create_bls_ring(self, producer: int, client: int) -> str:
        """The answer ring from instance ``producer`` to BLS client ``client``."""
        name = self.topology.worker_to_bls(producer, client)
        return self._ring(name, self._cfg.answer_ring_bytes)

    # ---------------------------------------------------------------- removal
    def remove_instances(self, instance_ids: set[int]) -> None:
        """Unlink every object of stopped instances: rings, semaphores, arenas of all their
        processes, and the BLS rings to and from them."""
        top = self.topology
        for entry in top.of_instances(list_objects(top.server_id), instance_ids):
            remove_entry(entry)

    def remove_worker_process(self, instance_id: int, pid: int) -> None:
        """Unlink the arenas of one dead worker process.

        NOTE: frontends that still read a block keep their mapping, so removing the names is
        safe and frees the memory later.
        """
        top = self.topology
        for entry in top.of_worker_process(list_objects(top.server_id), instance_id, pid):
            remove_entry(entry)

    def remove_frontend_process(self, frontend: int, pid: int) -> None:
        """Unlink the input arenas of one dead frontend process (workers that still map
        them unmap them on ``DropSegments``)."""
        top = self.topology
        for entry in top.of_frontend_process(list_objects(top.server_id), frontend, pid):
            remove_entry(entry)

    def remove_all(self) -> None:
        """Unlink every object of this server (the last step of a shutdown)."""
        for entry in list_objects(self.topology.server_id):
            remove_entry(entry)
