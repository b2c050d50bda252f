"""Every message that crosses a process boundary, as frozen tagged msgspec structs.

Imported by every role through ``triton_mp.ipc``. Each channel direction has one union and
its decoder is typed to that union (``ipc.recordio.codec``); nothing is pickled. Payload bytes never
travel in these messages: tensors are referenced by ``TensorRef`` into shared-memory arenas
(``ipc.tensor_pool``).

Channels (producer -> consumer):

- ``ToScheduler``: frontends (``InferRequest``, ``CancelRequest``, ``StatsQuery``,
  ``QueueQuery``), python workers' BLS clients (``InferRequest``, ``CancelRequest``),
  workers (``WorkerReady``, ``BatchDone``, ``DecoupledDone``, ``InferResponse``: ensembles)
  and the supervisor (``WorkerDied``, ``Shutdown``, the model changes ``InstancesAdded``,
  ``VersionsActivated``, ``InstancesRetired``, ``InstancesRegrouped``, ``InstancesRemoved``:
  ``ipc.protocol.change_messages``).
- ``ToWorker``: the scheduler (``BatchAssign``, ``BatchDue``, ``CancelRequest``, ``Shutdown``)
  and, on its own control ring, the supervisor (``BlsWorkerUpdate``).
- ``ToFrontend``: workers (``InferResponse``, ``AnswerBatch``), the scheduler
  (``RequestFailed``, ``StatsReply``, ``QueueReply``, ``ModelAvailability``) and the other
  frontends (``ShmRegistered``, ``ShmUnregistered``, ``ShmApplied``: ``ipc.protocol.shm_messages``;
  ``TraceSettingUpdate``).
- ``ToBlsClient``: a python worker's BLS client: answers from workers and the scheduler, and
  on its own control ring the supervisor's ``BlsInboxUpdate``.
- ``ToSupervisor`` / ``FromSupervisor``: each frontend's control pipe to the supervisor, in
  ``ipc.protocol.control_messages``.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

import msgspec

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.bls_messages import BlsClientWiring as BlsClientWiring
from triton_mp.ipc.protocol.bls_messages import BlsInboxUpdate as BlsInboxUpdate
from triton_mp.ipc.protocol.bls_messages import BlsModel as BlsModel
from triton_mp.ipc.protocol.bls_messages import BlsWorkerUpdate as BlsWorkerUpdate
from triton_mp.ipc.protocol.change_messages import InstancesAdded as InstancesAdded
from triton_mp.ipc.protocol.change_messages import InstancesRegrouped as InstancesRegrouped
from triton_mp.ipc.protocol.change_messages import InstancesRemoved as InstancesRemoved
from triton_mp.ipc.protocol.change_messages import InstancesRetired as InstancesRetired
from triton_mp.ipc.protocol.change_messages import InstanceWiring as InstanceWiring
from triton_mp.ipc.protocol.change_messages import VersionsActivated as VersionsActivated
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate as LogSettingsUpdate
from triton_mp.ipc.protocol.ready_messages import InstanceReadiness as InstanceReadiness
from triton_mp.ipc.protocol.ready_messages import ReadyCheck as ReadyCheck
from triton_mp.ipc.protocol.ready_messages import ReadyFanout as ReadyFanout
from triton_mp.ipc.protocol.ready_messages import ReadyQuery as ReadyQuery
from triton_mp.ipc.protocol.reports import ModelQueueStatus, ModelStats
from triton_mp.ipc.protocol.shm_messages import CudaShmRegion as CudaShmRegion
from triton_mp.ipc.protocol.shm_messages import ShmApplied as ShmApplied
from triton_mp.ipc.protocol.shm_messages import ShmRegion as ShmRegion
from triton_mp.ipc.protocol.shm_messages import ShmRegistered as ShmRegistered
from triton_mp.ipc.protocol.shm_messages import ShmUnregistered as ShmUnregistered
from triton_mp.ipc.protocol.trace_messages import ChildTrace as ChildTrace
from triton_mp.ipc.protocol.trace_messages import TensorTrace as TensorTrace
from triton_mp.ipc.protocol.trace_messages import TraceContext as TraceContext
from triton_mp.ipc.protocol.trace_messages import TraceRecord as TraceRecord
from triton_mp.ipc.protocol.trace_messages import TraceSettingUpdate as TraceSettingUpdate


class ErrorInfo(msgspec.Struct, frozen=True, array_like=True):
    """An error crossing a process boundary (never a pickled exception)."""

    code: ErrorCode
    message: str
    origin: str = ""
    """Role and instance that raised it, e.g. ``worker ocr_cls_0``; the scheduler's are
    ``"scheduler"`` (refused as it arrived: Triton's enqueue call returns those) or
    ``QUEUED_ORIGIN`` (failed after it was queued: Triton answers those in the response)."""


QUEUED_ORIGIN = "scheduler queue"
"""``ErrorInfo.origin`` of a request the scheduler failed after queueing it (its queue
timeout expired, its instance died, the server stopped): Triton's core sends these in the
request's response, whose error its HTTP frontend answers as text/plain
(``frontend.dispatch.ticket.ResponseError``)."""


class BlockRef(msgspec.Struct, frozen=True, array_like=True):
    """One allocation in a tensor arena; freed by writing FREE at ``offset``
    (``ipc.tensor_pool.free_block``), only while the header there still holds
    ``generation``."""

    segment: str
    """POSIX name of the arena segment."""
    offset: int
    """Byte offset of the block header within the segment."""
    generation: int = 0
    """The allocation's number, u32, never 0 (``ipc.tensor_pool``: the block header's second
    field): a later block at the same offset has another, so a free that comes after the
    block was freed and its room reused is refused instead of freeing that later block.
    0: not known (a reference made by hand, e.g. in tests): only the state is checked."""


class TensorRef(msgspec.Struct, frozen=True, array_like=True):
    """A tensor's bytes in shared memory, plus what is needed to view them.

    BYTES tensors hold Triton's serialised form: per element ``u32 LE length`` + bytes.
    """

    name: str
    datatype: str
    """Protocol datatype string: ``FP32``, ``INT64``, ``BYTES``, ..."""
    shape: tuple[int, ...]
    """Full shape, batch dimension included when the model batches."""
    segment: str
    offset: int
    """Byte offset of the first element within the segment."""
    nbytes: int
    region_id: int = 0
    """0: ``segment`` is a triton-mp arena. Otherwise ``segment`` is the key of a client's
    registered system shared-memory object and this is the registration's unique id.

    An output of a frontend's request (``Requester.FRONTEND``) may name the request's own
    input block: ``segment`` is then the segment of the request's ``block`` and the bytes
    lie inside one of its arena inputs (the model returned its input, or a view of it; the
    worker's C answer writer names it instead of copying it, ``workers/native/
    answer_writer.cc`` PlanAlias). The frontend reads such an output before it frees the
    input block, or frees the block when the response is released or sent
    (``frontend.dispatch.pending``, ``frontend/native/known_answer.h`` InputBlock)."""


class OutputRegion(msgspec.Struct, frozen=True, array_like=True):
    """Where a client asked for an output to be written (system shared memory)."""

    key: str
    """The client's POSIX shared-memory object."""
    region_id: int
    offset: int
    """Absolute byte offset within the object."""
    byte_size: int
    """Room the client gave for the output, in bytes."""
    region_name: str
    """The name the client registered (for error messages)."""


