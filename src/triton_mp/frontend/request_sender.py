"""Sending a validated request to the scheduler, or handing it to an idle instance.

Imported by ``frontend.inference`` (its ``Inference`` submits through one ``RequestSender``).
A request that passed validation and has its inputs in the arena becomes an
``InferRequest`` descriptor (or a known request's record patched from its form's template,
``frontend.dispatch.known_records``), stamped with its arrival time, and goes to an idle
instance of its version when the scheduler offers one (``frontend.dispatch.direct``), else
on the ring to the scheduler; a send that fails forgets the request in the pending table.
Cancellations take the same ring.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from triton_mp.common.errors import InvalidRequest, TritonMPError
from triton_mp.frontend.dispatch import known_records
from triton_mp.frontend.dispatch.direct import DirectRoutes
from triton_mp.frontend.dispatch.known_records import Form, Template, keep
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.tracing.tracer import Trace
from triton_mp.frontend.validation.request import ValidRequest, request_prefix
from triton_mp.ipc import BlockRef, TensorRef, encode
from triton_mp.ipc.memory.ring import RecordTooLarge
from triton_mp.ipc.protocol.messages import CancelRequest, InferRequest, ReplyTo
from triton_mp.ipc.recordio.records import encode_request

log = logging.getLogger("triton_mp.frontend.inference")
"""The accepted-request DEBUG line keeps the logger it always had."""


def _start_trace(trace: Trace, valid: ValidRequest, arrival_ns: int) -> None:
    """REQUEST_START (the request is accepted) and, at the TENSORS level, every input as
    it entered the server (TENSOR_QUEUE_INPUT)."""
    trace.version = valid.version
    trace.stamp("REQUEST_START", arrival_ns)
    if trace.tensors_level:
        from triton_mp.ipc.trace_tensors import trace_bytes

        for i in valid.inputs:
            if i.window is None:
                trace.tensors.append(
                    trace_bytes("TENSOR_QUEUE_INPUT", i.name, i.datatype, i.shape, i.data)
                )


class RequestSender:
    """The way out of the frontend for accepted requests and their cancellations.

    Args:
        reply_to: this frontend, as every descriptor names it.
        pending: the table of requests waiting for answers (a failed send forgets its
            request there).
        send: pushes encoded bytes to the scheduler with the request's quiet-word bit or
            None (``HeldWakes.send``); raises TritonMPError UNAVAILABLE when the ring stays
            full, ``RecordTooLarge`` for an oversized record.
        clock_ns: the monotonic clock stamping ``arrival_ns``.
        direct: the routes to idle instances; None hands nothing directly.
    """

    def __init__(
        self,
        reply_to: ReplyTo,
        pending: PendingTable,
        send: Callable[[bytes, int | None], None],
        clock_ns: Callable[[], int],
        direct: DirectRoutes | None,
    ) -> None:
        self._reply_to = reply_to
        self._pending = pending
        self._send = send
        self._clock_ns = clock_ns
        self._direct = direct

    def hand(self, rid: int, valid: ValidRequest, wire: InferRequest | bytes) -> bool:
        """Hand request ``rid`` (``wire``: its REQUEST record or its message) to an idle
        instance of its version when the scheduler offers one (``dispatch.direct``); False:
        the caller sends it to the scheduler. Raises TritonMPError (a ring stayed full) after
        forgetting the request."""
        direct = self._direct
        if direct is None:
            return False
        try:
            return direct.hand(valid.model.name, valid.version, rid, wire)
        except TritonMPError:
            self._pending.forget_request(rid)
            raise

    def _descriptor(
        self,
        rid: int,
        client_id: str,
        valid: ValidRequest,
        block: BlockRef,
        refs: tuple[TensorRef, ...],
        arrival_ns: int,
        trace: Trace | None,
    ) -> InferRequest:
        """The request's descriptor for the scheduler and the worker."""
        return InferRequest(
            request_id=rid,
            reply_to=self._reply_to,
            model=valid.model.name,
            version=valid.version,
            batch_size=valid.batch_size,
            inputs=refs,
            outputs=valid.outputs,
            block=block,
            arrival_ns=arrival_ns,
            priority=valid.priority,
            timeout_us=valid.timeout_us,
            client_id=client_id,
            output_regions=valid.output_regions,
            parameters_json=valid.parameters_json,
            sequence_id=valid.sequence_id,
            sequence_flags=valid.sequence_flags,
            trace=None if trace is None else trace.context(),
        )

    def send(
        self,
        rid: int,
        client_id: str,
        valid: ValidRequest,
        block: BlockRef,
        refs: tuple[TensorRef, ...],
        trace: Trace | None = None,
        templates: dict[Form, Template] | None = None,
    ) -> None:
        """Send the request's descriptor to the scheduler (or hand it to an idle instance).

        Args:
            templates: a known request's record templates (``dispatch.known_records``):
                its record is patched from its form's, or kept as its form's.
        """
        arrival_ns = self._clock_ns()
        if trace is not None:
            _start_trace(trace, valid, arrival_ns)
        form = (block.segment, client_id)
        template = None if templates is None or trace else templates.get(form)
        bit = None if template is None else template[1]
        wire: InferRequest | bytes
        if template is not None:
            data = wire = known_records.patched(template[0], rid, arrival_ns, block, refs)
        else:
            desc = self._descriptor(rid, client_id, valid, block, refs, arrival_ns, trace)
            record = encode_request(desc)
            if record is not None and templates is not None and trace is None:
                keep(templates, form, record)
            data = record or encode(desc)
            wire = record or desc
        if trace is None and self.hand(rid, valid, wire):
            return  # NOTE: handed to an idle instance of its version (``dispatch.direct``)
        self.push(rid, client_id, valid, data, bit)

    def push(
        self, rid: int, client_id: str, valid: ValidRequest, data: bytes, bit: int | None
    ) -> None:
        """Send request ``rid``'s record (``data``; ``bit``: its quiet-word bit when known,
        ``HeldWakes.send``) to the scheduler; forget the request when that fails. Raises
        TritonMPError: UNAVAILABLE when the ring stays full, INVALID_ARG for a record over
        the ring's limit (``RecordTooLarge``)."""
        try:
            self._send(data, bit)
        except TritonMPError:
            self._pending.forget_request(rid)
            raise
        except RecordTooLarge:
            self._pending.forget_request(rid)
            raise InvalidRequest(
                f"{request_prefix(client_id)}request of {len(data)} bytes "
                "without its tensors (its id and parameters) exceeds the server's limit for "
                f"model '{valid.model.name}' (half of --ring-bytes); send large data as input "
                "tensors"
            ) from None
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request %d accepted for '%s' version %d (batch size %d)",
                rid,
                valid.model.name,
                valid.version,
                valid.batch_size,
            )

    def cancel(self, rid: int, model: str, version: int) -> None:
        """Tell the scheduler to drop request ``rid`` (a queued one is never run)."""
        cancel = CancelRequest(
            request_id=rid, reply_to=self._reply_to, model=model, version=version
        )
        with contextlib.suppress(TritonMPError):
            self._send(encode(cancel), None)
