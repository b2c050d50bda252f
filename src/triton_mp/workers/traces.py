"""What a worker records of the traced requests it runs: the compute stamps, the tensors at
the TENSORS level and the BLS child traces, carried home on the final response.

Imported by ``workers.worker``. Untraced requests (``InferRequest.trace`` None, nearly all)
never reach this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import msgspec
import numpy as np

from triton_mp.common.trace_config import TraceLevel
from triton_mp.ipc.protocol.messages import (
    ChildTrace,
    InferRequest,
    InferResponse,
    ReplyTo,
    TensorRef,
    TensorTrace,
    TraceRecord,
)

Key = tuple[ReplyTo, int]


class Traces:
    """The traces of one worker's requests in execution (or open, decoupled).

    Args:
        decoupled: the model is decoupled (stamps wait for the final response).
        view: a request input's elements (``tensor_io.view_tensor`` over this worker's
            mappings), for TENSORS-level traces.
    """

    def __init__(self, decoupled: bool, view: Callable[[TensorRef], np.ndarray]) -> None:
        self._decoupled = decoupled
        self._view = view
        self.open: dict[Key, list[tuple[str, int]]] = {}
        """The compute stamps of traced requests whose final response has not been sent
        (it carries them)."""
        self._inputs: dict[Key, list[TensorTrace]] = {}
        self.children: dict[Key, list[ChildTrace]] = {}
        """Traced requests in execution: their BLS child traces (``workers.bls.bls_client``)."""

    def begin(self, traced: Iterable[InferRequest], start_ns: int) -> None:
        """COMPUTE_START of each traced request (and room for its BLS child traces)."""
        for r in traced:
            key = (r.reply_to, r.request_id)
            self.open[key] = [("COMPUTE_START", start_ns)]
            self.children[key] = []
            if r.trace is not None and r.trace.level & TraceLevel.TENSORS:
                from triton_mp.ipc.trace_tensors import trace_array

                self._inputs[key] = [
                    trace_array("TENSOR_BACKEND_INPUT", ref.name, np.asarray(self._view(ref)))
                    for ref in r.inputs
                ]

    def computed(self, traced: Iterable[InferRequest], input_end: int, output_start: int) -> None:
        """After ``execute``: COMPUTE_INPUT_END and COMPUTE_OUTPUT_START (``execute``
        returned; the worker writes the outputs from here). A decoupled request still open
        also gets COMPUTE_END (``execute`` returned); the others get it as their response
        is written."""
        now = time.monotonic_ns()
        for r in traced:
            stamps = self.open.get((r.reply_to, r.request_id))
            if stamps is None:
                continue  # NOTE: decoupled, final response already sent during execute
            stamps += [("COMPUTE_INPUT_END", input_end), ("COMPUTE_OUTPUT_START", output_start)]
            if self._decoupled:
                stamps.append(("COMPUTE_END", now))

    def record(
        self,
        msg: InferResponse,
        req: InferRequest,
        stamps: list[tuple[str, int]],
        outputs: dict[str, np.ndarray] | None,
    ) -> InferResponse:
        """``msg`` with the trace record of ``req``: QUEUE_START (the scheduler's), the
        compute stamps, the tensors at the TENSORS level and the BLS child traces."""
        assert req.trace is not None
        key = (req.reply_to, req.request_id)
        if not self._decoupled:
            stamps = [*self.open.pop(key, stamps), ("COMPUTE_END", time.monotonic_ns())]
        tensors: tuple[TensorTrace, ...] = tuple(self._inputs.pop(key, ()))
        if req.trace.level & TraceLevel.TENSORS and outputs is not None:
            from triton_mp.ipc.trace_tensors import trace_array

            tensors += tuple(
                trace_array("TENSOR_BACKEND_OUTPUT", n, np.asarray(a)) for n, a in outputs.items()
            )
        children = tuple(self.children.pop(key, ()))
        record = TraceRecord(
            stamps=(("QUEUE_START", req.trace.queue_ns), *stamps),
            tensors=tensors,
            children=children,
        )
        return msgspec.structs.replace(msg, trace=record)