class SequenceFlags(IntFlag):
    """``InferRequest.sequence_flags`` bits: ``TRITONSERVER_RequestFlag`` (tritonserver.h),
    set from the request's ``sequence_start`` / ``sequence_end`` parameters."""

    NONE = 0
    START = 1
    """The first request of a sequence (``TRITONSERVER_REQUEST_FLAG_SEQUENCE_START``)."""
    END = 2
    """The last request of a sequence (``TRITONSERVER_REQUEST_FLAG_SEQUENCE_END``)."""


class Requester(IntEnum):
    """Who sent a request, so where its answers go (``ReplyTo.kind``)."""

    FRONTEND = 0
    """A frontend process (a client's gRPC or HTTP request); ``ReplyTo.id`` is its id."""
    BLS = 1
    """The BLS client of a python worker (``pb_utils.InferenceRequest.exec``);
    ``ReplyTo.id`` is that worker's instance id."""
    ENSEMBLE = 2
    """An ensemble step's request (``scheduler.ensembles``; id 0): answered to the scheduler."""


class ReplyTo(msgspec.Struct, frozen=True, array_like=True):
    """The typed reply address of a request: which inbox its answers (``InferResponse`` from
    the worker, ``RequestFailed`` from the scheduler) go to. Frontends and BLS clients have
    separate id spaces: frontend 0 and the BLS client of instance 0 are different inboxes.
    ``(reply_to, request_id)`` is unique per server."""

    kind: Requester
    id: int
    """The frontend id (``FRONTEND``) or the python worker's instance id (``BLS``)."""


