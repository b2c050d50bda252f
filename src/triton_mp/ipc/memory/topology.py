"""The names of every shared-memory object of a server: one table, built and parsed alike.

Imported by the supervisor (``supervisor.processes.wiring`` creates and unlinks what is named here),
by ``ipc.memory.shm`` (the leak sweep), ``ipc.tensor_pool`` (arena names) and the roles that create
their own arenas. Every object is ``/triton_mp_<server_id>_<purpose>`` (STYLE.md rule 6), with
``server_id`` the supervisor's pid; ``<purpose>`` is one row of ``LAYOUT``:

====================  =============================  ==========================================
kind                  purpose                        what it is
====================  =============================  ==========================================
frontend_inbox_ring   ``r_f{frontend}_s``            ring frontend -> scheduler
supervisor_ring       ``r_sup_s``                    ring supervisor -> scheduler
scheduler_wakeup      ``s_sem``                      the scheduler's inbox semaphore
frontend_wakeup       ``f{frontend}_fifo``           a frontend's inbox FIFO (asyncio loop)
scheduler_to_frontend ``r_s_f{frontend}``            ring scheduler -> frontend
frontend_to_frontend  ``r_f{frontend}_f{peer}``      ring frontend -> another frontend (shm)
frontend_arena        ``f{frontend}p{pid}_a{arena}`` a frontend process's input tensor arena
heartbeat             ``heartbeat``                  the heartbeat board (``ipc.memory.heartbeat``)
response_cache        ``cache``                      the local response cache
                                                     (``ipc.memory.response_cache``)
worker_wakeup         ``w{instance}_sem``            a worker's inbox semaphore
scheduler_to_worker   ``r_s_w{instance}``            ring scheduler -> worker
worker_to_scheduler   ``r_w{instance}_s``            ring worker -> scheduler
worker_to_frontend    ``r_w{instance}_f{frontend}``  ring worker -> frontend (answers)
supervisor_to_worker  ``r_sup_w{instance}``          ring supervisor -> worker (BLS updates)
frontend_to_worker    ``r_f{frontend}_w{instance}``  ring frontend -> worker (``ipc.direct``)
worker_lease          ``w{instance}_lease``          an instance's lease semaphore
                                                     (``ipc.direct``)
worker_arena          ``w{instance}p{pid}_a{arena}`` a worker process's output arena
metric_board          ``w{instance}p{pid}_cm{gen}``  a python worker's custom metrics
                                                     (``ipc.memory.metric_board``)
frontend_metric_board ``f{frontend}p{pid}_cm{gen}``  a frontend process's latency histograms
                                                     (``frontend.metrics.latency``)
bls_wakeup            ``w{client}_bls``              a BLS client's inbox semaphore
scheduler_to_bls      ``r_s_c{client}``              ring scheduler -> BLS client
supervisor_to_bls     ``r_sup_c{client}``            ring supervisor -> BLS client (rewiring)
worker_to_bls         ``r_w{instance}_c{client}``    ring worker -> BLS client (answers)
pid_namespace         ``pidns{namespace}``           empty; the supervisor's pid namespace
                                                     (``ipc.memory.shm.claim_server_id``)
====================  =============================  ==========================================

``{frontend}`` and ``{peer}`` are frontend ids, ``{instance}`` and ``{client}`` instance ids
(a BLS client is the python worker of that instance), ``{pid}`` the frontend or worker
process that allocated the arena (a restarted frontend or worker gets new arenas),
``{arena}`` the arena's index in its owner's ``ArenaAllocator``, ``{gen}`` (field
``generation``) counts a metric board's replacements and ``{namespace}`` is the inode of
``/proc/<pid>/ns/pid`` (a server id is a pid only within that namespace). A semaphore's
``/dev/shm`` entry is ``sem.<name without slash>``. Names outside the table
(``Topology.scratch``) are for tests and tools.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

PREFIX = "triton_mp_"
"""Prefix of every shared-memory object and semaphore name triton-mp creates."""

_SEMAPHORE_ENTRY = "sem."
_SERVER_RE = re.compile(rf"^(?:{re.escape(_SEMAPHORE_ENTRY)})?{PREFIX}(\d+)_(.*)$")
_ARENA = "_a{arena}"
"""How an owner's arena ``i`` extends the owner's prefix (``ArenaAllocator``)."""
_PROCESS_MARK = "p"
_PROCESS = _PROCESS_MARK + "{pid}"
"""How a worker process extends its instance's arena prefix."""
_FRONTEND_ARENAS = "f{frontend}"
_WORKER_ARENAS = "w{instance}"
_BOARD = "_cm{generation}"
"""How a worker process's metric board extends the process's arena prefix."""


