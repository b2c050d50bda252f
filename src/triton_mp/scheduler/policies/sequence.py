"""Triton's sequence batcher for one model version: Direct and Oldest strategies.

The policy of a model with ``sequence_batching`` (registered as ``sequence`` in
``scheduler.registry.POLICIES``): a pure state machine like the others
(``scheduler.policies.policy``:
same contract, same injected time, same ``Batch`` handed to one idle instance). Semantics
(Triton core ``sequence_batch_scheduler.cc``, docs ``architecture.md`` "Stateful Models",
triton.md §4.5):

- Every request names a sequence by its correlation ID (uint64 or string) and may carry the
  START and END flags (``Queued.starts``, ``Queued.ends``). A sequence is bound to one
  *slot* of one instance for its lifetime, so every request of it runs on the instance that
  holds its state.
- Direct: each instance has ``max(1, max_batch_size)`` slots. A batch has one row per slot up
  to the highest slot with a request ready; rows of slots without one are null (READY false).
  While an instance is idle, a batch goes at once when ``max_queue_delay_microseconds`` is 0
  or the fraction of its slots with a request ready reaches ``minimum_slot_utilization``
  (default 0: at once), else when the oldest ready request has waited the delay.
- Oldest: each instance has ``max_candidate_sequences`` slots (0: ``max(1, max_batch_size)``).
  A batch takes the oldest head request of each of the instance's sequences (at most one per
  sequence), formed by the dynamic batcher's walk: ``max_batch_size``, preferred sizes,
  ``max_queue_delay_microseconds``, equal shapes.
- A START for an unknown sequence takes a free slot (slot 0 of every instance first, then
  slot 1, ...), or waits in a FIFO backlog of sequences. A START for a live sequence
  restarts it in its slot. A request without START for a sequence that is not live is refused:
  "must specify the START flag on the first request of the sequence"; a sequence whose END
  request is queued is not live any more (core ``SequenceBatchScheduler::Enqueue`` forgets the
  ID when it queues the END), though its slot stays bound until the END is handed out.
- The slot is released when the END request is handed to its instance (the instance runs its
  batches in order, so the next sequence's first request runs after it), or when the sequence
  has had no request for ``max_sequence_idle_microseconds``; the oldest backlogged sequence
  then takes it. Released-for-idle IDs travel with the instance's next batch so the worker
  drops their state.
- A backlogged sequence whose first request's ``timeout`` runs out fails every request it has
  queued: "timeout of the corresponding sequence has been expired".
- A cancelled queued request (its client's deadline or cancellation) ends its sequence, as
  Triton's request_cancellation.md says: the requests queued behind it fail CANCELLED, those
  ahead of it still run, then the slot is released as for an idle sequence (its ID travels
  with the instance's next batch). 2.51 sees the cancellation when the request reaches the
  head of its slot's queue; requests that arrive meanwhile are then cancelled too, here they
  are refused as for any ended sequence.
- When an instance dies, its sequences are lost (their state lived in it): queued requests
  fail and later requests need a new START.
- Iterative sequences (``iterative_sequence: true``; core ``IterativeSequencer``): the
  scheduler gives a request without a correlation ID a sequence of its own (an ID and
  START). Its slot stays bound while the request runs (no idle release then); when the model
  releases it with ``RELEASE_RESCHEDULE`` it is queued again first in its sequence with no
  flags (``reschedule``), otherwise the sequence ends (``finish``) unless the request had
  END (then its slot was freed when it was handed out, as for any sequence).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from triton_mp.common.close_reason import CloseReason
from triton_mp.common.errors import ErrorCode
from triton_mp.scheduler.policies.dynamic import decide, walk
from triton_mp.scheduler.policies.policy import (
    Batch,
    IterativeSteps,
    LevelSnapshot,
    Queued,
    Rejection,
    arrived_ns,
)

SEQUENCE_CANCELLED = Rejection(ErrorCode.CANCELLED, "", "CANCELED", prefixed=False)
"""What a request queued behind a cancelled one of its sequence gets (2.51: CANCELLED with
no message; counted a failure, reason CANCELED)."""

MAX_STRING_CORRID = 128
"""Longest string correlation ID, in characters."""


def _ended(queue: collections.deque[Queued]) -> bool:
    """The sequence's last queued request has END."""
    return bool(queue) and queue[-1].ends