class InferRequest(msgspec.Struct, frozen=True, kw_only=True, tag="infer", array_like=True):
    """A validated inference request whose inputs are already in the requester's arena."""

    request_id: int
    """Unique per requester; (reply_to, request_id) is unique per server."""
    reply_to: ReplyTo
    model: str
    version: int
    batch_size: int
    """Request batch size (first dim) when the model batches, else 1."""
    inputs: tuple[TensorRef, ...]
    outputs: tuple[str, ...]
    """Requested output names, in response order."""
    block: BlockRef
    """The input block; freed by the frontend when the request ends."""
    arrival_ns: int
    """``time.monotonic_ns()`` when the frontend accepted the request (system-wide clock)."""
    priority: int = 0
    timeout_us: int = 0
    client_id: str = ""
    """The request's ``id`` field, echoed in the response and in error messages."""
    parameters_json: str = "{}"
    """The request's non-reserved parameters (Triton passes them to backends) as JSON."""
    output_regions: tuple[OutputRegion | None, ...] = ()
    """Per requested output (same order as ``outputs``): a client region, or None for the
    worker's arena. Empty when no output uses shared memory."""
    sequence_id: int | str = 0
    """The correlation ID (``sequence_id`` parameter): uint64 or string; 0 / "" = none."""
    sequence_flags: int = 0
    """``SEQUENCE_START`` (1) | ``SEQUENCE_END`` (2), from ``sequence_start``/``sequence_end``."""
    trace: TraceContext | None = None
    """Set only for a sampled request (``frontend.tracing.tracer``)."""


class CancelRequest(msgspec.Struct, frozen=True, kw_only=True, tag="cancel", array_like=True):
    """The client of a request went away (cancelled, deadline exceeded): drop it if queued."""

    request_id: int
    reply_to: ReplyTo
    model: str
    version: int


class CacheOutcome(msgspec.Struct, frozen=True, kw_only=True, tag="cache", array_like=True):
    """A frontend's response-cache lookup for one request, for the model's statistics.

    A hit was answered from the cache without reaching the scheduler: it counts in
    ``success`` and ``queue`` and in ``cache_hit``, not in compute, inference or execution
    counts (core ``InferenceStatsAggregator::UpdateSuccessCacheHit``). A miss is sent once
    the request's successful response was inserted: ``cache_miss`` gets the lookup and
    insertion time, which is also added to ``success`` (``UpdateSuccessCacheMiss``).
    """

    model: str
    version: int
    hit: bool
    cache_ns: int
    """Hit: the lookup's duration. Miss: lookup plus insertion, in nanoseconds."""
    request_ns: int = 0
    """Hit only: the request's duration from arrival to its answer."""
    queue_ns: int = 0
    """Hit only: from arrival to the start of the lookup (Triton's queue duration)."""


class RequestRefused(msgspec.Struct, frozen=True, kw_only=True, tag="req_refused", array_like=True):
    """A frontend refused a request that Triton's backend would have taken and failed: it
    counts as a failed request of the model (``fail``, ``nv_inference_request_failure``
    reason BACKEND), as the backend's report would (``frontend.validation.inputs``'s
    ``RefusedByBackend``)."""

    model: str
    version: int
    request_ns: int
    """From the request's arrival to its refusal, in nanoseconds."""


