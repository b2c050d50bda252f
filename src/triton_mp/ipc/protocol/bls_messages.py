"""What wires python models' BLS calls: the supervisor's updates to a worker and to a BLS
client, and the tables they carry.

Imported by ``ipc.protocol.messages``, which re-exports every name and puts ``BlsWorkerUpdate`` in
the ``ToWorker`` union and ``BlsInboxUpdate`` in ``ToBlsClient``.
"""

from __future__ import annotations

import msgspec

from triton_mp.ipc.memory.notify import Wakeup


class BlsModel(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """What a BLS caller needs to know of a model it may call (its served versions)."""

    versions: tuple[int, ...]
    max_batch_size: int
    outputs: tuple[str, ...]
    decoupled: bool = False
    instance_count: int = 1
    unavailable: tuple[int, ...] = ()
    """Versions the model has but does not serve (failed to load, retired by a change, or
    unloaded): a call naming one is UNAVAILABLE "... is not at ready state", as in Triton.
    A model with no served version has ``versions == ()``."""


class BlsClientWiring(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A producer's ring into a python worker's BLS inbox (the scheduler's or a worker's):
    where answers to ``ReplyTo(Requester.BLS, instance_id)`` go."""

    instance_id: int
    """The python worker whose BLS client reads the ring."""
    ring: str
    wakeup: Wakeup


class BlsWorkerUpdate(msgspec.Struct, frozen=True, kw_only=True, tag="bls_worker", array_like=True):
    """Supervisor -> the worker ``instance_id`` (the supervisor's control ring into its inbox;
    the worker applies it before the batches of the same drain): the BLS clients it answers
    and, for a python worker, the models its own BLS client may call. Applying it twice
    changes nothing."""

    instance_id: int
    add_clients: tuple[BlsClientWiring, ...] = ()
    """Its rings to new BLS clients (answers to their requests), woken by their wake-ups."""
    remove_clients: tuple[int, ...] = ()
    """Instance ids of python workers that stopped (their BLS clients are gone)."""
    seq: int = 0
    """Orders model tables: a table older than the one held is ignored."""
    models: dict[str, BlsModel] | None = None
    """The whole table of models that serve now (replaces the held one), or None."""


class BlsInboxUpdate(msgspec.Struct, frozen=True, kw_only=True, tag="bls_inbox", array_like=True):
    """Supervisor -> one BLS client (the supervisor's control ring into the client's inbox,
    drained by the thread that reads the answers): rings from instances started or stopped
    since it started. Sent before any request can be answered on an added ring; a removed
    ring's producer has stopped. Applying it twice changes nothing."""

    add_rings: tuple[str, ...] = ()
    remove_rings: tuple[str, ...] = ()