class Kind(enum.Enum):
    """Each kind of object a server names (the module docstring's table)."""

    FRONTEND_INBOX_RING = "r_f{frontend}_s"
    SUPERVISOR_RING = "r_sup_s"
    SCHEDULER_WAKEUP = "s_sem"
    FRONTEND_WAKEUP = "f{frontend}_fifo"
    SCHEDULER_TO_FRONTEND = "r_s_f{frontend}"
    FRONTEND_TO_FRONTEND = "r_f{frontend}_f{peer}"
    FRONTEND_ARENA = _FRONTEND_ARENAS + _PROCESS + _ARENA
    HEARTBEAT = "heartbeat"
    RESPONSE_CACHE = "cache"
    WORKER_WAKEUP = "w{instance}_sem"
    SCHEDULER_TO_WORKER = "r_s_w{instance}"
    WORKER_TO_SCHEDULER = "r_w{instance}_s"
    WORKER_TO_FRONTEND = "r_w{instance}_f{frontend}"
    SUPERVISOR_TO_WORKER = "r_sup_w{instance}"
    FRONTEND_TO_WORKER = "r_f{frontend}_w{instance}"
    WORKER_LEASE = "w{instance}_lease"
    WORKER_ARENA = _WORKER_ARENAS + _PROCESS + _ARENA
    METRIC_BOARD = _WORKER_ARENAS + _PROCESS + _BOARD
    FRONTEND_METRIC_BOARD = _FRONTEND_ARENAS + _PROCESS + _BOARD
    BLS_WAKEUP = "w{client}_bls"
    SCHEDULER_TO_BLS = "r_s_c{client}"
    SUPERVISOR_TO_BLS = "r_sup_c{client}"
    WORKER_TO_BLS = "r_w{instance}_c{client}"
    PID_NAMESPACE = "pidns{namespace}"


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", template)
    regex = "".join(re.escape(p) if i % 2 == 0 else rf"(?P<{p}>\d+)" for i, p in enumerate(parts))
    return re.compile(f"^{regex}$")


_PATTERNS = {kind: _pattern(kind.value) for kind in Kind}


@dataclass(frozen=True)
class ObjectId:
    """What one ``/dev/shm`` entry of a server is.

    Attributes:
        kind: its row of the table.
        fields: the numbers in its name (``frontend``, ``instance``, ``client``, ``pid``,
            ``arena``; only those of its kind).
    """

    kind: Kind
    fields: dict[str, int]

    @property
    def instances(self) -> frozenset[int]:
        """The instances it belongs to: freed when any of them is removed."""
        return frozenset(v for k, v in self.fields.items() if k in ("instance", "client"))


def server_of(entry: str) -> str | None:
    """The server id in a ``/dev/shm`` entry name (``sem.`` prefix allowed), or None when
    the entry is not triton-mp's."""
    m = _SERVER_RE.match(entry)
    return m.group(1) if m else None


def arena_name(owner_prefix: str, index: int) -> str:
    """The name of an owner's arena ``index`` (``owner_prefix`` from ``Topology``)."""
    return owner_prefix + _ARENA.format(arena=index)


def metric_board_name(process_prefix: str, generation: int) -> str:
    """The name of generation ``generation`` of a worker process's metric board
    (``process_prefix`` from ``process_arena_prefix``)."""
    return process_prefix + _BOARD.format(generation=generation)


