"""A python model's readiness queries (``pb_utils.is_model_ready``) to models that check
their own readiness (python ``is_ready()``).

Imported by ``workers.bls.bls_client``. As core's ``TRITONSERVER_ServerModelIsReady`` calls the
model's ``IsReady()`` (every instance's ``TRITONBACKEND_ModelInstanceReady``; the python
backend calls ``is_ready()``), the BLS client sends the scheduler a ``ReadyQuery`` naming
itself (``bls_client``); the scheduler answers which instances it asked (``ReadyFanout``) and
each of those answers the client (``InstanceReadiness``), as for a frontend's ModelReady
(``frontend.readiness``). Ready when every instance is; no answer within ``TIMEOUT_S`` is
not ready, as upstream's five seconds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from triton_mp.ipc.protocol.ready_messages import InstanceReadiness, ReadyFanout

TIMEOUT_S = 5.0
"""How long a query waits for its instances (upstream ``kUserModelReadinessTimeoutMs``)."""


@dataclass
class _Query:
    expected: set[int] | None = None
    answers: dict[int, bool] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)


class ReadinessQueries:
    """The open readiness queries of one BLS client (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queries: dict[int, _Query] = {}

    def open(self, query_id: int) -> None:
        """Register ``query_id`` before its ``ReadyQuery`` is sent."""
        with self._lock:
            self._queries[query_id] = _Query()

    def deliver(self, msg: ReadyFanout | InstanceReadiness) -> None:
        """Take one answer (the client's receive thread); unknown queries are dropped."""
        with self._lock:
            query = self._queries.get(msg.query_id)
            if query is None:
                return
            if isinstance(msg, ReadyFanout):
                query.expected = set(msg.instance_ids)
            else:
                query.answers[msg.instance_id] = msg.ready
            if query.expected is not None and query.expected <= query.answers.keys():
                query.done.set()

    def wait(self, query_id: int, timeout_s: float = TIMEOUT_S) -> bool:
        """Whether every asked instance said ready (False on a timeout); closes the query."""
        with self._lock:
            query = self._queries[query_id]
        answered = query.done.wait(timeout_s)
        with self._lock:
            self._queries.pop(query_id, None)
            return answered and all(query.answers[i] for i in query.expected or ())
