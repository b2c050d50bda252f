"""The scheduler's records of model instances and of the generations they serve.

Imported by the scheduler core, its lifecycle and its status views; plain records, no I/O.
One ``Instance`` per worker process the supervisor added, with its lifecycle
(``InstanceState``, moved by ``scheduler.lifecycle``) and its process health (``Health``),
the batch it runs and the decoupled requests still open on it. One ``Generation`` per
activation of a model version: the spec it was activated with and the batching policy that
feeds its instances. A reload activates a new generation of the same version; the old one
retires (finishes its queue on its own instances) beside it.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from triton_mp.ipc.protocol.messages import ReplyTo, TensorRef, WarmupRun
from triton_mp.ipc.protocol.specs import ModelVersionSpec
from triton_mp.ipc.recordio.records import Request
from triton_mp.scheduler.policies.policy import Policy, Queued
from triton_mp.scheduler.policies.queues import PriorityQueue

VersionKey = tuple[str, int]
"""(model name, version)."""


class InstanceState(Enum):
    """Where an instance is in its lifecycle (``scheduler.lifecycle``): staged -> active ->
    retiring (or leaving) -> stopping -> removed (removed instances leave the table)."""

    STAGED = "staged"
    """Added (``InstancesAdded``), its version not active yet: it takes no work."""
    ACTIVE = "active"
    """Its generation serves its version (``VersionsActivated``)."""
    RETIRING = "retiring"
    """Its generation takes no new requests (``InstancesRetired``, or replaced by a reload):
    it finishes what is queued and running."""
    LEAVING = "leaving"
    """A regroup removed it from its version's instance group (``InstancesRegrouped``): it
    takes no new request or sequence; its live sequences run to their end."""
    STOPPING = "stopping"
    """Its retirement ended: told to shut down, gone until ``InstancesRemoved``."""


class Health(Enum):
    """The worker process as the scheduler last heard of it."""

    STARTING = "starting"
    """Not reported ready yet (or died before its version was active: it starts again)."""
    READY = "ready"
    """``WorkerReady``, and not died since."""
    DEAD = "dead"
    """``WorkerDied`` after it served; reporting ready again counts a restart."""


class InFlight(NamedTuple):
    """A batch an instance runs (``Instance.batch``) or holds staged behind it
    (``Instance.behind``, ``scheduler.staging``)."""

    batch_id: int
    requests: tuple[Request, ...]
    dispatch_ns: int
    total_batch_size: int
    staged: bool = False
    """Sent behind a running batch: its queue time ends when its worker starts it
    (``BatchDone.start_ns``), not at ``dispatch_ns``."""


@dataclass(slots=True, eq=False)
class PlainQueue:
    """Where a plain generation's request records go (``scheduler.plain_requests``).

    Attributes:
        waiting: the queue's one FIFO (``PriorityQueue``'s level 0 ``waiting``), ``Queued``
            items in arrival order.
        queue: the ``PriorityQueue`` it belongs to (``PriorityQueue.pushed`` counts what
            ``queue_records`` appended).
    """

    waiting: collections.deque[Queued]
    queue: PriorityQueue


@dataclass(slots=True, eq=False)
class Generation:
    """One activation of a model version (see the module docstring)."""

    spec: ModelVersionSpec
    policy: Policy
    enforced_inputs: tuple[str, ...] = ()
    """``spec.enforced_inputs``: requests batch together only when these shapes agree."""
    optional_inputs: bool = False
    """``spec.has_optional_inputs``: requests batch together only with the same inputs."""
    retiring: bool = False
    pins: int = 0
    """Running ensemble requests that call this generation's version in a step (core
    ``EnsembleContext``'s ``handles_``, taken when the request starts): a retiring
    generation stays until none does, so an unloaded step still serves them."""
    armed: bool = False
    """Set after the first dispatch pass that saw the retirement; a request a frontend sent
    before it dropped the version is drained by the next pass, so only then may it end."""
    quiet_done: bool | None = None
    """Whether its instances' ``BatchDone`` may ever be quiet (``scheduler.done_wakeups``;
    None until first asked)."""
    quiet_requests: bool | None = None
    """Whether its requests may ever reach the scheduler without a wake-up
    (``scheduler.request_wakeups``; None until first asked)."""
    request_bit: int = 0
    """Its model's bit in a frontend ring's quiet word (``ipc.recordio.quiet_requests``;
    0 until first asked)."""
    plain: PlainQueue | None = None
    """Where its request records go in one call per drain (``scheduler.plain_requests``,
    set by ``scheduler.lifecycle`` as it starts the generation); None: through
    ``SchedulerCore._on_request``."""

    def batch_key(self, inputs: Sequence[TensorRef]) -> Hashable:
        """What must be equal for two requests to share a batch (core
        ``RequiredEqualInputs::HasEqualInputs``): the shapes, without the batch dimension,
        of the enforced inputs (by name), and for a model with optional inputs the set of
        inputs given. ``()`` for most models: anything batches with anything."""
        enforced, optional = self.enforced_inputs, self.optional_inputs
        if not enforced and not optional:
            return ()
        if len(inputs) == 1 and not optional:
            t = inputs[0]
            return (t.shape[1:],) if t.name in enforced else ()
        shapes = {t.name: t.shape[1:] for t in inputs}
        key = tuple(shapes.get(n) for n in enforced)
        return (frozenset(shapes), key) if optional else key

    @property
    def key(self) -> VersionKey:
        """(model, version) it serves."""
        return (self.spec.model, self.spec.version)


@dataclass(slots=True, eq=False)
class Instance:
    """One model instance (one worker process) as the scheduler sees it."""

    instance_id: int
    """Unique over the server's life."""
    name: str
    """Triton's instance name (``<group>_<index>``); empty when not known."""
    key: VersionKey
    state: InstanceState = InstanceState.STAGED
    health: Health = Health.STARTING
    generation: Generation | None = None
    """The generation whose policy hands it batches (None while staged)."""
    batch: InFlight | None = None
    behind: InFlight | None = None
    """A batch sent behind ``batch``, which its worker starts when ``batch`` ends
    (``scheduler.staging``)."""
    open: dict[tuple[ReplyTo, int], Request] = field(default_factory=dict)
    """Requests of a decoupled model dispatched here whose final response the worker has
    not reported yet (``DecoupledDone``), by (reply address, request id)."""
    executions: int = 0
    """Batches it finished (``BatchDone``)."""
    staged: bool = False
    """Its ``batch`` waits for the rate limiter's resources (not sent yet)."""
    restarts: int = 0
    """Times it came back after it died."""
    leased: bool = False
    """A frontend took its lease and its ``DirectSent`` is not read yet: a direct batch is
    on its way to it (``scheduler.direct``)."""
    ready_check: bool = False
    """Its model checks its own readiness (``WorkerReady.ready_check``: python ``is_ready()``)."""
    warmup: tuple[WarmupRun, ...] = ()
    """The warmup executions it reported while staged, counted when its version activates."""

    @property
    def label(self) -> str:
        """Its name, or its id when the name is not known (logs, ``triton-mp stat``)."""
        return self.name or str(self.instance_id)

    @property
    def live(self) -> bool:
        """Ready and serving (or finishing) its version's requests."""
        # NOTE: identity tests, not ``in`` a set: an Enum's __hash__ is Python code, and
        # this runs per instance on every pass of the loop (request_wakeups).
        state = self.state
        return self.health is _READY and (
            state is _ACTIVE or state is _RETIRING or state is _LEAVING
        )

    @property
    def busy(self) -> bool:
        """Running a batch (or about to run a frontend's), or holding open decoupled
        requests."""
        return self.batch is not None or bool(self.open) or self.leased


