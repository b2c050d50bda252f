"""The worker process: one model instance, fed batches by the scheduler.

``run_worker`` is the process entry; ``Worker`` is the logic (constructible in-process with
any ``Backend``). Per batch: view each request's inputs in the frontend's arena (no copy),
let the backend gather/run/scatter, write each request's outputs into one block of this
worker's arena (one copy), post an ``InferResponse`` straight to the request's frontend and
a ``BatchDone`` to the scheduler.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection

import numpy as np

from triton_mp.config import WorkerSpec
from triton_mp.dtypes import (
    NUMPY_DTYPES,
    deserialize_bytes_tensor,
    element_count,
    protocol_of,
    serialize_bytes_tensor,
)
from triton_mp.errors import ErrorCode, TritonMPError, flatten_exception
from triton_mp.ipc import ArenaAllocator, Inbox, SegmentCache, Sender, encode, free_block
from triton_mp.ipc.codec import Decoder
from triton_mp.ipc.messages import (
    BatchAssign,
    BatchDone,
    BlockRef,
    ErrorInfo,
    InferRequest,
    InferResponse,
    Shutdown,
    TensorRef,
    ToWorker,
    WorkerReady,
)
from triton_mp.ipc.shm import Segment
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES
from triton_mp.log import configure_logging
from triton_mp.workers.backend import Backend, BackendRequest, Result
from triton_mp.workers.registry import load_backend

log = logging.getLogger(__name__)

_ALIGN = 64


def view_tensor(cache: SegmentCache, ref: TensorRef) -> np.ndarray:
    """A numpy array over a tensor in shared memory (no copy for fixed-size types)."""
    seg = cache.get(ref.segment)
    if ref.datatype == "BYTES":
        return deserialize_bytes_tensor(
            memoryview(seg.buf)[ref.offset : ref.offset + ref.nbytes], ref.shape
        )
    dtype = NUMPY_DTYPES[ref.datatype]
    count = element_count(ref.shape)
    return np.frombuffer(seg.buf, dtype=dtype, count=count, offset=ref.offset).reshape(ref.shape)


class Worker:
    """Runs batches on one backend and writes responses (process-agnostic logic).

    Args:
        spec: this instance's spec.
        backend: the loaded backend.
        arena: this worker's output arena allocator.
        cache: attached input arenas of the frontends.
        send_frontend: ``send_frontend(frontend_id, message)``.
        send_scheduler: ``send_scheduler(message)``.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        backend: Backend,
        arena: ArenaAllocator,
        cache: SegmentCache,
        send_frontend: Callable[[int, object], None],
        send_scheduler: Callable[[object], None],
    ) -> None:
        self._spec = spec
        self._backend = backend
        self._arena = arena
        self._cache = cache
        self._send_frontend = send_frontend
        self._send_scheduler = send_scheduler
        self._origin = f"worker {spec.instance.name}"

    def run_batch(self, batch: BatchAssign) -> None:
        """Execute one batch and answer every request in it."""
        start_ns = time.monotonic_ns()
        reqs = batch.requests
        if log.isEnabledFor(logging.DEBUG):
            log.debug("batch %d started: %d requests", batch.batch_id, len(reqs))
        results: Sequence[Result]
        t_input = t_infer = 0
        try:
            backend_reqs = [self._backend_request(r) for r in reqs]
            results, times = self._backend.execute(backend_reqs)
            t_input, t_infer = times.compute_input_ns, times.compute_infer_ns
            if len(results) != len(reqs):
                raise TritonMPError(
                    f"backend returned {len(results)} results for a batch of {len(reqs)} requests"
                )
        except Exception as exc:  # noqa: BLE001 - one failed batch must not stop the worker
            log.exception("batch %d failed", batch.batch_id)
            info = ErrorInfo(ErrorCode.INTERNAL, flatten_exception(exc), self._origin)
            results = [info] * len(reqs)
        t0 = time.perf_counter_ns()
        failed = []
        for i, (req, res) in enumerate(zip(reqs, results, strict=True)):
            if isinstance(res, dict):
                try:
                    msg = self._write_outputs(req, res)
                except Exception as exc:  # noqa: BLE001
                    code = exc.code if isinstance(exc, TritonMPError) else ErrorCode.INTERNAL
                    res = ErrorInfo(code, flatten_exception(exc), self._origin)
            if not isinstance(res, dict):
                failed.append(i)
                msg = InferResponse(request_id=req.request_id, version=req.version, error=res)
            try:
                self._send_frontend(req.frontend_id, msg)
            except Exception:  # noqa: BLE001 - one unreachable frontend must not stall the batch
                log.exception(
                    "could not answer request %d of frontend %d", req.request_id, req.frontend_id
                )
                if msg.block is not None:
                    free_block(self._arena_segment(msg.block.segment).buf, msg.block.offset)
                if i not in failed:
                    failed.append(i)
        t_output = time.perf_counter_ns() - t0
        self._send_scheduler(
            BatchDone(
                instance_id=self._spec.instance.instance_id,
                batch_id=batch.batch_id,
                start_ns=start_ns,
                compute_input_ns=t_input,
                compute_infer_ns=t_infer,
                compute_output_ns=t_output,
                end_ns=time.monotonic_ns(),
                failed=tuple(failed),
            )
        )

    def _arena_segment(self, name: str) -> Segment:
        return next(s for s in self._arena.segments() if s.name == name)

    def _backend_request(self, req: InferRequest) -> BackendRequest:
        inputs = {ref.name: view_tensor(self._cache, ref) for ref in req.inputs}
        return BackendRequest(inputs=inputs, outputs=req.outputs, batch_size=req.batch_size)

    def _write_outputs(self, req: InferRequest, outputs: dict[str, np.ndarray]) -> InferResponse:
        """Copy one request's outputs into one block of this worker's arena."""
        parts: list[tuple[str, str, tuple[int, ...], memoryview]] = []
        total = 0
        for name in req.outputs:
            arr = outputs.get(name)
            if arr is None:
                raise TritonMPError(f"output '{name}' was not produced by model '{req.model}'")
            datatype = protocol_of(arr.dtype)
            if datatype == "BYTES":
                data = memoryview(serialize_bytes_tensor(arr))
            else:
                arr = np.ascontiguousarray(arr)
                data = arr.reshape(-1).view(np.uint8).data if arr.nbytes else memoryview(b"")
            parts.append((name, datatype, tuple(int(d) for d in arr.shape), data))
            total += (len(data) + _ALIGN - 1) & ~(_ALIGN - 1)
        seg, block = self._arena.alloc(total)
        mv = memoryview(seg.buf)
        pos = block + BLOCK_HEADER_BYTES
        refs = []
        for name, datatype, shape, data in parts:
            n = len(data)
            mv[pos : pos + n] = data
            refs.append(TensorRef(name, datatype, shape, seg.name, pos, n))
            pos += (n + _ALIGN - 1) & ~(_ALIGN - 1)
        mv.release()
        return InferResponse(
            request_id=req.request_id,
            version=req.version,
            outputs=tuple(refs),
            block=BlockRef(seg.name, block),
        )


