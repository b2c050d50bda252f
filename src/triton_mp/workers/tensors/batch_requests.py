"""A batch's requests as the backend takes them: the ``BatchAssign``'s entries decoded, each
request's inputs viewed in shared memory, one ``BackendRequest`` each.

Imported by ``workers.worker``. One loop per batch for each step (the per-request hot path of
a worker): a REQUEST record (bytes, as the scheduler hands the frontend's record on) is
decoded by the C decoder where it is built (``ipc/native/request_decoder.cc``) and takes it,
else by ``ipc.recordio.request_records.RequestDecoder`` (the whole batch's in one call of
the C decoder's ``decode_all`` where it is built); an input of a fixed-size type in an
arena is a numpy view made here (``tensor_io.request_inputs``' hot path), anything else goes
through ``tensor_io``. A batch whose every request is that plain (no client output region)
gets its views and ``BackendRequest`` s in one call of the C twin of that loop where it is
built (``workers/native/batch_gather.cc``), which declines every other batch. A model with
implicit state also gets its state inputs and outputs (``workers.sequence_state``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from triton_mp.backends.base import BackendRequest, Result
from triton_mp.common.errors import TritonMPError
from triton_mp.ipc import SegmentCache
from triton_mp.ipc.protocol.messages import ErrorInfo, InferRequest, TensorRef
from triton_mp.ipc.recordio.request_records import RequestDecoder
from triton_mp.workers.sequence_state import SequenceStates
from triton_mp.workers.tensors.tensor_io import (
    FIXED_DTYPES,
    ClientRegions,
    request_inputs,
    view_tensor,
)

try:
    # NOTE: the C decoder of REQUEST records, configured by request_records' import above;
    # mypy sees the extension only where it is built: either ignore may be unused.
    from triton_mp.ipc import _request_decoder as native_decoder  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # NOTE: not built (setup.py): RequestDecoder decodes in Python
    native_decoder = None  # type: ignore[assignment,unused-ignore]
try:
    # NOTE: the C twin of backend_requests' loop (workers/native/batch_gather.cc; built on
    # numpy's headers); either ignore may be unused, as above.
    from triton_mp.workers import _batch_gather as native_gather  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # NOTE: not built (setup.py): the loop below builds every batch
    native_gather = None  # type: ignore[assignment,unused-ignore]
else:
    native_gather.configure(InferRequest, TensorRef, BackendRequest, FIXED_DTYPES)


class BatchRequests:
    """Turns one instance's batches into backend requests (module docstring).

    Args:
        cache: attached input arenas of the frontends.
        regions: the clients' mapped regions (inputs a request reads from there).
        states: the model's implicit state (None: the model has none).
        origin: the ``ErrorInfo.origin`` of an unreadable input's error.
        native: decode a batch's records in one C call and build plain batches in C where
            the extensions are built (False: the Python loops, the twins; tests).
    """

    __slots__ = (
        "_buf_of",
        "_cache",
        "_decode_all",
        "_decoder",
        "_gather",
        "_native",
        "_origin",
        "_regions",
        "_states",
    )

    def __init__(
        self,
        cache: SegmentCache,
        regions: ClientRegions,
        states: SequenceStates | None,
        origin: str,
        native: bool = True,
    ) -> None:
        self._cache = cache
        self._regions = regions
        self._states = states
        self._origin = origin
        self._decoder = RequestDecoder()
        self._native = native_decoder.decode if native_decoder is not None else None
        # NOTE: an extension built before decode_all has none: the loop decodes.
        self._decode_all = (
            getattr(native_decoder, "decode_all", None)
            if native_decoder is not None and native
            else None
        )
        self._gather = (
            native_gather.backend_requests if native_gather is not None and native else None
        )
        self._buf_of = lambda segment: cache.get(segment).buf

    def decoded(self, entries: tuple[InferRequest | bytes, ...]) -> tuple[InferRequest, ...]:
        """A ``BatchAssign``'s requests, each an ``InferRequest`` (what
        ``records.decoded_batch`` makes of them).

        Raises:
            ValueError: an entry is bytes but no version-2 REQUEST record.
        """
        if self._decode_all is not None:
            # NOTE: the loop below in one C call (ipc/native/request_decoder.cc, decode_all).
            return self._decode_all(entries, self._decoder.decode)  # type: ignore[no-any-return]
        native = self._native
        out = []
        for e in entries:
            if type(e) is bytes:
                req = native(e) if native is not None else None
                out.append(req if req is not None else self._decoder.decode(e))
            else:
                out.append(e)
        return tuple(out)

    def backend_requests(
        self, reqs: tuple[InferRequest, ...], results: list[Result | None]
    ) -> tuple[list[int], list[BackendRequest]]:
        """The batch's requests as the backend takes them, and their indices in ``reqs``.
        A request whose inputs cannot be read (e.g. a vanished client region, an arena
        whose frontend died) gets its error in ``results`` (same length as ``reqs``) and
        fails alone."""
        runnable: list[int] = []
        backend_reqs: list[BackendRequest] = []
        if self._states is not None:
            for i, r in enumerate(reqs):
                try:
                    backend_reqs.append(self._with_state(r))
                    runnable.append(i)
                except TritonMPError as e:
                    results[i] = ErrorInfo(e.code, e.message, self._origin)
            return runnable, backend_reqs
        if self._gather is not None:
            # NOTE: a batch of plain requests (arena inputs of fixed-size types, no client
            # output region) in one C call; None: one is not, and the loop below builds all.
            built = self._gather(reqs, self._buf_of)
            if built is not None:
                return list(range(len(reqs))), built
        cache, regions = self._cache, self._regions
        fixed_of = FIXED_DTYPES
        ndarray = np.ndarray
        # NOTE: segment name -> its mapping, for this batch: SegmentCache.get once per
        # segment (a batch's inputs lie in a few arenas), not once per input.
        bufs: dict[str, Any] = {}
        for i, r in enumerate(reqs):
            try:
                if r.output_regions:
                    inputs = request_inputs(cache, r, regions)
                else:
                    inputs = {}
                    for ref in r.inputs:
                        fixed = fixed_of.get(ref.datatype)
                        if fixed is not None and not ref.region_id:
                            # NOTE: view_tensor's hot path: one call, no copy.
                            buf = bufs.get(ref.segment)
                            if buf is None:
                                buf = bufs[ref.segment] = cache.get(ref.segment).buf
                            inputs[ref.name] = ndarray(ref.shape, fixed, buf, ref.offset)
                        else:
                            inputs[ref.name] = view_tensor(cache, ref, regions)
            except TritonMPError as e:
                results[i] = ErrorInfo(e.code, e.message, self._origin)
                continue
            # NOTE: positional arguments (BackendRequest's field order): the hot path.
            backend_reqs.append(
                BackendRequest(
                    inputs,
                    r.outputs,
                    r.batch_size,
                    r.client_id,
                    r.timeout_us,
                    r.parameters_json,
                    r.sequence_id,
                    r.sequence_flags,
                    r,
                )
            )
            runnable.append(i)
        return runnable, backend_reqs

    def _with_state(self, req: InferRequest) -> BackendRequest:
        """One request of a model with implicit state: its inputs with the state inputs of
        its sequence, its outputs with the state outputs."""
        assert self._states is not None
        inputs = request_inputs(self._cache, req, self._regions)
        inputs.update(self._states.inputs(req.sequence_id, req.sequence_flags))
        outputs = req.outputs + tuple(n for n in self._states.output_names if n not in req.outputs)
        return BackendRequest(
            inputs,
            outputs,
            req.batch_size,
            req.client_id,
            req.timeout_us,
            req.parameters_json,
            req.sequence_id,
            req.sequence_flags,
            req,
        )
