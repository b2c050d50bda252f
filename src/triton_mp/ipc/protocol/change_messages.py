"""The supervisor's model changes, as the scheduler applies them (supervisor -> scheduler).

Part of the ``ToScheduler`` union (``ipc.protocol.messages``, which re-exports these). A
change goes: ``InstancesAdded`` (attach the new instances' rings) before the workers are
spawned, ``VersionsActivated`` once they are ready (or ``InstancesRegrouped`` for an
instance_group-only change in place), ``InstancesRetired`` for what stops serving, and
``InstancesRemoved`` once those processes are gone.
"""

from __future__ import annotations

import msgspec

from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.protocol.bls_messages import BlsClientWiring


class InstanceWiring(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The channels of one new model instance, as the scheduler attaches them."""

    instance_id: int
    """Unique over the server's life: ids of stopped instances are never reused."""
    name: str
    model: str
    version: int
    to_worker_ring: str
    """The scheduler's ring to the worker."""
    to_worker_wakeup: Wakeup
    from_worker_ring: str
    """The worker's ring to the scheduler (joins the scheduler's inbox)."""
    bls_client: BlsClientWiring | None = None
    """A python worker's BLS inbox (``config.BlsSpec``), or None."""
    lease: str = ""
    """The instance's lease semaphore (``ipc.direct``); empty: its requests are never
    handed to it directly."""


class InstancesAdded(msgspec.Struct, frozen=True, kw_only=True, tag="inst_added", array_like=True):
    """The supervisor is starting these instances: attach their rings. They take no work
    until ``VersionsActivated`` names their version (sent before the worker is spawned)."""

    instances: tuple[InstanceWiring, ...]


class VersionsActivated(
    msgspec.Struct, frozen=True, kw_only=True, tag="versions_active", array_like=True
):
    """These model versions now serve on their (ready) instances. A version that was
    already active keeps finishing its queue on its old instances, which then stop."""

    specs: tuple[bytes, ...]
    """Each a msgpack-encoded ``config.ModelVersionSpec`` (``config`` imports ``ipc``, so
    the type cannot appear here)."""


class InstancesRetired(
    msgspec.Struct, frozen=True, kw_only=True, tag="inst_retired", array_like=True
):
    """Frontends no longer route to these instances' version: finish what is queued and
    running, then send each a ``Shutdown`` (model unload, version removed); retire
    ``versions`` too, which run on no instance (an ensemble's)."""

    instance_ids: tuple[int, ...]
    versions: tuple[tuple[str, int], ...] = ()
    """(model, version) of each retired version without instances."""


class InstancesRegrouped(
    msgspec.Struct, frozen=True, kw_only=True, tag="inst_regrouped", array_like=True
):
    """A version goes on with ``spec`` (as ``VersionsActivated``'s): ``scheduler.lifecycle``."""

    spec: bytes


class InstancesRemoved(
    msgspec.Struct, frozen=True, kw_only=True, tag="inst_removed", array_like=True
):
    """These instances' processes are gone for good: detach their rings, forget them."""

    instance_ids: tuple[int, ...]
    segments: tuple[str, ...] = ()
    """What the names of their processes' arenas start with (``Topology.worker_segments``):
    the scheduler unmaps those it attached."""
