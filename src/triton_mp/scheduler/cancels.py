"""A client's cancellation (``CancelRequest``), wherever its request is.

Imported by ``scheduler.core`` (its ``CancelRequest`` handler). A request still queued is
dropped and failed with Triton's words; one running (in an instance's batch, a decoupled one
still open, or handed directly and waiting) has the message forwarded to its worker, whose
model may stop early when it sees ``is_cancelled()``; an ensemble's goes to
``scheduler.ensembles``.
"""

from __future__ import annotations

from typing import cast

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import CancelRequest
from triton_mp.ipc.recordio.records import Request
from triton_mp.scheduler.direct import Handoffs
from triton_mp.scheduler.ensembles import Ensembles
from triton_mp.scheduler.instances import running_instance
from triton_mp.scheduler.lifecycle import Lifecycle
from triton_mp.scheduler.outbox import Outbox

CANCELLED_MESSAGE = "Request was cancelled before it was scheduled"


def cancel_request(
    msg: CancelRequest,
    now_ns: int,
    lifecycle: Lifecycle,
    ensembles: Ensembles,
    handoffs: Handoffs,
    out: Outbox,
) -> None:
    """Drop a request whose client went away, if it has not been dispatched yet (failed
    CANCELLED, reason ``CANCELED``); else tell the worker running it."""
    key = (msg.model, msg.version)
    rkey = (msg.reply_to, msg.request_id)
    ensemble = lifecycle.generation_for(key)
    if ensemble is not None and ensemble.spec.ensemble is not None:
        ensembles.cancel(ensemble, msg, now_ns)
        return
    for gen in lifecycle.generations():
        item = gen.policy.cancel(rkey) if gen.key == key else None
        if item is not None:
            # NOTE: the answer lets the frontend free the request's input block.
            req = cast(Request, item.payload)
            out.fail(req, ErrorCode.CANCELLED, CANCELLED_MESSAGE, now_ns, "CANCELED")
            return
    # NOTE: a request already running (in an instance's batch, or a decoupled one
    # still open): its model may stop early when it sees ``is_cancelled()``; the
    # worker answers it as the model decides.
    instance_id = running_instance(lifecycle.instances, rkey)
    if instance_id is None:
        instance_id = handoffs.waiting_instance(rkey)
    if instance_id is not None:
        out.to_instance(instance_id, msg)