class StatsQuery(msgspec.Struct, frozen=True, kw_only=True, tag="stats_query", array_like=True):
    """Frontend asks the scheduler for ModelStatistics (empty model = all models)."""

    query_id: int
    frontend_id: int
    model: str = ""
    version: int = -1
    since_load: bool = False
    """Count from when each version's current model loaded (the statistics extension: a
    reload as a new model starts again at 0), not from its first load (the metrics)."""


class QueueQuery(msgspec.Struct, frozen=True, kw_only=True, tag="queue_query", array_like=True):
    """Frontend asks the scheduler for its queues (``triton-mp stat``; empty model = all)."""

    query_id: int
    frontend_id: int
    model: str = ""


WarmupRun = tuple[int, int, int, int, int]
"""One warmup execution (``WorkerReady.warmup``): its requests (each of batch 1), when it
started (monotonic ns), its compute_input and compute_infer durations (ns), and when it
ended (monotonic ns)."""


class WorkerReady(msgspec.Struct, frozen=True, kw_only=True, tag="worker_ready", array_like=True):
    """A worker loaded its backend and will take batches."""

    instance_id: int
    pid: int
    ready_check: bool = False
    """The model has a readiness check of its own (python ``is_ready()``: ``ReadyCheck``)."""
    warmup: tuple[WarmupRun, ...] = ()
    """Its ``model_warmup`` executions, in order (core ``TritonModelInstance::WarmUp``
    reports them in the model's statistics like any execution)."""


class BatchDone(msgspec.Struct, frozen=True, kw_only=True, tag="batch_done", array_like=True):
    """A worker finished a batch (responses are already on their way to the frontends)."""

    instance_id: int
    batch_id: int
    start_ns: int
    """When the worker began gathering inputs (monotonic ns)."""
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    end_ns: int
    failed: tuple[int, ...] = ()
    """Indices (within the batch) of requests that got an error."""
    rescheduled: tuple[int, ...] = ()
    """Indices of requests the model released with ``RELEASE_RESCHEDULE`` (iterative
    sequence batching): no response went out; the scheduler queues each again."""
    reoffered: bool = False
    """The worker posted its instance's lease before this message (``ipc.direct``,
    ``worker_reoffers``): the scheduler counts the lease as offered instead of offering it."""


class DecoupledDone(
    msgspec.Struct, frozen=True, kw_only=True, tag="decoupled_done", array_like=True
):
    """A worker sent the final response of a request of a decoupled model.

    Until then the scheduler keeps the request as open on that instance: a cancellation is
    forwarded there (``InferenceResponseSender.is_cancelled``) and the instance's death fails
    it (the frontend would otherwise wait forever for its final response).
    """

    instance_id: int
    reply_to: ReplyTo
    request_id: int


class WorkerDied(msgspec.Struct, frozen=True, kw_only=True, tag="worker_died", array_like=True):
    """The supervisor saw a worker process exit."""

    instance_id: int
    exitcode: int
    reason: str = ""
    """Why, when the supervisor knows more than the exit code (e.g. it killed the worker
    because it stopped sending heartbeats); empty otherwise."""
    segments: str = ""
    """What the names of the dead process's arenas start with
    (``Topology.worker_process_segments``): the scheduler unmaps those it attached."""


class Shutdown(msgspec.Struct, frozen=True, tag="shutdown", array_like=True):
    """Stop after finishing what is in hand."""

    readers_s: float = 0.0
    """A worker: how long to wait, in seconds, for the readers of its answers to free their
    blocks before it unlinks its arenas (``ArenaAllocator.await_readers``): set when a
    retired version stops while the server keeps serving; 0 at server shutdown."""


class Handoff(msgspec.Struct, frozen=True, array_like=True):
    """A shared block (``InferResponse.shared_blocks``) now belongs to the requester: it frees
    the block once it has released ``uses`` responses naming it in ``shared_blocks``. It comes
    with the last of those responses or in a later answer to the same request."""

    block: BlockRef
    uses: int


