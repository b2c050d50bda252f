"""What the scheduler's books say: Triton's ModelStatistics and triton-mp's queue status.

Imported by the frontend only; no transport. The scheduler sees every request of every
frontend, so it alone keeps the statistics and the queues; a frontend asks it with a
``StatsQuery`` or ``QueueQuery`` and the ``StatsReply`` / ``QueueReply`` comes back through
the inbox to the pending table. ``statistics`` serves ModelStatistics (gRPC and HTTP);
``queue_status`` serves our ``triton_mp.admin.Admin/QueueStatus`` (``triton-mp stat``);
``ask`` is the query itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.model_table import ModelTable, version_number
from triton_mp.ipc import encode
from triton_mp.ipc.protocol.messages import QueueQuery, QueueReply, StatsQuery, StatsReply
from triton_mp.ipc.protocol.reports import ModelQueueStatus, ModelStats

SCHEDULER_REPLY_TIMEOUT_S = 5.0
"""How long a queue query waits for the scheduler's ``QueueReply`` before failing with
DEADLINE_EXCEEDED."""


class StatsApi:
    """Queries to the scheduler's statistics and queues.

    Args:
        frontend_id: this frontend's index (the scheduler answers on its inbox).
        models: the model table (unknown names are refused here, not by the scheduler).
        pending: the table the scheduler's replies are delivered to.
        send_scheduler: pushes encoded bytes to the scheduler.
        reply_timeout_s: how long ``queue_status`` waits for the scheduler.

    Attributes:
        frontend_restarts: per frontend id, the supervisor's restarts of it so far
            (``FrontendSpec.frontend_restarts``, then ``ModelTableUpdate``): the admin
            QueueStatus reply and ``triton_mp_frontend_restarts`` report it.
    """

    def __init__(
        self,
        *,
        frontend_id: int,
        models: ModelTable,
        pending: PendingTable,
        send_scheduler: Callable[[bytes], None],
        reply_timeout_s: float = SCHEDULER_REPLY_TIMEOUT_S,
    ) -> None:
        self._fid = frontend_id
        self._models = models
        self._pending = pending
        self._send = send_scheduler
        self._timeout_s = reply_timeout_s
        self.frontend_restarts: dict[int, int] = {}

    async def ask(
        self, make: Callable[[int], StatsQuery | QueueQuery], timeout_s: float | None = None
    ) -> StatsReply | QueueReply:
        """Send the query ``make(query_id)`` builds and await the scheduler's reply.

        Raises:
            TimeoutError: no reply within ``timeout_s`` (None: wait as long as it takes).
            asyncio.CancelledError: the caller went away.
            TritonMPError: the query could not be sent (UNAVAILABLE).
            In every case the query is forgotten.
        """
        qid, fut = self._pending.new_query()
        try:
            self._send(encode(make(qid)))
            if timeout_s is None:
                return await fut
            return await asyncio.wait_for(fut, timeout_s)
        except BaseException:
            self._pending.forget_query(qid)
            raise

    async def statistics(self, name: str, version: str) -> tuple[ModelStats, ...]:
        """Triton ModelStatistics, from the scheduler's books (empty name = all models).

        Raises:
            TritonMPError: INVALID_ARG for a bad version string, a model that is not
                available ("requested model '<m>' is not available"), a version of it that
                is not ("requested model version is not available for model '<m>'"), or a
                version without a model name.
            asyncio.CancelledError: the caller went away (the query is forgotten).
        """
        v = -1
        if name:
            try:
                _, resolved = self._models.resolve(name, "")
            except InvalidRequest:
                raise
            except TritonMPError:
                raise InvalidRequest(f"requested model '{name}' is not available") from None
            if version:
                try:
                    _, resolved = self._models.resolve(name, version)
                except InvalidRequest:
                    raise
                except TritonMPError:
                    raise InvalidRequest(
                        f"requested model version is not available for model '{name}'"
                    ) from None
            v = resolved if version else -1
        elif version:
            # NOTE: the server's GetModelVersionFromString reads it; core's
            # ServerModelStatistics ignores a version without a model (every model's stats).
            version_number(version)
        reply = await self.ask(
            lambda q: StatsQuery(
                query_id=q, frontend_id=self._fid, model=name, version=v, since_load=True
            )
        )
        assert isinstance(reply, StatsReply)
        return reply.stats

    async def queue_status(self, model: str) -> tuple[ModelQueueStatus, ...]:
        """Every model's queue state, or one model's.

        Raises:
            TritonMPError: NOT_FOUND for an unknown model (the scheduler is not asked);
                DEADLINE_EXCEEDED when the scheduler does not answer in time.
        """
        if model:
            self._models.get(model)
        try:
            reply = await self.ask(
                lambda q: QueueQuery(query_id=q, frontend_id=self._fid, model=model),
                self._timeout_s,
            )
        except TimeoutError:
            raise TritonMPError(
                f"the scheduler did not answer the queue query within {self._timeout_s:g} s",
                ErrorCode.DEADLINE_EXCEEDED,
            ) from None
        assert isinstance(reply, QueueReply)
        return reply.models
