"""The worker process: one model instance, fed batches by the scheduler.

``run_worker`` is the process entry; ``Worker`` is the logic (constructible in-process with
any ``Backend``). Per batch: view each request's inputs in the frontend's arena (no copy),
let the backend gather/run/scatter, write each request's outputs into one block of this
worker's arena (one copy), post an ``InferResponse`` straight to the request's frontend and
a ``BatchDone`` to the scheduler.

Sequence models (``model.sequence`` set; see ``workers.sequence``): the backend also gets a
``SequenceBatch`` (the batch rows of the Direct strategy, with null rows, and the control
tensors), and the worker keeps each sequence's implicit state between its requests: it adds
the state inputs to a request and asks for the state outputs, stores them after the run,
and forgets a sequence's state after its END request or when the scheduler releases it as
idle (``BatchAssign.released``). Other models take exactly the path they took before.

Decoupled models (``model.decoupled``): the backend answers requests itself through
``Worker.respond``, from any thread and after ``execute`` returned, zero or more responses
then a final one per request. Each response is one output block, posted as it is sent; the
instance is idle for the scheduler when ``execute`` returns (``BatchDone``), as in Triton,
and each final response is also reported to the scheduler (``DecoupledDone``), which keeps
the request open until then (cancellation, instance death). Writing and posting responses
is serialised by one lock: the arena allocator and each ring have one producer.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import mmap
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import numpy as np
import posix_ipc

from triton_mp.common.datatypes import (
    NUMPY_DTYPES,
    deserialize_bytes_tensor,
    element_count,
    tensor_wire_bytes,
)
from triton_mp.common.errors import ErrorCode, TritonMPError, flatten_exception
from triton_mp.common.log import configure_logging
from triton_mp.ipc import ArenaAllocator, Inbox, SegmentCache, Sender, encode, free_block
from triton_mp.ipc.codec import Decoder
from triton_mp.ipc.messages import (
    BatchAssign,
    BatchDone,
    BlockRef,
    BlsWorkerUpdate,
    CancelRequest,
    DecoupledDone,
    ErrorInfo,
    InferRequest,
    InferResponse,
    OutputRegion,
    SequenceFlags,
    Shutdown,
    TensorRef,
    ToWorker,
    WorkerReady,
)
from triton_mp.ipc.shm import Segment, client_object_refusal
from triton_mp.ipc.specs import WorkerSpec
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, align
from triton_mp.workers.backend import (
    Backend,
    BackendRequest,
    Responded,
    Result,
    SequenceBatch,
)
from triton_mp.workers.registry import load_backend
from triton_mp.workers.sequence import SequenceStates, sequence_batch

log = logging.getLogger(__name__)


class ClientRegions:
    """The worker's mappings of clients' registered system shared memory.

    Keyed by (key, registration id), so a client that re-creates an object under the same key
    and registers it again gets a fresh mapping. Inputs are mapped read-only, outputs
    read-write. At most ``capacity`` objects stay mapped (least recently used go first).

    NOTE: touching a mapping beyond the end of an object the client has since truncated
    raises SIGBUS, which no Python code can catch. Every use re-checks the object's current
    size (``fstat`` on a descriptor kept open) and fails that request instead; a truncation
    racing with a running batch can still kill the worker, which the supervisor restarts.
    """

    def __init__(self, capacity: int = 64) -> None:
        self._maps: collections.OrderedDict[tuple[str, int, bool], tuple[mmap.mmap, int]] = (
            collections.OrderedDict()
        )
        self._capacity = capacity

    def window(
        self, key: str, region_id: int, writable: bool, offset: int, nbytes: int, what: str
    ) -> mmap.mmap:
        """The mapped object, after checking ``[offset, offset + nbytes)`` lies inside it now.

        Raises:
            TritonMPError (INVALID_ARG): the client's object is gone, inaccessible, or
                smaller than the window (``what`` names the tensor in the message).
        """
        k = (key, region_id, writable)
        entry = self._maps.get(k)
        if entry is None:
            entry = self._map(key, writable)
            self._maps[k] = entry
            while len(self._maps) > self._capacity:
                _, (old_buf, old_fd) = self._maps.popitem(last=False)
                _close(old_buf, old_fd)
        else:
            self._maps.move_to_end(k)
        buf, fd = entry
        size = os.fstat(fd).st_size
        if offset + nbytes > min(size, len(buf)):
            raise TritonMPError(
                f"{what}: shared memory object '{key}' is {size} bytes now, smaller than the "
                f"registered window ending at byte {offset + nbytes}",
                ErrorCode.INVALID_ARG,
            )
        return buf

    @staticmethod
    def _map(key: str, writable: bool) -> tuple[mmap.mmap, int]:
        try:
            obj = posix_ipc.SharedMemory(key, read_only=not writable)
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError, ValueError) as e:
            raise TritonMPError(
                f"Unable to map shared memory object '{key}' of a registered region: {e}",
                ErrorCode.INVALID_ARG,
            ) from None
        fd = obj.fd
        try:
            st = os.fstat(fd)
            # NOTE: re-checked here: the client may have replaced the object under the
            # same key since the frontend checked the registration.
            # NOTE: the supervisor is the parent, and its pid names this server's objects.
            refusal = client_object_refusal(key, st.st_uid, str(os.getppid()))
            if refusal is not None:
                os.close(fd)
                raise TritonMPError(
                    f"Unable to map shared memory object '{key}' of a registered region: {refusal}",
                    ErrorCode.INVALID_ARG,
                )
            size = st.st_size
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            return mmap.mmap(fd, size, prot=prot), fd
        except (OSError, ValueError) as e:
            os.close(fd)
            raise TritonMPError(
                f"Unable to map shared memory object '{key}' of a registered region: {e}",
                ErrorCode.INVALID_ARG,
            ) from None

    def close(self) -> None:
        """Unmap everything."""
        for buf, fd in self._maps.values():
            _close(buf, fd)
        self._maps.clear()


def _close(buf: mmap.mmap, fd: int) -> None:
    # NOTE: numpy views may still export the mapping; the OS unmaps it at exit then.
    with contextlib.suppress(BufferError):
        buf.close()
    os.close(fd)


def view_tensor(cache: SegmentCache, ref: TensorRef, regions: ClientRegions) -> np.ndarray:
    """A numpy array over a tensor in shared memory (no copy for fixed-size types).

    Raises:
        TritonMPError (INVALID_ARG): a client region is gone, or smaller than the tensor.
    """
    buf: mmap.mmap
    if ref.region_id:
        buf = regions.window(
            ref.segment, ref.region_id, False, ref.offset, ref.nbytes, f"input '{ref.name}'"
        )
    else:
        buf = cache.get(ref.segment).buf
    if ref.datatype == "BYTES":
        return deserialize_bytes_tensor(
            memoryview(buf)[ref.offset : ref.offset + ref.nbytes], ref.shape
        )
    dtype = NUMPY_DTYPES[ref.datatype]
    count = element_count(ref.shape)
    return np.frombuffer(buf, dtype=dtype, count=count, offset=ref.offset).reshape(ref.shape)


class Worker:
    """Runs batches on one backend and writes responses (process-agnostic logic).

    Args:
        spec: this instance's spec.
        backend: the loaded backend.
        arena: this worker's output arena allocator.
        cache: attached input arenas of the frontends.
        send_frontend: ``send_frontend(frontend_id, message)``.
        send_scheduler: ``send_scheduler(message)``.

    Raises (from the constructor):
        ConfigError: the model's initial implicit state cannot be made (an unreadable or
            wrongly sized ``initial_state`` data file).
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
        self._regions = ClientRegions()
        self._sequence = spec.model.sequence
        self._states = SequenceStates.for_model(spec.model)
        self._decoupled = spec.model.decoupled
        self._post_lock = threading.RLock()
        self.post_lock = self._post_lock
        """Serialises this process's arena allocations and ring pushes (BLS shares it)."""
        self._cancelled: set[tuple[int, int]] = set()
        """(frontend id, request id) of open decoupled requests whose client went away."""
        bind = getattr(backend, "bind_responder", None)
        if bind is not None:
            bind(self.respond, self.is_cancelled)

    def respond(
        self, token: object, result: dict[str, np.ndarray] | ErrorInfo | None, final: bool
    ) -> None:
        """Send one response of a request now (``workers.backend.Responder``); thread-safe.

        Args:
            token: the request's ``InferRequest`` (``BackendRequest.token``).
            result: outputs, an error, or None for a flags-only final response.
            final: no more responses follow for the request.

        Raises:
            TritonMPError: the outputs cannot be written (nothing was sent; the request is
                still open).
        """
        req = token
        assert isinstance(req, InferRequest)
        with self._post_lock:
            if isinstance(result, dict):
                msg = self._write_outputs(req, result, final)
            elif result is None:
                msg = InferResponse(
                    request_id=req.request_id, version=req.version, final=final, empty=True
                )
            else:
                msg = InferResponse(
                    request_id=req.request_id, version=req.version, error=result, final=final
                )
            self._post(req, msg)

    def is_cancelled(self, token: object) -> bool:
        """Whether the client of an open decoupled request went away (cheap; thread-safe)."""
        req = token
        assert isinstance(req, InferRequest)
        return (req.frontend_id, req.request_id) in self._cancelled

    def cancel(self, msg: CancelRequest) -> None:
        """The scheduler forwarded the cancellation of an open decoupled request."""
        self._cancelled.add((msg.frontend_id, msg.request_id))

    def _post(self, req: InferRequest, msg: InferResponse) -> bool:
        """Send a response to its frontend (lock held); False when it could not be sent
        (its output block is freed then)."""
        ok = True
        try:
            self._send_frontend(req.frontend_id, msg)
        except Exception:  # noqa: BLE001 - one unreachable frontend must not stall the others
            log.exception(
                "could not answer request %d of frontend %d", req.request_id, req.frontend_id
            )
            if msg.block is not None:
                free_block(self._arena_segment(msg.block.segment).buf, msg.block.offset)
            ok = False
        if self._decoupled and msg.final:
            key = (req.frontend_id, req.request_id)
            self._cancelled.discard(key)
            try:
                self._send_scheduler(
                    DecoupledDone(
                        instance_id=self._spec.instance.instance_id,
                        frontend_id=key[0],
                        request_id=key[1],
                    )
                )
            except Exception:  # noqa: BLE001 - the scheduler's death stops the server anyway
                log.exception("could not report the end of request %d", req.request_id)
        return ok

    def run_batch(self, batch: BatchAssign) -> None:
        """Execute one batch and answer every request in it."""
        start_ns = time.monotonic_ns()
        reqs = batch.requests
        if log.isEnabledFor(logging.DEBUG):
            log.debug("batch %d started: %d requests", batch.batch_id, len(reqs))
        results: list[Result | None] = [None] * len(reqs)
        t_input = t_infer = 0
        runnable: list[int] = []
        backend_reqs: list[BackendRequest] = []
        if self._states is not None and batch.released:
            # NOTE: before this batch's requests take their state: one of them may START a
            # new sequence under a released ID.
            self._states.drop(batch.released)
        for i, r in enumerate(reqs):
            try:
                backend_reqs.append(self._backend_request(r))
                runnable.append(i)
            except TritonMPError as e:
                # NOTE: one request's unreadable input (e.g. a vanished client region)
                # fails that request only.
                results[i] = ErrorInfo(e.code, e.message, self._origin)
        try:
            if backend_reqs:
                if self._sequence is None:
                    ran, times = self._backend.execute(backend_reqs)
                else:
                    ran, times = self._backend.execute(
                        backend_reqs, self._sequence_batch(batch, runnable, backend_reqs)
                    )
                t_input, t_infer = times.compute_input_ns, times.compute_infer_ns
                if len(ran) != len(backend_reqs):
                    raise TritonMPError(
                        f"backend returned {len(ran)} results for a batch of "
                        f"{len(backend_reqs)} requests"
                    )
                for i, res in zip(runnable, ran, strict=True):
                    results[i] = res
        except Exception as exc:  # noqa: BLE001 - one failed batch must not stop the worker
            log.exception("batch %d failed", batch.batch_id)
            info = ErrorInfo(ErrorCode.INTERNAL, flatten_exception(exc), self._origin)
            for i in runnable:
                results[i] = info
        if self._states is not None:
            self._keep_states(reqs, results)
        t0 = time.perf_counter_ns()
        failed = []
        missing = ErrorInfo(ErrorCode.INTERNAL, "no result for the request", self._origin)
        final = [missing if r is None else r for r in results]
        for i, (req, res) in enumerate(zip(reqs, final, strict=True)):
            if isinstance(res, Responded):
                continue
            with self._post_lock:
                if isinstance(res, dict):
                    try:
                        msg = self._write_outputs(req, res)
                    except TritonMPError as exc:
                        res = ErrorInfo(exc.code, exc.message, self._origin)
                    except Exception as exc:  # noqa: BLE001
                        res = ErrorInfo(ErrorCode.INTERNAL, flatten_exception(exc), self._origin)
                if not isinstance(res, dict):
                    failed.append(i)
                    msg = InferResponse(request_id=req.request_id, version=req.version, error=res)
                if not self._post(req, msg) and i not in failed:
                    failed.append(i)
        t_output = time.perf_counter_ns() - t0
        # NOTE: under the lock: response threads of decoupled models share the ring.
        with self._post_lock:
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

    def close(self) -> None:
        """Unmap the clients' regions."""
        self._regions.close()

    def _sequence_batch(
        self, batch: BatchAssign, runnable: list[int], backend_reqs: list[BackendRequest]
    ) -> SequenceBatch:
        """The batch rows of the requests that reach the backend (a request that failed
        before leaves a null row in the Direct strategy) and the control tensors.

        Raises:
            TritonMPError (INTERNAL): ``batch.slots`` does not fit ``batch.requests``.
        """
        slots: tuple[int, ...] = ()
        if batch.rows:
            if len(batch.slots) != len(batch.requests):
                raise TritonMPError(
                    f"batch {batch.batch_id} has {len(batch.requests)} requests but "
                    f"{len(batch.slots)} slots"
                )
            slots = tuple(batch.slots[i] for i in runnable)
        return sequence_batch(self._spec.model, backend_reqs, batch.rows, slots)

    def _keep_states(self, reqs: tuple[InferRequest, ...], results: list[Result | None]) -> None:
        """After a run: store each request's state outputs as its sequence's next state
        inputs; forget the sequence after an END request (whether it succeeded or not).
        A request whose state outputs are missing fails."""
        assert self._states is not None
        for i, req in enumerate(reqs):
            res = results[i]
            if req.sequence_flags & SequenceFlags.END:
                self._states.drop((req.sequence_id,))
            elif isinstance(res, dict):
                try:
                    self._states.update(req.sequence_id, res)
                except TritonMPError as e:
                    results[i] = ErrorInfo(e.code, e.message, self._origin)

    def _arena_segment(self, name: str) -> Segment:
        return next(s for s in self._arena.segments() if s.name == name)

    def _backend_request(self, req: InferRequest) -> BackendRequest:
        inputs = {ref.name: view_tensor(self._cache, ref, self._regions) for ref in req.inputs}
        outputs = req.outputs
        if self._states is not None:
            inputs.update(self._states.inputs(req.sequence_id, req.sequence_flags))
            outputs += tuple(n for n in self._states.output_names if n not in outputs)
        # NOTE: positional arguments (BackendRequest's field order): the per-request hot path.
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

    def _write_outputs(
        self, req: InferRequest, outputs: dict[str, np.ndarray], final: bool = True
    ) -> InferResponse:
        """Write one request's outputs: into the client's registered shared memory where the
        request asked for it, the rest into one block of this worker's arena (one copy each).

        Raises:
            TritonMPError: a missing output, or a client region too small for its output.
        """
        parts: list[tuple[str, str, tuple[int, ...], memoryview, OutputRegion | None]] = []
        total = 0
        regions = req.output_regions or (None,) * len(req.outputs)
        for name, region in zip(req.outputs, regions, strict=True):
            arr = outputs.get(name)
            if arr is None:
                raise TritonMPError(f"output '{name}' was not produced by model '{req.model}'")
            datatype, data = tensor_wire_bytes(arr)
            if region is not None and len(data) > region.byte_size:
                raise TritonMPError(
                    f"shared memory size specified with the request for output '{name}' "
                    f"({region.byte_size} bytes) should be at least {len(data)} bytes to hold "
                    "the results",
                    ErrorCode.INVALID_ARG,
                )
            parts.append((name, datatype, tuple(int(d) for d in arr.shape), data, region))
            if region is None:
                total += align(len(data))
        block_ref = None
        refs = []
        mv = None
        pos = 0
        if any(p[4] is None for p in parts):
            seg, block = self._arena.alloc(total)
            block_ref = BlockRef(seg.name, block)
            mv = memoryview(seg.buf)
            pos = block + BLOCK_HEADER_BYTES
        for name, datatype, shape, data, region in parts:
            n = len(data)
            if region is not None:
                dest = self._regions.window(
                    region.key,
                    region.region_id,
                    True,
                    region.offset,
                    n,
                    f"output '{name}' (region '{region.region_name}')",
                )
                dest[region.offset : region.offset + n] = data
                refs.append(
                    TensorRef(name, datatype, shape, region.key, region.offset, n, region.region_id)
                )
                continue
            assert mv is not None
            assert block_ref is not None
            mv[pos : pos + n] = data
            refs.append(TensorRef(name, datatype, shape, block_ref.segment, pos, n))
            pos += align(n)
        if mv is not None:
            mv.release()
        return InferResponse(
            request_id=req.request_id,
            version=req.version,
            outputs=tuple(refs),
            block=block_ref,
            final=final,
        )