class InferResponse(msgspec.Struct, frozen=True, kw_only=True, tag="response", array_like=True):
    """An answer for one request (a worker's; an ensemble's from the scheduler): outputs in
    shared memory, or an error. An ordinary model's request gets exactly one, final; a
    decoupled model's (``model_transaction_policy.decoupled``) zero or more non-final ones,
    then one final one (``TRITONSERVER_RESPONSE_COMPLETE_FINAL``), which may be ``empty``."""

    request_id: int
    version: int
    outputs: tuple[TensorRef, ...] = ()
    block: BlockRef | None = None
    """The output block; the frontend frees it after copying the bytes out."""
    error: ErrorInfo | None = None
    final: bool = True
    """No more responses follow for this request (the frontend then frees its inputs)."""
    empty: bool = False
    """A flags-only final response: no outputs and no error, only the end of the request
    (``send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)`` with no response)."""
    trace: TraceRecord | None = None
    """A traced request's events from the scheduler and the worker (the final response)."""
    extra_blocks: tuple[BlockRef, ...] = ()
    """Freed with ``block`` (an ensemble's outputs lie in its steps' blocks)."""
    parameters_json: str = ""
    """The response's parameters: JSON str -> bool/int/str (``ModelInferResponse.parameters``;
    python ``InferenceResponse(parameters=)``); "" for none."""
    shared_blocks: tuple[BlockRef, ...] = ()
    """Blocks this response's outputs also lie in but does not own alone: an ensemble output
    written upstream of a decoupled step is in every response that step drives. Releasing
    the response counts one use of each (``ipc.tensor_pool.SharedBlocks``)."""
    handoffs: tuple[Handoff, ...] = ()
    """Shared blocks the requester now owns (see ``Handoff``)."""


class AnswerBatch(msgspec.Struct, frozen=True, kw_only=True, tag="answers", array_like=True):
    """A worker's answers to several requests of one batch, for one frontend, in one ring
    record (one wake-up and one decode there). Their arena outputs lie in one block, which
    each response names in ``shared_blocks`` and ``handoffs`` hands over: the frontend frees
    it once it has released every response naming it (``ipc.tensor_pool.SharedBlocks``)."""

    responses: tuple[InferResponse, ...]
    handoffs: tuple[Handoff, ...] = ()


class DirectSent(msgspec.Struct, frozen=True, kw_only=True, tag="direct_sent", array_like=True):
    """A frontend took an idle instance's lease and handed it ``request`` as the batch
    ``batch_id`` (negative: ``direct_batch_id``) at ``dispatch_ns`` (``ipc.direct``). Left on
    the frontend's ring without waking the scheduler, which reads it on its next pass."""

    instance_id: int
    batch_id: int
    dispatch_ns: int
    request: InferRequest | bytes
    """As the batch carries it: a REQUEST record verbatim (``ipc.recordio.records``; the
    native gRPC thread's, ``direct_handoff.h``) or the message."""


def direct_batch_id(frontend_id: int, request_id: int) -> int:
    """The id of a frontend's direct batch: negative, so never one of the scheduler's, and
    unique per frontend request (frontend ids are below 1024)."""
    return -(request_id * 1024 + frontend_id + 1)


ToScheduler = (
    InferRequest
    | DirectSent
    | InferResponse
    | CancelRequest
    | CacheOutcome
    | RequestRefused
    | StatsQuery
    | QueueQuery
    | ReadyQuery
    | WorkerReady
    | BatchDone
    | DecoupledDone
    | WorkerDied
    | Shutdown
    | InstancesAdded
    | VersionsActivated
    | InstancesRetired
    | InstancesRegrouped
    | InstancesRemoved
    | LogSettingsUpdate
)


