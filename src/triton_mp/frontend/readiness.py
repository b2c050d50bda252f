"""Model readiness that asks the model: python ``is_ready()`` behind ModelReady and
(strict) ServerReady, as Triton's core asks ``TRITONBACKEND_ModelInstanceReady`` of every
instance (server.cc ``ModelIsReady`` / ``IsReady``; python_be.cc).

Imported by the frontend only; no transport. ``ReadinessChecks.ask`` sends a
``ReadyQuery`` for one model version to the scheduler, which answers with the instances
it asked (``ReadyFanout``); each of those answers here (``InstanceReadiness``). The
version is ready when every asked instance is (none asked: ready). An instance that does
not answer within ``READY_TIMEOUT_S`` counts as not ready, as upstream's five-second
``kUserModelReadinessTimeoutMs``. Only python models are asked (no other backend has a
check of its own), so the others keep answering from the model table alone.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from triton_mp.ipc import encode
from triton_mp.ipc.protocol.ready_messages import InstanceReadiness, ReadyFanout, ReadyQuery

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 5.0
"""How long a readiness check waits for the model's ``is_ready()`` (upstream: 5 s)."""


class _Query:
    """One readiness query in flight: who must answer, who has."""

    __slots__ = ("answers", "expected", "future")

    def __init__(self, future: asyncio.Future[tuple[bool, str]]) -> None:
        self.future = future
        self.expected: set[int] | None = None
        self.answers: dict[int, InstanceReadiness] = {}

    def settle(self) -> None:
        """Resolve the future once every expected instance answered (any order)."""
        if self.expected is None or self.future.done():
            return
        if not self.expected <= self.answers.keys():
            return
        self.future.set_result(verdict([self.answers[i] for i in sorted(self.expected)]))


def verdict(answers: list[InstanceReadiness]) -> tuple[bool, str]:
    """Ready when every instance is (``TritonModel::IsReady``: the first one that is not
    decides, with its reason)."""
    for a in answers:
        if not a.ready:
            return False, a.message
    return True, ""


class ReadinessChecks:
    """This frontend's readiness queries to python models.

    Args:
        frontend_id: where the answers come (``ReadyQuery.frontend_id``).
        send_scheduler: pushes encoded bytes to the scheduler.
        timeout_s: how long a query waits for every instance.
    """

    def __init__(
        self,
        frontend_id: int,
        send_scheduler: Callable[[bytes], None],
        timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self._fid = frontend_id
        self._send = send_scheduler
        self._timeout_s = timeout_s
        self._ids = itertools.count(1)
        self._queries: dict[int, _Query] = {}

    async def ask(self, model: str, version: int) -> bool:
        """Whether every live instance of ``model`` version ``version`` reports ready
        (False on the model's refusal, its exception, or no answer in time)."""
        qid = next(self._ids)
        query = _Query(asyncio.get_running_loop().create_future())
        self._queries[qid] = query
        try:
            self._send(
                encode(
                    ReadyQuery(query_id=qid, frontend_id=self._fid, model=model, version=version)
                )
            )
            ready, why = await asyncio.wait_for(query.future, self._timeout_s)
        except TimeoutError:
            ready, why = False, "Timed out waiting for user-defined is_ready() response"
        finally:
            self._queries.pop(qid, None)
        if not ready:
            log.debug("Model '%s' version %d is not ready: %s", model, version, why)
        return ready

    def deliver(self, msg: ReadyFanout | InstanceReadiness) -> None:
        """An answer from the scheduler or a worker (loop thread)."""
        query = self._queries.get(msg.query_id)
        if query is None:
            return
        if isinstance(msg, ReadyFanout):
            query.expected = set(msg.instance_ids)
        else:
            query.answers[msg.instance_id] = msg
        query.settle()
