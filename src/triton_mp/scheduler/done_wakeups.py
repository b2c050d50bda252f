"""Which running instances' ``BatchDone`` may reach the scheduler without waking it.

Imported by ``scheduler.core``; pure. A ``BatchDone`` makes its instance idle, ends its batch
in the statistics and, for some models, moves other work on. When no request waits for the
instance's version, nothing the scheduler decides depends on when it reads that message: it
is read on the scheduler's next pass, which the next request (or query) starts. The process
shell turns the answer into each worker ring's quiet flag (``ipc.memory.ring.Ring.set_quiet``), and
a worker pushes its ``BatchDone`` with ``channel.Sender.send_lazy``: one sleep and one wake-up
of the scheduler fewer per such batch (a third of its wake-ups at c=1).

A version whose idle instances are leased to the frontends (the direct handoff) may be
quiet too: its worker then posts the lease itself, and wakes the scheduler when it does not
(``ipc.direct.worker_reoffers``; the core passes ``leased`` as never).

Never quiet, so the message is read at once as before: while anything is queued for the
version, unless a batch of it waits for its batching delay with another instance idle and
more rows cannot complete it (``Policy.forming_room``: the batch goes to that instance when
the delay runs out, and the pass that sends it reads this message first, ``done_first``;
reading it sooner would only queue one more idle instance behind it); a sequence, iterative,
decoupled or ensemble model; a
retiring version; a version whose requests may reach the scheduler without a wake-up
(``scheduler.request_wakeups``: its ``BatchDone`` is what reads them); and, server-wide,
while the scheduler stops, holds deferred requests, runs ensemble requests (their steps'
compute times come with ``BatchDone``) or rate-limits (``BatchDone`` frees resources other
batches wait for).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from triton_mp.scheduler.instances import Generation, Instance


def plain_for_quiet(gen: Generation, leased: Callable[[Generation], bool]) -> bool:
    """Whether a ``BatchDone`` of ``gen``'s instances may ever be quiet (by its spec):
    ``leased``: the direct handoff offers its idle instances (``Handoffs.eligible``)."""
    spec = gen.spec
    return (
        spec.sequence is None
        and spec.ensemble is None
        and not spec.decoupled
        and gen.policy.iterative_steps is None
        and not leased(gen)
    )


def quiet_instances(
    instances: Iterable[Instance], leased: Callable[[Generation], bool], loud_bits: int = 0
) -> frozenset[int]:
    """The instances whose ``BatchDone`` need not wake the scheduler now (module
    docstring; the server-wide conditions are the caller's). ``loud_bits``: the model
    buckets whose requests may wait unread (``scheduler.request_wakeups``): their
    instances' ``BatchDone`` is what reads them, so it always wakes."""
    out = []
    for inst in instances:
        gen = inst.generation
        if gen is None or gen.retiring or inst.behind is not None:
            # NOTE: a staged batch (scheduler.staging): its worker must not re-offer the
            # lease, and its BatchDone may let the scheduler stage the next.
            continue
        if gen.policy.queue_depth() and gen.policy.forming_room() is None:
            continue
        if gen.request_bit & loud_bits:
            continue
        plain = gen.quiet_done
        if plain is None:
            plain = gen.quiet_done = plain_for_quiet(gen, leased)
        if plain:
            out.append(inst.instance_id)
    return frozenset(out)