class BatchAssign(msgspec.Struct, frozen=True, kw_only=True, tag="batch", array_like=True):
    """The scheduler hands a batch to one instance."""

    batch_id: int
    requests: tuple[InferRequest | bytes, ...]
    """Each a request as its requester sent it: a frontend's REQUEST record verbatim
    (``ipc.recordio.records``; the worker decodes it, ``records.decode_request``) or the message."""
    dispatch_ns: int
    rows: int = 0
    """Batch rows the backend sees (sequence batcher, Direct strategy: every slot up to the
    highest one used; rows without a request are READY false); 0 = one row per request."""
    slots: tuple[int, ...] = ()
    """The row of each request when ``rows`` is set; empty = request i is row i."""
    released: tuple[int | str, ...] = ()
    """Correlation IDs whose sequences ended without an END request (idle): drop their state."""


class BatchDue(msgspec.Struct, frozen=True, kw_only=True, tag="batch_due", array_like=True):
    """The scheduler's notice that a batch for this idle instance is due at ``at_ns``
    (CLOCK_MONOTONIC ns), when its batching delay (``max_queue_delay_microseconds``) runs out:
    the worker polls its rings around then instead of sleeping (``workers.due``)."""

    at_ns: int


class DropSegments(msgspec.Struct, frozen=True, tag="drop_segments", array_like=True):
    """Supervisor -> every worker (its control ring): a frontend process died and its input
    arenas are unlinked; unmap those attached whose names start with one of ``prefixes``
    (``Topology.frontend_process_segments``). A request that still names them fails."""

    prefixes: tuple[str, ...]
    holder: int = 0
    """The dead process's pid: free the output blocks its replies held in place
    (``ipc.output_holds``); 0: none."""
    frontend_id: int = -1
    """The dead process's frontend id (``ReplyTo.id``); -1: no requests to cancel."""
    requests_below: int = 0
    """Every request of frontend ``frontend_id`` whose id is below this came from the dead
    process or an earlier one of that frontend (``FrontendSpec.first_request_id`` of the next):
    their clients' connections dropped with it, so the worker counts them cancelled
    (``request.is_cancelled()``), as Triton's gRPC frontend cancels a call whose client went
    away."""


ToWorker = (
    BatchAssign
    | BatchDue
    | CancelRequest
    | Shutdown
    | BlsWorkerUpdate
    | ReadyCheck
    | LogSettingsUpdate
    | DropSegments
)
"""``CancelRequest`` reaches a worker for a request it runs (in the batch it executes or
holds, or a decoupled one whose final response has not been sent yet)."""


class RequestFailed(msgspec.Struct, frozen=True, kw_only=True, tag="failed", array_like=True):
    """The scheduler ends a request without running it (rejected, timed out, worker died)."""

    request_id: int
    error: ErrorInfo
    handoffs: tuple[Handoff, ...] = ()
    """A failed ensemble request's shared blocks used by responses sent before (``Handoff``)."""


class StatsReply(msgspec.Struct, frozen=True, kw_only=True, tag="stats_reply", array_like=True):
    """The scheduler's answer to a ``StatsQuery``."""

    query_id: int
    stats: tuple[ModelStats, ...]


class QueueReply(msgspec.Struct, frozen=True, kw_only=True, tag="queue_reply", array_like=True):
    """The scheduler's answer to a ``QueueQuery``."""

    query_id: int
    models: tuple[ModelQueueStatus, ...]


class ModelAvailability(
    msgspec.Struct, frozen=True, kw_only=True, tag="availability", array_like=True
):
    """A model version gained its first live instance, or lost its last one."""

    model: str
    version: int
    ready: bool


ToFrontend = (
    InferResponse
    | AnswerBatch
    | RequestFailed
    | StatsReply
    | QueueReply
    | ShmRegistered
    | ShmUnregistered
    | ShmApplied
    | ModelAvailability
    | TraceSettingUpdate
    | LogSettingsUpdate
    | ReadyFanout
    | InstanceReadiness
)

ToBlsClient = InferResponse | RequestFailed | BlsInboxUpdate | ReadyFanout | InstanceReadiness
"""What a python worker's BLS client reads: the answers to its requests (from the callees'
workers and the scheduler), the supervisor's rewiring of its inbox, and the answers to its
readiness queries (``pb_utils.is_model_ready`` of a model with ``is_ready()``)."""