def process_arena_prefix(owner_prefix: str, pid: int) -> str:
    """A frontend or worker process's arena prefix, from its frontend's or instance's
    (``Topology.frontend_arenas``, ``Topology.worker_arenas``)."""
    return owner_prefix + _PROCESS.format(pid=pid)


class Topology:
    """Every object name of one server.

    Args:
        server_id: the supervisor's pid, as a string.
    """

    def __init__(self, server_id: str) -> None:
        self.server_id = server_id
        self.entry_prefix = f"{PREFIX}{server_id}_"
        """What every ``/dev/shm`` entry of this server starts with (after ``sem.``)."""

    def name(self, kind: Kind, **fields: int) -> str:
        """The POSIX name (leading slash) of one object; ``fields`` fill the kind's row."""
        return f"/{self.entry_prefix}{kind.value.format(**fields)}"

    def scratch(self, purpose: str) -> str:
        """A name in this server's namespace outside the table (tests, tools)."""
        return f"/{self.entry_prefix}{purpose}"

    def parse(self, entry: str) -> ObjectId | None:
        """What a ``/dev/shm`` entry (or POSIX name) of this server is; None when it is
        another server's, or not in the table."""
        bare = entry.lstrip("/").removeprefix(_SEMAPHORE_ENTRY)
        if not bare.startswith(self.entry_prefix):
            return None
        purpose = bare[len(self.entry_prefix) :]
        for kind, pattern in _PATTERNS.items():
            m = pattern.match(purpose)
            if m is not None:
                return ObjectId(kind, {k: int(v) for k, v in m.groupdict().items()})
        return None

    # ------------------------------------------------------------ server-wide
    def frontend_inbox_ring(self, frontend: int) -> str:
        """Ring frontend -> scheduler."""
        return self.name(Kind.FRONTEND_INBOX_RING, frontend=frontend)

    def supervisor_ring(self) -> str:
        """Ring supervisor -> scheduler."""
        return self.name(Kind.SUPERVISOR_RING)

    def scheduler_wakeup(self) -> str:
        """The scheduler's inbox semaphore."""
        return self.name(Kind.SCHEDULER_WAKEUP)

    def frontend_wakeup(self, frontend: int) -> str:
        """A frontend's inbox FIFO."""
        return self.name(Kind.FRONTEND_WAKEUP, frontend=frontend)

    def scheduler_to_frontend(self, frontend: int) -> str:
        """Ring scheduler -> frontend."""
        return self.name(Kind.SCHEDULER_TO_FRONTEND, frontend=frontend)

    def frontend_to_frontend(self, frontend: int, peer: int) -> str:
        """Ring frontend -> another frontend (client shared-memory registrations)."""
        return self.name(Kind.FRONTEND_TO_FRONTEND, frontend=frontend, peer=peer)

    def frontend_arenas(self, frontend: int) -> str:
        """A frontend's arena prefix: each process of it extends it with
        ``process_arena_prefix`` (a restarted frontend's arenas are new objects, never
        ones that workers still map under the old name), then ``arena_name`` the index."""
        return f"/{self.entry_prefix}{_FRONTEND_ARENAS.format(frontend=frontend)}"

    def frontend_process_segments(self, frontend: int, pid: int) -> str:
        """What the names of every arena of one frontend process start with."""
        return process_arena_prefix(self.frontend_arenas(frontend), pid) + "_"

    def heartbeat(self) -> str:
        """The heartbeat board."""
        return self.name(Kind.HEARTBEAT)

    def response_cache(self) -> str:
        """The local response cache every frontend shares."""
        return self.name(Kind.RESPONSE_CACHE)

    # ----------------------------------------------------------- per instance
    def worker_wakeup(self, instance: int) -> str:
        """A worker's inbox semaphore."""
        return self.name(Kind.WORKER_WAKEUP, instance=instance)

    def scheduler_to_worker(self, instance: int) -> str:
        """Ring scheduler -> worker."""
        return self.name(Kind.SCHEDULER_TO_WORKER, instance=instance)

    def worker_to_scheduler(self, instance: int) -> str:
        """Ring worker -> scheduler."""
        return self.name(Kind.WORKER_TO_SCHEDULER, instance=instance)

    def worker_to_frontend(self, instance: int, frontend: int) -> str:
        """Ring worker -> frontend."""
        return self.name(Kind.WORKER_TO_FRONTEND, instance=instance, frontend=frontend)

    def supervisor_to_worker(self, instance: int) -> str:
        """Ring supervisor -> worker (``BlsWorkerUpdate``)."""
        return self.name(Kind.SUPERVISOR_TO_WORKER, instance=instance)

    def frontend_to_worker(self, instance: int, frontend: int) -> str:
        """Ring frontend -> worker (direct handoffs, ``ipc.direct``)."""
        return self.name(Kind.FRONTEND_TO_WORKER, instance=instance, frontend=frontend)

    def worker_lease(self, instance: int) -> str:
        """An instance's lease semaphore (``ipc.direct``)."""
        return self.name(Kind.WORKER_LEASE, instance=instance)

    def worker_arenas(self, instance: int) -> str:
        """An instance's arena prefix: every process of it extends it with
        ``process_arena_prefix``; it is also the prefix of all its arenas' names."""
        return f"/{self.entry_prefix}{_WORKER_ARENAS.format(instance=instance)}"

    def worker_segments(self, instance: int) -> str:
        """What the names of every arena of an instance's processes start with."""
        return self.worker_arenas(instance) + _PROCESS_MARK

    def worker_process_segments(self, instance: int, pid: int) -> str:
        """What the names of every arena and metric board of one worker process start with
        (``_a<i>`` and ``_cm<g>`` follow)."""
        return process_arena_prefix(self.worker_arenas(instance), pid) + "_"

    def bls_wakeup(self, client: int) -> str:
        """A BLS client's inbox semaphore."""
        return self.name(Kind.BLS_WAKEUP, client=client)

    def scheduler_to_bls(self, client: int) -> str:
        """Ring scheduler -> BLS client."""
        return self.name(Kind.SCHEDULER_TO_BLS, client=client)

    def supervisor_to_bls(self, client: int) -> str:
        """Ring supervisor -> BLS client (``BlsInboxUpdate``)."""
        return self.name(Kind.SUPERVISOR_TO_BLS, client=client)

    def worker_to_bls(self, instance: int, client: int) -> str:
        """Ring worker -> BLS client."""
        return self.name(Kind.WORKER_TO_BLS, instance=instance, client=client)

    def pid_namespace(self, namespace: int) -> str:
        """The empty marker naming the pid namespace whose pid ``server_id`` is."""
        return self.name(Kind.PID_NAMESPACE, namespace=namespace)

    # ---------------------------------------------------------------- cleanup
    def of_instances(self, entries: list[str], instances: set[int]) -> list[str]:
        """The entries (of ``ipc.memory.shm.list_objects``) that belong to any of ``instances``:
        its rings, semaphores, arenas, and the BLS rings to and from it."""
        out = []
        for entry in entries:
            obj = self.parse(entry)
            if obj is not None and obj.instances & instances:
                out.append(entry)
        return out

    def of_frontend_process(self, entries: list[str], frontend: int, pid: int) -> list[str]:
        """The arenas one frontend process created."""
        out = []
        for entry in entries:
            obj = self.parse(entry)
            if (
                obj is not None
                and obj.kind is Kind.FRONTEND_ARENA
                and (obj.fields["frontend"], obj.fields["pid"]) == (frontend, pid)
            ):
                out.append(entry)
        return out

    def of_worker_process(self, entries: list[str], instance: int, pid: int) -> list[str]:
        """The arenas and metric boards one worker process of ``instance`` created."""
        out = []
        for entry in entries:
            obj = self.parse(entry)
            if (
                obj is not None
                and obj.kind in (Kind.WORKER_ARENA, Kind.METRIC_BOARD)
                and (obj.fields["instance"], obj.fields["pid"]) == (instance, pid)
            ):
                out.append(entry)
        return out