@dataclass(slots=True)
class _Slot:
    instance_id: int
    index: int
    corrid: Hashable = None
    """The sequence bound to the slot; None = free."""
    queue: collections.deque[Queued] = field(default_factory=collections.deque)
    last_ns: int = 0
    """Last activity of its sequence: a request arrived or was handed to the instance."""
    running: bool = False
    """An iterative sequence's request runs on the instance (the slot is not idle)."""
    ending: bool = False
    """A request of its sequence was cancelled behind requests still queued: the sequence
    ends when the last of them is handed out, as after an END."""


class SequenceBatcher:
    """Triton's sequence batcher for one model version (see the module docstring).

    Args:
        model: the model name (error messages).
        strategy: ``direct`` or ``oldest``.
        max_batch_size: the model's ``max_batch_size``.
        instance_ids: every instance of the model version (none idle yet).
        max_sequence_idle_us: ``max_sequence_idle_microseconds``.
        max_queue_delay_us: the strategy's ``max_queue_delay_microseconds``.
        minimum_slot_utilization: Direct's ``minimum_slot_utilization`` (0 = any).
        max_candidate_sequences: Oldest's candidate sequences per instance (0 = default).
        preferred_batch_sizes: Oldest's ``preferred_batch_size``.
        corrid_kind: ``int`` or ``str`` when a CORRID control fixes the type of correlation
            IDs (a control of datatype BYTES wants strings), None when any is accepted.
        iterative: ``iterative_sequence`` (see the module docstring).
    """

    def __init__(
        self,
        model: str,
        strategy: Literal["direct", "oldest"],
        max_batch_size: int,
        instance_ids: Sequence[int],
        *,
        max_sequence_idle_us: int = 1_000_000,
        max_queue_delay_us: int = 0,
        minimum_slot_utilization: float = 0.0,
        max_candidate_sequences: int = 0,
        preferred_batch_sizes: Sequence[int] = (),
        corrid_kind: type | None = None,
        iterative: bool = False,
    ) -> None:
        self.model = model
        self.iterative = iterative
        self.iterative_steps: IterativeSteps | None = self if iterative else None
        self.corrid_kind = corrid_kind
        self.strategy = strategy
        self.max_batch_size = max_batch_size
        per_instance = max(1, max_batch_size)
        if strategy == "oldest" and max_candidate_sequences > 0:
            per_instance = max_candidate_sequences
        self.slots_per_instance = per_instance
        self.idle_ns = max_sequence_idle_us * 1000
        self.delay_ns = max_queue_delay_us * 1000
        self.min_utilization = minimum_slot_utilization
        limit = max(1, max_batch_size)
        self.preferred = frozenset(p for p in preferred_batch_sizes if 0 < p <= limit)
        self.max_preferred = max(self.preferred, default=limit)
        self._slots: dict[int, list[_Slot]] = {
            i: [_Slot(i, s) for s in range(per_instance)] for i in instance_ids
        }
        self._active: dict[Hashable, _Slot] = {}
        self._backlog: collections.OrderedDict[Hashable, collections.deque[Queued]] = (
            collections.OrderedDict()
        )
        self._idle: collections.deque[int] = collections.deque()
        self._idle_since: dict[int, int] = {}
        self._live: set[int] = set()
        self._leaving: set[int] = set()
        """Instances a regroup removed: they keep their live sequences, take no new one."""
        self._released: dict[int, list[Hashable]] = collections.defaultdict(list)
        self._failed: list[tuple[Queued, Rejection]] = []
        self._next_sequence_id = 0

    # ----------------------------------------------------------------- requests
    def offer(self, item: Queued, now_ns: int) -> Rejection | None:
        """Queue a request of a sequence (``item.corrid``, ``item.starts``, ``item.ends``).

        Returns:
            A Rejection (INVALID_ARG, counted in no statistic) for a request of batch size
            above 1, without a correlation ID, with an ID of the wrong type or too long, or
            without START for a sequence that is not live; else None.
        """
        corrid = item.corrid
        invalid = self._check(item)
        if invalid is not None:
            # NOTE: core SequenceBatchScheduler::Enqueue words these without LogRequest(), and
            # returns them before the request is queued: 2.51 counts them nowhere (reason None).
            return Rejection(ErrorCode.INVALID_ARG, invalid, None, prefixed=False)
        slot = self._active.get(corrid)
        backlog = self._backlog.get(corrid)
        queued = slot.queue if slot is not None else backlog
        # NOTE: a sequence whose END is queued is over for new requests (core Enqueue drops
        # the ID from its maps when it queues the END); a START then follows the END.
        live = queued is not None and not (slot is not None and slot.ending)
        if queued is not None and (item.starts or (live and not _ended(queued))):
            queued.append(item)
            if slot is not None:
                slot.last_ns = now_ns
                slot.ending = slot.ending and not item.starts
            return None
        if not item.starts:
            return Rejection(
                ErrorCode.INVALID_ARG,
                f"inference request for sequence {corrid} to model '{self.model}' must "
                "specify the START flag on the first request of the sequence",
                None,
                prefixed=False,
            )
        slot = self._free_slot()
        if slot is None:
            self._backlog[corrid] = collections.deque([item])
            return None
        self._bind(slot, corrid, now_ns)
        slot.queue.append(item)
        return None

    def _check(self, item: Queued) -> str | None:
        corrid = item.corrid
        if item.batch_size > 1:
            return (
                f"inference request to model '{self.model}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            )
        if corrid is None or corrid == 0 or corrid == "":
            return (
                f"inference request to model '{self.model}' must specify a non-zero or "
                "non-empty correlation ID"
            )
        # NOTE: a frontend refuses these first, with Triton's words and the request id
        # (frontend.validation.parameters); here for requests that reach the scheduler
        # without a frontend (BLS).
        if isinstance(corrid, str) and len(corrid) > MAX_STRING_CORRID:
            return "string correlation ID cannot be longer than 128 characters"
        if self.corrid_kind is not None and not isinstance(corrid, self.corrid_kind):
            got = "BYTES" if isinstance(corrid, str) else "UINT64"
            want = "BYTES" if self.corrid_kind is str else "UINT64"
            return (
                f"sequence batching control 'CORRID' data-type is '{got}', but model "
                f"'{self.model}' expects '{want}'"
            )
        return None

    def cancel(self, key: Hashable) -> Queued | None:
        """Remove the queued request ``key``; None when it is not queued.

        Its sequence ends with it (Triton's request_cancellation.md: "all the pending
        requests in the same sequence will also be cancelled"): the requests queued behind
        it fail CANCELLED (``expire``), and the slot is released once the requests queued
        ahead of it are handed out (by the next ``expire`` when none are); a backlogged
        sequence leaves the backlog with all its requests. Its next request needs START.
        """
        for slot in self._active.values():
            for n, item in enumerate(slot.queue):
                if item.key == key:
                    ahead = list(itertools.islice(slot.queue, n))
                    behind = list(itertools.islice(slot.queue, n + 1, None))
                    self._failed.extend((q, SEQUENCE_CANCELLED) for q in behind)
                    slot.queue.clear()
                    slot.queue.extend(ahead)
                    slot.ending = True
                    return item
        for corrid, q in self._backlog.items():
            for item in q:
                if item.key == key:
                    del self._backlog[corrid]
                    self._failed.extend(
                        (other, SEQUENCE_CANCELLED) for other in q if other is not item
                    )
                    return item
        return None

    def drain_queue(self) -> list[Queued]:
        """Remove and return every queued request (shutdown)."""
        out: list[Queued] = []
        for slot in self._active.values():
            out.extend(slot.queue)
            slot.queue.clear()
        for q in self._backlog.values():
            out.extend(q)
        self._backlog.clear()
        return out

    def queue_depth(self) -> int:
        """Requests waiting, in slots and in the backlog."""
        return sum(len(s.queue) for s in self._active.values()) + sum(
            len(q) for q in self._backlog.values()
        )

    def levels(self) -> list[LevelSnapshot]:
        """One level (0): every queued request; ``delayed`` counts backlogged ones."""
        queued = [q for s in self._active.values() for q in s.queue]
        backlogged = [q for b in self._backlog.values() for q in b]
        oldest = min((arrived_ns(q) for q in queued + backlogged), default=None)
        return [LevelSnapshot(0, len(queued) + len(backlogged), len(backlogged), oldest, 0, 0, 0)]

    # ----------------------------------------------------------------- instances
    def instance_idle(self, instance_id: int, now_ns: int = 0) -> None:
        """The instance finished its batch (or became ready)."""
        if instance_id not in self._live:
            self._live.add(instance_id)
            for slot in self._slots.get(instance_id, []):
                if slot.corrid is None:
                    self._fill_from_backlog(slot, now_ns)
        if instance_id not in self._idle:
            self._idle.append(instance_id)
            self._idle_since[instance_id] = now_ns

    def instance_gone(self, instance_id: int) -> None:
        """The instance died: its sequences are lost; their queued requests fail."""
        with contextlib.suppress(ValueError):
            self._idle.remove(instance_id)
        self._live.discard(instance_id)
        for slot in self._slots.get(instance_id, []):
            if slot.corrid is None:
                continue
            lost = Rejection(
                ErrorCode.UNAVAILABLE,
                f"sequence {slot.corrid} of model '{self.model}' was lost: its model instance "
                "stopped",
                "OTHER",
            )
            self._failed.extend((item, lost) for item in slot.queue)
            self._unbind(slot)
        self._released.pop(instance_id, None)
        # NOTE: the freed slots stay unused until the instance is live again.

    def regroup(self, added: Sequence[int], leaving: Sequence[int]) -> None:
        """``added`` instances get their slots (free until they are live); ``leaving`` ones
        keep their bound sequences to their end (a slot freed there is not used again),
        as core ``SequenceBatchScheduler::Update`` keeps them in
        ``pending_removal_seq_slots_``."""
        for instance_id in added:
            self._slots.setdefault(
                instance_id, [_Slot(instance_id, s) for s in range(self.slots_per_instance)]
            )
        self._leaving.update(leaving)

    def holds(self, instance_id: int) -> bool:
        """Whether a sequence is bound to one of the instance's slots."""
        return any(s.corrid is not None for s in self._slots.get(instance_id, ()))

    # ----------------------------------------------------------------- time
    def expire(self, now_ns: int) -> list[tuple[Queued, Rejection]]:
        """Release idle sequences and cancelled ones (``cancel``); fail backlogged sequences
        whose timeout ran out, and the requests a cancellation ended."""
        failed, self._failed = self._failed, []
        for slot in list(self._active.values()):
            if slot.ending and not slot.queue and not slot.running:
                self._release(slot, now_ns)
            elif not slot.queue and not slot.running and now_ns - slot.last_ns >= self.idle_ns:
                self._released[slot.instance_id].append(slot.corrid)
                self._unbind(slot)
                self._fill_from_backlog(slot, now_ns)
        for corrid, queue in list(self._backlog.items()):
            first = queue[0]
            if first.timeout_us and now_ns - first.enqueue_ns >= first.timeout_us * 1000:
                del self._backlog[corrid]
                why = Rejection(
                    ErrorCode.UNAVAILABLE,
                    "timeout of the corresponding sequence has been expired",
                )
                failed.extend((item, why) for item in queue)
        return failed

    def next_deadline_ns(self) -> int | None:
        """The nearest idle release, backlog timeout or batching delay."""
        times = [
            slot.last_ns + self.idle_ns
            for slot in self._active.values()
            if not slot.queue and not slot.running
        ]
        times += [
            q[0].enqueue_ns + q[0].timeout_us * 1000
            for q in self._backlog.values()
            if q[0].timeout_us
        ]
        if self._failed or any(s.ending and not s.queue for s in self._active.values()):
            times.append(0)
        for instance_id in self._idle:
            ready = self._ready_slots(instance_id)
            if ready and self.delay_ns:
                times.append(min(s.queue[0].enqueue_ns for s in ready) + self.delay_ns)
        return min(times, default=None)

    def due_batch(self) -> tuple[int, int] | None:
        """None: a sequence batch's delay is not announced (the notice serves the dynamic
        batcher, whose delay is the common case)."""
        return None

    def forming_room(self) -> tuple[int, int] | None:
        """None: a sequence's requests are always read at once."""
        return None

    # ----------------------------------------------------------------- batches
    def pop_ready(self, now_ns: int) -> list[Batch]:
        """At most one batch per idle instance."""
        out = []
        for instance_id in list(self._idle):
            ready = self._ready_slots(instance_id)
            if not ready:
                continue
            batch = (
                self._direct(instance_id, ready, now_ns)
                if self.strategy == "direct"
                else self._oldest(instance_id, ready, now_ns)
            )
            if batch is not None:
                self._idle.remove(instance_id)
                out.append(batch)
        return out

    def _direct(self, instance_id: int, ready: list[_Slot], now_ns: int) -> Batch | None:
        total = self.slots_per_instance
        oldest = min(s.queue[0].enqueue_ns for s in ready)
        if len(ready) == total:
            reason = CloseReason.MAX
        elif self.delay_ns == 0 or len(ready) >= self.min_utilization * total:
            reason = CloseReason.IDLE
        elif now_ns - oldest >= self.delay_ns:
            reason = CloseReason.DELAY
        else:
            return None
        # NOTE: released before the takes: one of them may end a cancelled sequence, whose
        # state the instance drops with its next batch, after this one ran.
        released = tuple(self._released.pop(instance_id, ()))
        requests = [self._take(slot, now_ns) for slot in ready]
        rows = max(s.index for s in ready) + 1
        return Batch(
            instance_id,
            tuple(requests),
            sum(r.batch_size for r in requests),
            reason,
            rows=rows,
            slots=tuple(s.index for s in ready),
            released=released,
        )

    def _oldest(self, instance_id: int, ready: list[_Slot], now_ns: int) -> Batch | None:
        heads = sorted(ready, key=lambda s: s.queue[0].enqueue_ns)
        if self.max_batch_size == 0:
            chosen = heads[:1]
            reason = CloseReason.SINGLE
        else:
            w = walk(
                (s.queue[0] for s in heads), self.max_batch_size, self.preferred, self.max_preferred
            )
            decision = decide(
                w,
                now_ns,
                self.delay_ns,
                self.preferred,
                self.max_preferred,
                self._idle_since.get(instance_id, 0),
            )
            if decision is None:
                return None
            count, _, reason = decision
            chosen = heads[:count]
        released = tuple(self._released.pop(instance_id, ()))  # NOTE: as in _direct
        requests = [self._take(slot, now_ns) for slot in chosen]
        return Batch(
            instance_id,
            tuple(requests),
            sum(r.batch_size for r in requests),
            reason,
            released=released,
        )

    # ----------------------------------------------------------------- slots
    def _ready_slots(self, instance_id: int) -> list[_Slot]:
        return [s for s in self._slots.get(instance_id, ()) if s.queue]

    def _take(self, slot: _Slot, now_ns: int) -> Queued:
        """Hand the slot's head request to its instance; release the slot after an END."""
        item = slot.queue.popleft()
        slot.last_ns = now_ns
        if slot.ending and not slot.queue:
            self._release(slot, now_ns)
        elif item.ends and not slot.queue:
            self._unbind(slot)
            self._fill_from_backlog(slot, now_ns)
        elif self.iterative:
            slot.running = True
        return item

    # ----------------------------------------------------------------- iterative
    def new_sequence_id(self) -> int:
        """The correlation ID of the next request that comes without one to an iterative
        model: 1, 2, ... per model version (core ``IterativeSequencer::sequence_id_``)."""
        self._next_sequence_id += 1
        return self._next_sequence_id

    def reschedule(self, item: Queued, now_ns: int) -> Rejection | None:
        """An iterative sequence's request the model released with ``RELEASE_RESCHEDULE``:
        queued first in its sequence (``item`` carries no START or END, as core's
        ``RescheduleRequest`` clears the flags). A sequence that lost its slot meanwhile
        (its instance died) starts again."""
        slot = self._active.get(item.corrid)
        if slot is None:
            return self.offer(replace(item, starts=True), now_ns)
        slot.running = False
        slot.last_ns = now_ns
        slot.queue.appendleft(item)
        return None

    def finish(self, corrid: Hashable, now_ns: int) -> None:
        """An iterative sequence's request was released for good (no RESCHEDULE): its
        sequence ends, as core's null END request ends it; the worker drops its state with
        the instance's next batch, and the oldest backlogged sequence takes the slot."""
        slot = self._active.get(corrid)
        if slot is None or not slot.running:
            return
        slot.running = False
        if slot.queue:
            return
        self._released[slot.instance_id].append(corrid)
        self._unbind(slot)
        self._fill_from_backlog(slot, now_ns)

    def _free_slot(self) -> _Slot | None:
        """Slot 0 of every live instance first, then slot 1, ... (spreads sequences)."""
        for index in range(self.slots_per_instance):
            for instance_id, slots in self._slots.items():
                usable = instance_id in self._live and instance_id not in self._leaving
                if usable and slots[index].corrid is None:
                    return slots[index]
        return None

    def _bind(self, slot: _Slot, corrid: Hashable, now_ns: int) -> None:
        slot.corrid = corrid
        slot.last_ns = now_ns
        self._active[corrid] = slot

    def _unbind(self, slot: _Slot) -> None:
        self._active.pop(slot.corrid, None)
        slot.corrid = None
        slot.running = False
        slot.ending = False
        slot.queue.clear()

    def _release(self, slot: _Slot, now_ns: int) -> None:
        """End a sequence without an END (cancelled): its ID travels with the instance's
        next batch so the worker drops its state, as after an idle release."""
        self._released[slot.instance_id].append(slot.corrid)
        self._unbind(slot)
        self._fill_from_backlog(slot, now_ns)

    def _fill_from_backlog(self, slot: _Slot, now_ns: int) -> None:
        if slot.instance_id not in self._live or slot.instance_id in self._leaving:
            return
        if not self._backlog:
            return
        corrid, queue = self._backlog.popitem(last=False)
        self._bind(slot, corrid, now_ns)
        slot.queue.extend(queue)
