"""What the scheduler's loop learns from the core once per pass, before it waits.

Imported by ``scheduler.core`` (``SchedulerCore.pass_words``) and ``scheduler.main``. Four
answers, each its own concept's (``SchedulerCore.next_deadline_ns``, ``quiet_requests``,
``quiet_done``, ``forming``), asked together: the loop asks all four on every pass (about
2.3 passes per batch at c=16), and asked one by one each walked the generations again and
tested the server-wide conditions again (measured in the running scheduler at c=16, load
6-8: 24 µs of CPU per pass, 6.6 µs per inference; #34). ``walk_words`` answers three of them
and the policies' deadline in one walk of the instances and one of the generations, each
policy asked once (in process, add_sub_py's dynamic batcher: 3.3-4.9 -> 2.5-3.5 µs per
pass; the live pass costs ~5x its hot cost, cold caches after each sleep).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple, cast

from triton_mp.ipc.recordio.quiet_requests import model_bit
from triton_mp.scheduler.done_wakeups import plain_for_quiet
from triton_mp.scheduler.forming import NOT_FORMING, Forming
from triton_mp.scheduler.instances import Generation, Instance
from triton_mp.scheduler.request_wakeups import quiet_for_requests


class PassWords(NamedTuple):
    """The loop's view of the core before it waits.

    Attributes:
        deadline_ns: the nearest time a batch may become ready, a queue timeout expire, a
            claim run out or a retirement end without a message (monotonic ns; None: none).
        requests: the frontends' rings' quiet word (64-bit mask of model buckets,
            ``scheduler.request_wakeups``; 0: every request wakes the scheduler).
        quiet: the instances whose ``BatchDone`` need not wake the scheduler
            (``scheduler.done_wakeups``).
        forming: the forming words of the frontends' rings (``scheduler.forming``).
    """

    deadline_ns: int | None
    requests: int
    quiet: frozenset[int]
    forming: Forming


def walk_words(
    instances: Iterable[Instance],
    generations: Iterable[Generation],
    leased: Callable[[Generation], bool],
    rings: int,
    done_may_be_quiet: bool,
) -> tuple[int | None, int, frozenset[int], Forming]:
    """The policies' nearest deadline, then ``quiet_request_mask``,
    ``quiet_instances`` (of that mask, with ``leased`` as never: ``SchedulerCore.quiet_done``)
    and ``forming_state`` of the same arguments, in one walk of the instances and one of
    the generations: each policy is asked ``next_deadline_ns`` and ``forming_room`` once per
    generation, not once per question and instance (the server-wide conditions are the
    caller's; ``done_may_be_quiet`` False: no ``BatchDone`` is quiet, as while a version
    retires or an ensemble runs). The same answers as the four functions (tests/unit/
    test_pass_words.py compares them over random histories).

    Args:
        instances: every instance the scheduler knows.
        generations: every generation with a queue (active and retiring).
        leased: whether the direct handoff offers a generation's idle instances.
        rings: how many frontends push requests (``forming_state``: none forms unless 1).
        done_may_be_quiet: whether any ``BatchDone`` may be quiet now.
    """
    running: set[int] = set()
    idle: set[int] = set()
    candidates: list[Instance] = []
    for inst in instances:
        gen = inst.generation
        if gen is None:
            continue
        if inst.batch is not None:
            if not inst.staged:
                running.add(id(gen))
        elif not inst.open and not inst.leased and inst.live:
            idle.add(id(gen))
        if done_may_be_quiet and not gen.retiring and inst.behind is None:
            candidates.append(inst)
    deadline: int | None = None
    quiet = blocked = 0
    mask = not_forming = 0
    room: int | None = None
    floor = 0
    rooms: dict[int, tuple[int, int] | None] = {}
    for gen in generations:
        policy = gen.policy
        due = policy.next_deadline_ns()
        if due is not None and (deadline is None or due < deadline):
            deadline = due
        bit = gen.request_bit
        if not bit:
            bit = gen.request_bit = model_bit(gen.spec.model)
        plain = gen.quiet_requests
        if plain is None:
            plain = gen.quiet_requests = quiet_for_requests(gen, leased)
        key = id(gen)
        retiring = gen.retiring
        if plain and not retiring and key in running and key not in idle:
            quiet |= bit
        else:
            blocked |= bit
        if rings != 1:
            continue
        # NOTE: forming.forming_allowed, its cached half (``plain``) read above.
        if retiring or gen.enforced_inputs or gen.optional_inputs or not plain:
            not_forming |= bit
            continue
        forming = rooms[key] = policy.forming_room()
        if forming is None:
            not_forming |= bit
            continue
        rows, oldest_ns = forming
        mask |= bit
        room = rows if room is None else min(room, rows)
        floor = max(floor, oldest_ns)
    requests = quiet & ~blocked
    mask &= ~not_forming
    words = NOT_FORMING if not mask or not room else tuple.__new__(Forming, (mask, room, floor))
    return deadline, requests, _quiet_instances(candidates, rooms, requests), words


def _quiet_instances(
    candidates: list[Instance], rooms: dict[int, tuple[int, int] | None], loud_bits: int
) -> frozenset[int]:
    """``done_wakeups.quiet_instances`` past its first tests (``candidates``), with the
    forming rooms ``walk_words`` already asked (by ``id`` of the generation)."""
    out = []
    for inst in candidates:
        gen = cast(Generation, inst.generation)
        policy = gen.policy
        if policy.queue_depth():
            key = id(gen)
            forming = rooms[key] if key in rooms else policy.forming_room()
            if forming is None:
                continue
        if gen.request_bit & loud_bits:
            continue
        plain = gen.quiet_done
        if plain is None:
            plain = gen.quiet_done = plain_for_quiet(gen, never_leased)
        if plain:
            out.append(inst.instance_id)
    return frozenset(out)


def never_leased(gen: Generation) -> bool:
    """``done_wakeups``'s ``leased`` for ``BatchDone`` s: no version's ``BatchDone`` must
    wake the scheduler to offer a lease, since a leased version's worker posts the lease
    itself while its ring is quiet, and wakes the scheduler when it does not
    (``ipc.direct.worker_reoffers``)."""
    return False