def run_worker(spec_bytes: bytes, ready: Connection) -> int:
    """Process entry of a worker.

    Args:
        spec_bytes: a msgpack-encoded ``WorkerSpec``.
        ready: receives ``b"ready"`` once the backend is loaded, or ``b"error:<text>"``.

    Returns:
        The process exit status: 0 after Shutdown, 1 when the backend failed to load.
    """
    spec: WorkerSpec = Decoder(WorkerSpec).decode(spec_bytes)
    configure_logging("worker", spec.instance.name, spec.log.verbose, spec.log.format)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inbox: Inbox[ToWorker] = Inbox(spec.inbox.wakeup, spec.inbox.rings, ToWorker)
    # NOTE: a restarted instance must not run batches its dead predecessor left behind:
    # the scheduler has already failed them.
    inbox.drain()
    to_scheduler = Sender(spec.to_scheduler.ring, spec.to_scheduler.wakeup)
    to_frontends = {i: Sender(c.ring, c.wakeup) for i, c in spec.to_frontends.items()}
    arena = ArenaAllocator(
        f"{spec.arena_prefix}p{os.getpid()}", spec.arena_bytes, spec.arena_budget_bytes
    )
    try:
        backend = load_backend(spec.model, spec.instance)
    except Exception as exc:  # noqa: BLE001 - reported to the supervisor, which marks the model
        text = exc.message if isinstance(exc, TritonMPError) else flatten_exception(exc)
        log.error("failed to load model '%s': %s", spec.model.model, text)
        ready.send_bytes(b"error:" + text.encode())
        return 1
    cache = SegmentCache()
    worker = Worker(
        spec,
        backend,
        arena,
        cache,
        lambda fid, msg: to_frontends[fid].send_bytes(encode(msg)),
        lambda msg: to_scheduler.send_bytes(encode(msg)),
    )
    ready.send_bytes(b"ready")
    to_scheduler.send(WorkerReady(instance_id=spec.instance.instance_id, pid=os.getpid()))
    log.info("instance ready")
    try:
        while True:
            inbox.wait(None)
            stop = False
            for msg in inbox.drain():
                if isinstance(msg, Shutdown):
                    stop = True
                elif isinstance(msg, BatchAssign):
                    worker.run_batch(msg)
            if stop:
                break
    finally:
        backend.close()
        cache.close()
        arena.close_and_unlink()
    log.info("instance stopped")
    return 0
