"""Which models' requests may reach the scheduler without waking it: every instance busy.

Imported by ``scheduler.core``; pure. A request for a model whose instances are all running a
batch cannot be dispatched before one of them ends it; its ``BatchDone`` then wakes the
scheduler, whose drain reads every ring, the request's included. Until then nothing the
scheduler decides depends on the request: its batching delay and its queue start run from
the frontend's arrival stamp (``policies.clock.queue_start_ns``), and a batch formed when an
instance frees sees it as it would have had it been read at once. So while a model is busy
its requests need no wake-up: one scheduler pass per batch, not one per frontend push (the
frontend pushes with ``frontend.dispatch.wakes.HeldWakes``, which reads the ring's mask of
model buckets, ``ipc.recordio.quiet_requests``).

The invariant that keeps a request from being stranded: a model's bucket bit is set only
while each version of each model in the bucket has an instance running a batch and none
idle, and every instance of such a model sends its ``BatchDone`` with a wake-up
(``SchedulerCore.quiet_done`` leaves them out of the quiet ``BatchDone`` s,
``scheduler.done_wakeups``). The process shell clears a bit, fences and rechecks its rings
before it sleeps (``scheduler.main``).

Never quiet, so the request is read at once as before: a model whose queue policy can time a
request out or refuse it for a full queue (``default_timeout_microseconds``,
``max_queue_size``: those decisions are due at the request's own time), a sequence,
iterative, decoupled or ensemble model or one whose idle instances are leased to the
frontends (``done_wakeups.plain_for_quiet``), a retiring version, a version with an idle live
instance or none running; and, server-wide, while the scheduler stops, holds deferred
requests or rate-limits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from triton_mp.ipc.protocol.specs import BatchingSpec
from triton_mp.ipc.recordio.quiet_requests import model_bit
from triton_mp.scheduler.done_wakeups import plain_for_quiet
from triton_mp.scheduler.instances import Generation, Instance


def queue_limits(batching: BatchingSpec) -> bool:
    """Whether a queue policy (the default or a priority level's) can time a request out
    (``default_timeout_microseconds``) or refuse it (``max_queue_size``)."""
    policies = (batching.default_queue_policy, *batching.priority_queue_policy.values())
    return any(p.default_timeout_us or p.max_queue_size for p in policies)


def quiet_for_requests(gen: Generation, leased: Callable[[Generation], bool]) -> bool:
    """Whether ``gen``'s requests may ever go without a wake-up (by its spec)."""
    return plain_for_quiet(gen, leased) and not queue_limits(gen.spec.batching)


def quiet_request_mask(
    instances: Iterable[Instance],
    generations: Iterable[Generation],
    leased: Callable[[Generation], bool],
) -> int:
    """The quiet word for the frontends' rings (64-bit mask of model buckets,
    ``ipc.recordio.quiet_requests``): the buckets all of whose known versions are busy
    (module docstring; the server-wide conditions are the caller's).

    Args:
        instances: every instance the scheduler knows.
        generations: every generation with a queue (active and retiring).
        leased: whether the direct handoff offers a generation's idle instances.
    """
    running: set[int] = set()
    idle: set[int] = set()
    for inst in instances:
        gen = inst.generation
        if gen is None:
            continue
        if inst.batch is not None:
            if not inst.staged:
                running.add(id(gen))
        elif not inst.open and not inst.leased and inst.live:
            # NOTE: ``not inst.busy`` with its batch known to be None, tested first.
            idle.add(id(gen))
    quiet = blocked = 0
    for gen in generations:
        bit = gen.request_bit
        if not bit:
            bit = gen.request_bit = model_bit(gen.spec.model)
        plain = gen.quiet_requests
        if plain is None:
            plain = gen.quiet_requests = quiet_for_requests(gen, leased)
        key = id(gen)
        if plain and not gen.retiring and key in running and key not in idle:
            quiet |= bit
        else:
            blocked |= bit
    return quiet & ~blocked
