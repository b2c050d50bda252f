"""Which requests may reach the scheduler without waking it while their batch forms.

Imported by ``scheduler.core``; pure. While a dynamic batcher's batch waits for its delay
(an instance idle, ``Policy.due_batch``), a request that arrives cannot end the wait unless
its rows bring the queue to a preferred size, ``max_batch_size`` or past the largest
preferred size (``policies.dynamic.room_before_cut``), its shape differs, its priority puts
it ahead, its queue policy can time it out or refuse it, or its arrival stamp is older than
the batch's oldest (the delay runs from the oldest). When none of these can happen, reading
the request when the delay runs out, in the drain of the pass that sends the batch, forms
the same batch at the same time as reading it at once: one scheduler wake-up per batch
instead of one per frontend push (``bench/README.md``, #34).

Only with one frontend (``--frontend-processes 1``, the default): a drain reads its rings one
after another, so requests of two frontends read in one drain queue ring by ring, not by
arrival; were those that waited unread for the delay read so, a batch cut at a preferred size
could take another frontend's later request in place of an earlier one.

The scheduler publishes, per frontend ring (``ipc.memory.ring``, offsets 144-167): the
model buckets of such batches (``ipc.recordio.quiet_requests``), an allowance of rows and an
epoch, and the floor (the latest of the batches' oldest arrival stamps). A frontend
(``frontend.dispatch.wakes.HeldWakes``) pushes a request of such a bucket, stamped at or after
the floor, without a wake-up while the rows it pushed so in this epoch stay within the
allowance; any other push wakes as before. The allowance is the smallest room of the
forming batches, so the rows pushed quietly never reach a cut. The epoch changes with every
new allowance (the frontend counts from 0 again; the first epoch a frontend sees counts as
spent); the scheduler then fences and rechecks its rings before it sleeps, so a record
counted under the old epoch but pushed after the drain the new allowance came from is read
before the scheduler relies on it (Dekker's protocol, ``ipc.memory.notify``).

Never forming-quiet: what ``request_wakeups.quiet_for_requests`` rules out (queue policies
with timeouts or sizes, sequences, ensembles, decoupled, iterative or leased models),
a model whose batches compare shapes or inputs (``Generation.enforced_inputs``,
``optional_inputs``), a model with priority levels, a retiring version, a bucket shared with
a model that is not forming; and, server-wide, what ``SchedulerCore.quiet_requests`` rules
out (stopping, deferred requests, a rate limiter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from triton_mp.ipc.recordio.quiet_requests import model_bit
from triton_mp.scheduler.instances import Generation
from triton_mp.scheduler.request_wakeups import quiet_for_requests


class Forming(NamedTuple):
    """What one frontend ring's forming words say (``ipc.memory.ring``, offset 144).

    Attributes:
        mask: the model buckets whose requests may join a forming batch unread (u64).
        rows: the rows the ring may push so (all its requests together) per epoch.
        floor_ns: the earliest arrival stamp (CLOCK_MONOTONIC ns) such a request may carry.
    """

    mask: int = 0
    rows: int = 0
    floor_ns: int = 0


NOT_FORMING = Forming()
"""No request joins a forming batch unread (a tuple: built and compared on every pass)."""


def forming_state(
    generations: Iterable[Generation], leased: Callable[[Generation], bool], rings: int
) -> Forming:
    """The forming words for each of ``rings`` frontend rings (module docstring).

    Args:
        generations: every generation with a queue (active and retiring).
        leased: whether the direct handoff offers a generation's idle instances.
        rings: how many frontends push requests (one ring each): none forms unless 1.
    """
    if rings != 1:
        return NOT_FORMING
    mask = blocked = 0
    room: int | None = None
    floor = 0
    for gen in generations:
        bit = gen.request_bit
        if not bit:
            bit = gen.request_bit = model_bit(gen.spec.model)
        forming = gen.policy.forming_room() if forming_allowed(gen, leased) else None
        if forming is None:
            blocked |= bit
            continue
        rows, oldest_ns = forming
        mask |= bit
        room = rows if room is None else min(room, rows)
        floor = max(floor, oldest_ns)
    mask &= ~blocked
    if not mask or not room:
        return NOT_FORMING
    # NOTE: tuple.__new__: a NamedTuple's own constructor costs ~0.3 µs more, every pass.
    return tuple.__new__(Forming, (mask, room, floor))


def forming_allowed(gen: Generation, leased: Callable[[Generation], bool]) -> bool:
    """Whether ``gen``'s requests may ever join a forming batch unread (by its spec and
    state; ``forming_room`` says whether a batch forms now)."""
    if gen.retiring or gen.enforced_inputs or gen.optional_inputs:
        return False
    plain = gen.quiet_requests
    if plain is None:
        plain = gen.quiet_requests = quiet_for_requests(gen, leased)
    return plain