def _apply_bls_update(msg: BlsWorkerUpdate, senders: dict[int, Sender]) -> None:
    """Open this worker's rings to new BLS clients and close those to stopped ones."""
    for c in msg.add_clients:
        if c.client_id in senders:
            continue
        try:
            senders[c.client_id] = Sender(c.ring, c.wakeup)
        except (posix_ipc.ExistentialError, OSError, ValueError):
            # NOTE: a restarted worker may replay an update whose client is gone already.
            log.debug("BLS client %d is gone; not wiring it", c.client_id)
    for cid in msg.remove_clients:
        sender = senders.pop(cid, None)
        if sender is not None:
            sender.close()


def run_worker(spec_bytes: bytes, ready: Connection) -> int:
    """Process entry of a worker.

    Args:
        spec_bytes: a msgpack-encoded ``WorkerSpec``.
        ready: receives ``b"ready"`` once the backend is loaded, or ``b"error:<text>"``.

    Returns:
        The process exit status: 0 after Shutdown, 1 when the backend failed to load.
    """
    spec: WorkerSpec = Decoder(WorkerSpec).decode(spec_bytes)
    configure_logging(
        "worker", spec.instance.name, spec.log.verbose, spec.log.format, model=spec.model.model
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inbox: Inbox[ToWorker] = Inbox(spec.inbox.wakeup, spec.inbox.rings, ToWorker)
    # NOTE: a restarted instance must not run batches its dead predecessor left behind:
    # the scheduler has already failed them. BLS updates still count (the spec it started
    # from may predate them).
    rewiring = [m for m in inbox.drain() if isinstance(m, BlsWorkerUpdate)]
    to_scheduler = Sender(spec.to_scheduler.ring, spec.to_scheduler.wakeup)
    to_frontends = {i: Sender(c.ring, c.wakeup) for i, c in spec.to_frontends.items()}
    arena = ArenaAllocator(
        f"{spec.arena_prefix}p{os.getpid()}", spec.arena_bytes, spec.arena_budget_bytes
    )
    log.info(
        "loading model '%s' version %d (%s backend)",
        spec.model.model,
        spec.model.version,
        spec.model.backend,
    )
    cache = SegmentCache()
    try:
        backend = load_backend(spec.model, spec.instance)
        try:
            # NOTE: constructing the Worker reads the initial implicit state: part of loading.
            worker = Worker(
                spec,
                backend,
                arena,
                cache,
                lambda fid, msg: to_frontends[fid].send_bytes(encode(msg)),
                lambda msg: to_scheduler.send_bytes(encode(msg)),
            )
        except BaseException:
            backend.close()
            raise
    except Exception as exc:  # noqa: BLE001 - reported to the supervisor, which marks the model
        text = exc.message if isinstance(exc, TritonMPError) else flatten_exception(exc)
        log.error("failed to load model '%s': %s", spec.model.model, text)
        ready.send_bytes(b"error:" + text.encode())
        cache.close()
        return 1
    bls = None
    if spec.bls is not None:
        from triton_mp.workers import pb_utils
        from triton_mp.workers.bls import BlsClient

        bls = BlsClient(
            spec.bls,
            spec.model.model,
            arena,
            cache,
            lambda msg: to_scheduler.send_bytes(encode(msg)),
            worker.post_lock,
        )
        pb_utils.set_bls(bls.submit)

    def rewire(msg: BlsWorkerUpdate) -> None:
        with worker.post_lock:
            _apply_bls_update(msg, to_frontends)
        if bls is not None and msg.models is not None:
            bls.set_models(msg.seq, msg.models)

    for update in rewiring:
        rewire(update)
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
                elif isinstance(msg, CancelRequest):
                    worker.cancel(msg)
                elif isinstance(msg, BlsWorkerUpdate):
                    rewire(msg)
            if stop:
                break
    finally:
        backend.close()
        worker.close()
        cache.close()
        arena.close_and_unlink()
    log.info("instance stopped")
    return 0