_READY = Health.READY
_ACTIVE = InstanceState.ACTIVE
_RETIRING = InstanceState.RETIRING
_LEAVING = InstanceState.LEAVING


class InstanceTable:
    """Every instance the scheduler knows, by instance id."""

    def __init__(self) -> None:
        self._by_id: dict[int, Instance] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Instance]:
        return iter(self._by_id.values())

    def get(self, instance_id: int) -> Instance | None:
        """The instance, or None when it is not (or no longer) known."""
        return self._by_id.get(instance_id)

    def add(self, instance: Instance) -> None:
        """Know ``instance`` (replacing any record of the same id)."""
        self._by_id[instance.instance_id] = instance

    def pop(self, instance_id: int) -> Instance | None:
        """Forget an instance; None when it was not known."""
        return self._by_id.pop(instance_id, None)

    def members(self, generation: Generation) -> list[Instance]:
        """The known instances that ``generation`` feeds, in its spec's order."""
        out = []
        for i in generation.spec.instance_ids:
            inst = self._by_id.get(i)
            if inst is not None and inst.generation is generation:
                out.append(inst)
        return out

    def any_live(self, key: VersionKey) -> bool:
        """Whether any instance serves ``key`` live now (``ModelAvailability``)."""
        return any(inst.live and inst.key == key for inst in self._by_id.values())


def running_instance(instances: Iterable[Instance], key: tuple[ReplyTo, int]) -> int | None:
    """The instance running the request ``key`` (reply address, request id): in the batch
    it executes (or holds for the rate limiter, or staged behind it), or open on it
    (decoupled). None when no instance has it (not dispatched yet, or answered)."""
    for inst in instances:
        if key in inst.open:
            return inst.instance_id
        for batch in (inst.batch, inst.behind):
            if batch is not None and any(
                r.request_id == key[1] and r.reply_to == key[0] for r in batch.requests
            ):
                return inst.instance_id
    return None


def readiness_checked(members: Iterable[Instance]) -> tuple[int, ...]:
    """The instances a model readiness check asks (Triton's ``TritonModel::IsReady`` asks
    every instance): the live ones whose model has a check of its own."""
    return tuple(i.instance_id for i in members if i.live and i.ready_check)
