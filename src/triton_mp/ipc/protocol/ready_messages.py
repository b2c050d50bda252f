"""The messages of a model readiness check that asks the model (python ``is_ready()``).

Triton's core calls ``TRITONBACKEND_ModelInstanceReady`` of every instance of a version
for ModelReady and, under strict readiness, for ServerReady; the python backend answers
it by calling the model's ``is_ready()`` (python_be.cc ``RunUserModelReadinessCheck``).
Here a frontend asks the scheduler (``ReadyQuery``), which names the instances that have
such a check (``ReadyFanout``) and sends each one a ``ReadyCheck``; each worker answers
the frontend directly (``InstanceReadiness``). The unions of ``ipc.protocol.messages`` carry them.
"""

from __future__ import annotations

import msgspec


class ReadyQuery(msgspec.Struct, frozen=True, kw_only=True, tag="ready_query", array_like=True):
    """A frontend asks whether a model version's instances are ready by the model's own
    check (frontend -> scheduler)."""

    query_id: int
    frontend_id: int
    model: str
    version: int
    bls_client: int = -1
    """>= 0: the query is a python model's (``pb_utils.is_model_ready``): the answers go to
    the BLS client of that instance, not to frontend ``frontend_id``."""


class ReadyFanout(msgspec.Struct, frozen=True, kw_only=True, tag="ready_fanout", array_like=True):
    """The instances asked for a ``ReadyQuery`` (scheduler -> frontend): the frontend waits
    for one ``InstanceReadiness`` from each; none means nothing to ask (ready)."""

    query_id: int
    instance_ids: tuple[int, ...]


class ReadyCheck(msgspec.Struct, frozen=True, kw_only=True, tag="ready_check", array_like=True):
    """Run the model's readiness check and answer frontend ``frontend_id`` (scheduler ->
    worker)."""

    query_id: int
    frontend_id: int
    bls_client: int = -1
    """As ``ReadyQuery.bls_client``: answer that BLS client instead."""


class InstanceReadiness(
    msgspec.Struct, frozen=True, kw_only=True, tag="instance_ready", array_like=True
):
    """One instance's answer to a ``ReadyCheck`` (worker -> frontend).

    Attributes:
        ready: what ``is_ready()`` returned (False when it raised or returned no bool).
        message: why it is not ready ("" when ready).
    """

    query_id: int
    instance_id: int
    ready: bool
    message: str = ""
