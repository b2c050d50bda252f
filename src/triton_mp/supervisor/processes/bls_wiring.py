"""BLS wiring plans: which rings between instances and BLS clients a change adds or removes.

Imported by ``supervisor.processes.instances`` (which creates the rings through
``supervisor.processes.wiring``
and tells the running workers); pure, with unit tests (tests/unit/test_bls_wiring.py).
A BLS client is a python instance calling models (``workers.bls.bls_client``); every instance
(python or not) answers each client on its own ring ``worker_to_bls(instance, client)``, and
each client's inbox holds one ring from the scheduler and one from every instance. So when
instances start, each new one gets a ring to every client, running or new, and every
running instance one to each new client; when instances stop, their rings leave every
remaining client's inbox and the remaining instances close their rings to stopped clients.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from triton_mp.ipc.protocol.specs import BlsModel, ModelVersionSpec


@dataclass(frozen=True)
class BlsAddPlan:
    """The BLS side of starting instances (``plan_bls_add``); ids are instance ids."""

    rings: tuple[tuple[int, int], ...]
    """Every new ``(producer, client)`` ring, in creation order."""
    answers_of_new: dict[int, tuple[int, ...]]
    """New instance -> the clients it answers (running ones first)."""
    inbox_of_new_client: dict[int, tuple[int, ...]]
    """New client -> the producers of its inbox's rings (running ones first)."""
    worker_gains: dict[int, tuple[int, ...]]
    """Running instance -> the new clients it gets a ring to."""
    inbox_gains: dict[int, tuple[int, ...]]
    """Running client -> the new instances whose rings its inbox gains."""


def plan_bls_add(
    running: Sequence[int],
    running_clients: Sequence[int],
    new: Sequence[int],
    new_clients: Sequence[int],
) -> BlsAddPlan:
    """Plan the rings for instances ``new`` (of which ``new_clients`` are python) joining
    ``running`` (of which ``running_clients`` are python)."""
    clients = (*running_clients, *new_clients)
    rings = [(w, c) for w in new for c in clients] + [(i, c) for i in running for c in new_clients]
    producers = (*running, *new)
    return BlsAddPlan(
        rings=tuple(rings),
        answers_of_new={w: clients for w in new},
        inbox_of_new_client={c: producers for c in new_clients},
        worker_gains={i: tuple(new_clients) for i in running if new_clients},
        inbox_gains={c: tuple(new) for c in running_clients if new},
    )


@dataclass(frozen=True)
class BlsRemovePlan:
    """The BLS side of removing stopped instances (``plan_bls_remove``)."""

    worker_losses: dict[int, tuple[int, ...]]
    """Remaining instance -> the stopped clients it closes its rings to (ascending)."""
    inbox_losses: dict[int, tuple[int, ...]]
    """Remaining client -> the stopped instances whose rings leave its inbox."""


def plan_bls_remove(
    remaining: Sequence[int],
    remaining_clients: Sequence[int],
    gone: Sequence[int],
    gone_clients: Iterable[int],
) -> BlsRemovePlan:
    """Plan the unwiring of stopped instances ``gone`` (of which ``gone_clients`` were
    python) from ``remaining`` (of which ``remaining_clients`` are python)."""
    lost_clients = tuple(sorted(gone_clients))
    return BlsRemovePlan(
        worker_losses={i: lost_clients for i in remaining if lost_clients},
        inbox_losses={c: tuple(gone) for c in remaining_clients if gone},
    )


def bls_table(
    versions: Iterable[ModelVersionSpec],
    unavailable: Mapping[str, Iterable[int]] | None = None,
) -> dict[str, BlsModel]:
    """The models a BLS client may call, from the versions served now.

    Each model lists its versions in ascending order; batching, outputs, decoupled and the
    instance count are its newest version's (a request without a version goes there, as
    Triton's default version policy picks the newest). ``unavailable``: per model, the
    versions it has but does not serve (failed, retired, unloaded); a model with only such
    versions is listed with none served.
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
    for name, gone in (unavailable or {}).items():
        model = models.get(name) or BlsModel(versions=(), max_batch_size=0, outputs=())
        rest = tuple(sorted(set(gone) - set(model.versions)))
        if rest:
            models[name] = msgspec.structs.replace(model, unavailable=rest)
    return models
