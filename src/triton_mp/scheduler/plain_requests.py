"""Plain requests queued in one call per drain: the scheduler core's fast lane for REQUEST
records (``ipc.recordio.records.RequestRecord``) of plain generations.

Imported by ``scheduler.core`` (``SchedulerCore.handle_all``) and ``scheduler.lifecycle``
(``plain_queue``, once per generation). Most requests of a busy server go to a model whose
queue has one level, no queue policy, no shape rule and no ensemble, sequence or iterative
step: for those, ``SchedulerCore._on_request`` and ``_offer`` only build a ``Queued`` and
append it to the queue's one FIFO. Python decides which generations are so
(``plain_queue``); ``queue_records`` then moves their records: in C when the extension is
built (``scheduler/native/queue_records.cc``, ``triton_mp.scheduler._queue_records``), else
by ``queue_records_py``, its Python twin (tests/unit/test_queue_records.py fuzzes one
against the other). Every other message, and a record for a generation not marked plain,
stops the call and goes through the core's handlers, so every rule and every word stays
theirs.

Why: per request the Python path was ~1.5 µs hot and 4-6 µs live at c=16 (``handle``: 45 µs
per batch of ~10, issue 34, report12-s12sch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from triton_mp.ipc.protocol.messages import SequenceFlags
from triton_mp.ipc.recordio.records import RequestRecord
from triton_mp.scheduler.instances import Generation, PlainQueue, VersionKey
from triton_mp.scheduler.policies.policy import Queued
from triton_mp.scheduler.policies.queues import QueuedInstances

_START = int(SequenceFlags.START)
_END = int(SequenceFlags.END)


def plain_queue(gen: Generation) -> PlainQueue | None:
    """Where ``gen``'s requests go when ``SchedulerCore._offer`` would only append them:
    a default scheduler or a dynamic batcher (``QueuedInstances.offer``) whose queue is
    plain (``PriorityQueue.plain_waiting``), no ensemble, no iterative steps, no shape or
    optional-input rule (``Generation.batch_key`` is ``()``). None otherwise. Fixed for the
    generation's life: nothing it reads changes after the generation starts."""
    policy: Any = gen.policy
    if (
        gen.spec.ensemble is not None
        or gen.enforced_inputs
        or gen.optional_inputs
        or not isinstance(policy, QueuedInstances)
        or type(policy).offer is not QueuedInstances.offer
        or policy.iterative_steps is not None
    ):
        return None
    queue = policy.queue
    waiting = queue.plain_waiting()
    return None if waiting is None else PlainQueue(waiting, queue)


def queue_records_py(
    msgs: list[Any], start: int, active: dict[VersionKey, Generation], now_ns: int
) -> int:
    """From ``msgs[start]`` on, queue each ``RequestRecord`` whose active generation
    (``active[(model, version)]``) has a ``plain`` queue, as ``SchedulerCore._on_request``
    would (a ``Queued`` of the same fields, appended; the queue's count and version bumped
    by one per request); return the index of the first message it did not take (another
    message, a record of a version not active or not plain, or ``len(msgs)``). The caller
    is not stopping (``SchedulerCore.stopping``: every request fails then).

    The Python twin of ``queue_records`` in ``scheduler/native/queue_records.cc``."""
    n = len(msgs)
    i = start
    while i < n:
        req = msgs[i]
        if type(req) is not RequestRecord:
            break
        gen = active.get((req.model, req.version))
        plain = None if gen is None else gen.plain
        if plain is None:
            break
        size = req.batch_size
        arrival = req.arrival_ns
        flags = req.sequence_flags
        plain.waiting.append(
            Queued(
                (req.reply_to, req.request_id),
                size if size > 1 else 1,
                (),
                arrival if 0 < arrival <= now_ns else now_ns,
                req,
                req.priority,
                req.timeout_us,
                0,
                0,
                False,
                req.sequence_id,
                bool(flags & _START),
                bool(flags & _END),
            )
        )
        plain.queue.pushed(1)
        i += 1
    return i


try:
    # NOTE: mypy sees the extension only where it is built: either ignore may be unused.
    from triton_mp.scheduler import _queue_records as native  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # NOTE: not built (setup.py): the Python twin queues
    native = None  # type: ignore[assignment,unused-ignore]


def _configure() -> Callable[[list[Any], int, dict[Any, Any], int], int]:
    """The C ``queue_records`` configured with the classes it builds and reads, or the
    Python twin when the extension is not built."""
    if native is None:
        return queue_records_py
    native.configure(RequestRecord, Queued, Generation, PlainQueue, _START, _END)
    return native.queue_records  # type: ignore[no-any-return]


queue_records = _configure()
"""``queue_records_py``'s semantics, in C when the extension is built."""
