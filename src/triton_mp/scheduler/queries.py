"""The scheduler's answers to queries: statistics (``ModelStatistics``), queues (``triton-mp
stat``) and which instances check a python model's readiness (``is_ready()``).

Imported by ``scheduler.core``, whose dispatch table calls these with its own books. Pure:
each appends its answer to the core's ``Outbox``.
"""

from __future__ import annotations

from triton_mp.ipc.protocol.messages import (
    QueueQuery,
    QueueReply,
    ReplyTo,
    Requester,
    StatsQuery,
    StatsReply,
)
from triton_mp.ipc.protocol.ready_messages import ReadyCheck, ReadyFanout, ReadyQuery
from triton_mp.ipc.protocol.reports import ModelQueueStatus
from triton_mp.scheduler.instances import readiness_checked
from triton_mp.scheduler.lifecycle import Lifecycle
from triton_mp.scheduler.outbox import Outbox
from triton_mp.scheduler.stats import StatsBook


def answer_ready_query(msg: ReadyQuery, lifecycle: Lifecycle, out: Outbox) -> None:
    """Ask every live instance of the version whose model checks its own readiness
    (python ``is_ready()``); tell the asker which ones will answer it."""
    gen = lifecycle.generation_for((msg.model, msg.version))
    asked = readiness_checked(lifecycle.instances.members(gen) if gen else [])
    check = ReadyCheck(
        query_id=msg.query_id, frontend_id=msg.frontend_id, bls_client=msg.bls_client
    )
    for iid in asked:
        out.to_instance(iid, check)
    if msg.bls_client >= 0:
        to = ReplyTo(Requester.BLS, msg.bls_client)
    else:
        to = ReplyTo(Requester.FRONTEND, msg.frontend_id)
    out.reply(to, ReadyFanout(query_id=msg.query_id, instance_ids=asked))


def answer_stats_query(msg: StatsQuery, stats: StatsBook, out: Outbox) -> None:
    """The statistics of one model version (all when the query names none)."""
    snapshot = stats.snapshot(msg.model, msg.version, since_load=msg.since_load)
    to = ReplyTo(Requester.FRONTEND, msg.frontend_id)
    out.reply(to, StatsReply(query_id=msg.query_id, stats=snapshot))


def answer_queue_query(msg: QueueQuery, models: tuple[ModelQueueStatus, ...], out: Outbox) -> None:
    """The queues of the model the query names (``models``: the core's ``queue_status``)."""
    to = ReplyTo(Requester.FRONTEND, msg.frontend_id)
    out.reply(to, QueueReply(query_id=msg.query_id, models=models))
