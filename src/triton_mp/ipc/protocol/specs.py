"""Runtime specs: what each process is told at start and what models become at run time.

Built by the supervisor from the server's flags (``common.config.ServerConfig``) and the
planned model versions (``model_config``); decoded by every role's ``main``. Children never
re-read flags, environment variables or config.pbtxt. Models change at run time through
messages instead (``ipc.protocol.messages.ModelTableUpdate``, ``VersionsActivated``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

# NOTE: ModelEntry crosses the control pipe too, so it lives with the control-pipe messages.
from triton_mp.common.config import CacheConfig, RateLimitResource
from triton_mp.common.process.gpus import Gpu
from triton_mp.common.process.log import current_log_settings
from triton_mp.common.trace_config import TraceConfig
from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.protocol.control_messages import DirectRoute
from triton_mp.ipc.protocol.control_messages import ModelEntry as ModelEntry
from triton_mp.ipc.protocol.messages import BlsModel as BlsModel


class TensorSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One input or output of a model, from its effective config."""

    name: str
    datatype: str
    """Protocol datatype string (``FP32``, ``BYTES``, ...)."""
    dims: tuple[int, ...]
    """Config ``dims`` without the batch dimension; -1 = any size."""
    reshape: tuple[int, ...] | None = None
    """Config ``reshape.shape`` (what the backend sees, without batch); None = no reshape."""
    optional: bool = False
    allow_ragged_batch: bool = False


class QueuePolicySpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One priority level's queue policy (``inference.ModelQueuePolicy``)."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    """What happens to a request whose queue timeout expires (``timeout_action``)."""
    default_timeout_us: int = 0
    """``default_timeout_microseconds``; 0 = requests never time out in the queue."""
    allow_timeout_override: bool = False
    """A request's ``timeout`` parameter (microseconds) may shorten the default."""
    max_queue_size: int = 0
    """``max_queue_size``; 0 = unbounded."""


class BatchingSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The scheduling choice of a model (``dynamic_batching`` or the default scheduler)."""

    kind: Literal["default", "dynamic", "sequence", "ensemble"] = "default"
    max_batch_size: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    """``priority_levels``; 0 = one queue, the request ``priority`` parameter is ignored."""
    default_priority_level: int = 0
    """``default_priority_level`` (1 = highest) for requests with priority 0 or out of range."""
    default_queue_policy: QueuePolicySpec = QueuePolicySpec()
    """``default_queue_policy``: levels without their own entry use it."""
    priority_queue_policy: dict[int, QueuePolicySpec] = {}
    """``priority_queue_policy``: per level."""


class ControlSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One sequence control input (``sequence_batching.control_input[].control[]``).

    The worker feeds it as an extra input tensor named ``name``: shape ``[rows, 1]`` when the
    model batches (one element per batch row), ``[1]`` otherwise.
    """

    name: str
    kind: Literal["START", "END", "READY", "CORRID"]
    datatype: str
    """Protocol datatype: INT32, FP32 or BOOL for START/END/READY (from which of
    ``int32_false_true``/``fp32_false_true``/``bool_false_true`` is set); the CORRID
    control's ``data_type`` (UINT64, INT64, UINT32, INT32 or BYTES)."""
    false_value: float = 0.0
    true_value: float = 1.0


class StateSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One implicit state (``sequence_batching.state[]``): the output ``output_name`` of a
    sequence's request becomes the input ``input_name`` of its next request."""

    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]
    """Without the batch dimension; -1 becomes 1 for the initial state."""
    initial: Literal["none", "zero", "file"] = "none"
    """``initial_state``: absent (garbage: zeros here), ``zero_data`` or ``data_file``."""
    data_file: str = ""
    """Absolute path of ``<model dir>/initial_state/<data_file>`` when ``initial`` is file."""


class SequenceSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """``sequence_batching`` of a model (the scheduler's and the worker's view)."""

    strategy: Literal["direct", "oldest"] = "direct"
    max_sequence_idle_us: int = 1_000_000
    """``max_sequence_idle_microseconds`` (normalised: 0 became 1 s)."""
    controls: tuple[ControlSpec, ...] = ()
    states: tuple[StateSpec, ...] = ()
    max_queue_delay_us: int = 0
    """``direct``/``oldest.max_queue_delay_microseconds``."""
    minimum_slot_utilization: float = 0.0
    """``direct.minimum_slot_utilization`` (0 = send whatever is ready)."""
    max_candidate_sequences: int = 0
    """``oldest.max_candidate_sequences`` per instance (0 = ``max(1, max_batch_size)``)."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """``oldest.preferred_batch_size``."""
    preserve_ordering: bool = False
    """``oldest.preserve_ordering``."""
    iterative: bool = False
    """``iterative_sequence``: a request may be rescheduled (``RELEASE_RESCHEDULE``) and
    one without a correlation ID gets a sequence of its own."""


class WarmupInputSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One input of a warmup sample (``model_warmup[].inputs`` entry)."""

    name: str
    datatype: str
    """Protocol datatype string of ``data_type`` (``INVALID`` when the config gives none)."""
    dims: tuple[int, ...]
    """Without the batch dimension; a -1 is refused when the sample is built."""
    source: Literal["zero", "random", "file", ""] = ""
    """``zero_data``, ``random_data`` or ``input_data_file``; "" when none is set."""
    data_file: str = ""
    """Absolute path of ``<model dir>/warmup/<input_data_file>`` for ``file``."""
    file_name: str = ""
    """``input_data_file`` as the config names it (for Triton's messages)."""


class WarmupSampleSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One ``model_warmup`` entry: ``batch_size`` requests run as one execution, ``count``
    times, on every instance before it is ready."""

    name: str
    batch_size: int
    """Requests per execution (each of batch 1 when the model batches); 0 skips the sample."""
    count: int
    """Executions of the sample (Triton's ``count``; 0 runs it once, as 1 does)."""
    inputs: tuple[WarmupInputSpec, ...] = ()


class EnsembleStepSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One ``ensemble_scheduling.step`` (``inference.ModelEnsembling.Step``)."""

    model: str
    """``model_name``."""
    version: int = -1
    """``model_version``; -1 = the latest ready version when the step is called."""
    input_map: dict[str, str] = {}
    """Composing model input -> ensemble tensor."""
    output_map: dict[str, str] = {}
    """Composing model output -> ensemble tensor."""
    decoupled: bool = False
    """The composing model is decoupled (from its config when the ensemble was checked)."""
    max_batch_size: int = 0
    """The composing model's ``max_batch_size`` (whether its requests carry a batch)."""


class EnsembleSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """``ensemble_scheduling`` of an ensemble (``inference.ModelEnsembling``)."""

    steps: tuple[EnsembleStepSpec, ...]
    max_inflight_requests: int = 0
    """Composing requests in flight per step at most over all requests; 0 = unbounded."""


class InstanceSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One model instance: one worker process."""

    instance_id: int
    """Dense id over the whole server; indexes the scheduler's worker channels."""
    name: str
    """Triton's instance name, ``<group name>_<index>``."""
    model: str
    version: int
    kind: Literal["KIND_CPU", "KIND_GPU", "KIND_MODEL"] = "KIND_CPU"
    gpu_id: int = -1
    host_policy: str = ""
    """The instance's host policy name (``instance_group.host_policy``, else Triton's
    default: ``cpu``, ``gpu_<n>`` or ``model`` by kind)."""
    cpu_cores: tuple[int, ...] = ()
    """That policy's ``cpu-cores`` (``--host-policy``): the worker process is pinned to
    these CPUs; empty: not pinned."""
    numa_node: int = -1
    """That policy's ``numa-node``: the worker's memory is bound to it; -1: not bound."""
    nice: int = 0
    """Nice increment of the worker process (``optimization.priority``: PRIORITY_MIN 19)."""


class ResourceSpec(msgspec.Struct, frozen=True, array_like=True):
    """One ``instance_group.rate_limiter.resources`` entry."""

    name: str
    global_: bool
    """``global``: shared by every device, else one pool per device."""
    count: int


class RateLimitSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One instance's ``rate_limiter`` (``scheduler.limits.rate_limiter``)."""

    resources: tuple[ResourceSpec, ...] = ()
    priority: int = 0
    """``priority``; 0 counts as 1 (Triton's ``ScaledPriority``)."""
    device: int = 0
    """The device whose per-device pools it draws from: the GPU of a KIND_GPU instance,
    0 otherwise (as Triton's CPU instances have device id 0)."""


class BackendCapabilities(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """What a model's backend can do beyond executing batches, as its row of
    ``backends.registry.BACKENDS`` declares it; every role asks these, never the backend's
    name. All False: a backend that executes batches and nothing more (onnxruntime).

    Attributes:
        bls: its instances call other models (BLS): each gets rings to every instance and a
            client of the scheduler (``workers.bls.bls_client``).
        custom_metrics: its models make metrics (``pb_utils.MetricFamily``): each instance
            gets a metric board the metrics endpoint reads.
        cancellation_watch: its models ask ``is_cancelled()`` while they execute: the worker
            looks at its inbox for cancellations meanwhile (``workers.execution_watch``).
        readiness_hook: its models may define ``is_ready()``, asked on every readiness check.
    """

    bls: bool = False
    custom_metrics: bool = False
    cancellation_watch: bool = False
    readiness_hook: bool = False


class ModelVersionSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """What the scheduler and workers need to know about one loaded model version."""

    model: str
    version: int
    backend: str
    model_file: str
    """Absolute path of the backend's file (model.onnx, model.py, model.plan)."""
    max_batch_size: int
    batching: BatchingSpec
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    instance_ids: tuple[int, ...]
    instance_names: tuple[str, ...] = ()
    """Triton's instance name per entry of ``instance_ids`` (for ``triton-mp stat``)."""
    sequence: SequenceSpec | None = None
    """``sequence_batching`` (with ``batching.kind == "sequence"``), else None."""
    config_json: str = "{}"
    """Effective ModelConfig in Triton's JSON form (python backend's ``args``)."""
    decoupled: bool = False
    """``model_transaction_policy.decoupled``: zero or many responses per request."""
    warmup: tuple[WarmupSampleSpec, ...] = ()
    """``model_warmup``: samples every instance runs before it reports ready."""
    rate_limits: tuple[RateLimitSpec, ...] = ()
    """Per entry of ``instance_ids``: its group's ``rate_limiter`` (empty: none given)."""
    ensemble: EnsembleSpec | None = None
    """The steps of an ensemble (``platform: "ensemble"``, ``batching.kind`` "ensemble",
    no instances), else None."""
    capabilities: BackendCapabilities = BackendCapabilities()
    """What its backend can do (its registry row's; none for an ensemble)."""

    @property
    def enforced_inputs(self) -> tuple[str, ...]:
        """Inputs whose shapes must match for requests to share a batch."""
        return tuple(t.name for t in self.inputs if -1 in t.dims and not t.allow_ragged_batch)

    @property
    def has_optional_inputs(self) -> bool:
        """Whether an input is ``optional``: then requests share a batch only when they
        give the same inputs (core ``RequiredEqualInputs``)."""
        return any(t.optional for t in self.inputs)


class ChannelSpec(msgspec.Struct, frozen=True, array_like=True):
    """A producer's end of a channel: the ring and the consumer's wake-up."""

    ring: str
    wakeup: Wakeup


class InboxSpec(msgspec.Struct, frozen=True, array_like=True):
    """A consumer's end: its wake-up and every ring that leads to it."""

    wakeup: Wakeup
    rings: tuple[str, ...]


class LogSpec(msgspec.Struct, frozen=True, array_like=True):
    """Logging settings every child applies."""

    verbose: int = 0
    format: Literal["console", "json", "ISO8601"] = "console"
    info: bool = True
    """``--log-info`` (and ``--log-warning``, ``--log-error``): those lines on."""
    warning: bool = True
    error: bool = True
    file: str = ""
    """``--log-file`` in force ("" for stderr): what a frontend answers as ``log_file``."""

    @property
    def levels(self) -> tuple[bool, bool, bool]:
        """(info, warning, error) for ``common.process.log.configure_logging``."""
        return (self.info, self.warning, self.error)


_LOG_FORMATS: dict[str, Literal["console", "json", "ISO8601"]] = {
    "json": "json",
    "ISO8601": "ISO8601",
}
"""``--log-format`` values a child takes as they are (anything else logs as the console)."""


def current_log_spec() -> LogSpec:
    """The ``LogSpec`` of a child started now: this process's settings (the supervisor's are
    the start-up flags until a client changes them, then the client's: ``logging``)."""
    s = current_log_settings()
    fmt = _LOG_FORMATS.get(s.format, "console")
    return LogSpec(s.verbose, fmt, s.info, s.warning, s.error, s.file)


class SchedulerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the scheduler process needs."""

    models: tuple[ModelVersionSpec, ...]
    inbox: InboxSpec
    to_workers: dict[int, ChannelSpec]
    """Per instance id."""
    to_frontends: dict[int, ChannelSpec]
    """Per frontend id."""
    log: LogSpec
    rate_limit: bool = False
    """``--rate-limit execution_count`` (``scheduler.limits.rate_limiter``)."""
    rate_limit_resources: tuple[RateLimitResource, ...] = ()
    """``--rate-limit-resource``: the explicit counts."""


class BlsSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A python worker's side of BLS (``pb_utils.InferenceRequest.exec``): it submits
    requests to the scheduler like a frontend, answered at
    ``ReplyTo(Requester.BLS, <its instance id>)``."""

    inbox: InboxSpec
    """Answers: from the scheduler and from every worker."""
    models: dict[str, BlsModel]
    """The models that serve now (``BlsWorkerUpdate`` replaces the table later)."""
    seq: int = 0
    """The table's place in the order of ``BlsWorkerUpdate`` tables."""
    control_address: str = ""
    """The supervisor's model control listener (``supervisor.models.bls_control``): an abstract
    Unix socket address for ``pb_utils.load_model`` / ``unload_model``; "" when none."""
    control_key: bytes = b""
    """Its ``multiprocessing`` authentication key."""


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one worker process needs."""

    instance: InstanceSpec
    model: ModelVersionSpec
    inbox: InboxSpec
    to_scheduler: ChannelSpec
    to_frontends: dict[int, ChannelSpec]
    arena_prefix: str
    arena_bytes: int
    arena_budget_bytes: int
    log: LogSpec
    to_bls_clients: dict[int, ChannelSpec] = {}
    """Per python worker instance id: this worker's ring into that worker's BLS inbox
    (answers to ``ReplyTo(Requester.BLS, id)``)."""
    bls: BlsSpec | None = None
    """Python workers only: their BLS client."""
    lease: str = ""
    """The instance's lease (``ipc.direct``) when its version's requests may be handed
    straight to it (``handoff_eligible``): the worker re-offers it after a batch when the
    scheduler would (``ipc.direct.worker_reoffers``); empty: never."""


class MetricsSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The Prometheus endpoint, for the one frontend that serves it."""

    address: str
    port: int
    cpu_metrics: bool = True
    """Report the ``nv_cpu_*`` gauges (``--allow-cpu-metrics``)."""
    interval_ms: int = 2000
    """How often the CPU gauges are sampled (``--metrics-interval-ms``)."""
    server_id: str = ""
    """Whose python models' custom-metric boards to report (``ipc.memory.metric_board``); empty:
    none."""
    gpus: tuple[Gpu, ...] = ()
    """The GPUs whose ``nv_gpu_*`` gauges to report (empty: ``--allow-gpu-metrics=false``
    or none), sampled by UUID every ``interval_ms``."""


class GrpcTls(msgspec.Struct, frozen=True, kw_only=True):
    """``--grpc-use-ssl`` and ``--grpc-use-ssl-mutual``: PEM file paths."""

    server_cert: str
    server_key: str
    root_cert: str = ""
    mutual: bool = False
    """Require a client certificate signed by ``root_cert``."""


class FrontendSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one frontend process needs."""

    frontend_id: int
    grpc_address: str
    grpc_port: int
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    allow_http: bool = True
    """Serve HTTP/REST on ``http_address:http_port`` beside gRPC."""
    server_name: str
    models: tuple[ModelEntry, ...]
    inbox: InboxSpec
    to_scheduler: ChannelSpec
    direct_routes: tuple[DirectRoute, ...] = ()
    """This frontend's routes to the instances it may hand requests directly (``ipc.direct``)."""
    to_peers: dict[int, ChannelSpec] = {}
    """Per other frontend id: this frontend's ring into its inbox (client shared-memory
    registrations, ``ShmRegistered`` / ``ShmUnregistered``)."""
    arena_prefix: str
    arena_bytes: int
    arena_budget_bytes: int
    exit_timeout_s: float
    model_control_mode: str
    allow_client_shm: bool
    log: LogSpec
    metrics: MetricsSpec | None = None
    latency_histograms: bool = False
    """``--metrics-config histogram_latencies=true``: observe each request's first
    response (``frontend.metrics.latency``; every frontend, whichever serves metrics)."""
    repository: str = ""
    """The model repository directory: RepositoryIndex lists models never loaded too."""
    """The metrics endpoint this frontend serves (frontend 0 only), or None."""
    grpc_restricted: dict[str, tuple[str, str]] = {}
    """``--grpc-restricted-protocol``: category -> (header key, value); see ``restricted``."""
    http_restricted: dict[str, tuple[str, str]] = {}
    """``--http-restricted-api``: category -> (header key, value)."""
    client_shm_prefix: str = ""
    """``--client-shm-prefix``: registered system shared memory keys must start with it."""
    gpu_ids: tuple[int, ...] = ()
    """The server's GPUs (CUDA ordinals) a CUDA shared-memory region may live on."""
    cache: CacheConfig | None = None
    """The response cache (``--cache-config``); None: none."""
    cache_segment: str = ""
    """The local cache's shared segment (``ipc.memory.response_cache``), when ``cache`` is local."""
    trace: TraceConfig = TraceConfig()
    """The starting trace settings (``--trace-config``); see ``frontend.tracing.tracer``."""
    allow_grpc: bool = True
    """``--allow-grpc``: false binds no gRPC port."""
    grpc_tls: GrpcTls | None = None
    """``--grpc-use-ssl``: serve gRPC over TLS; None: plaintext."""
    grpc_channel_args: dict[str, int] = {}
    """grpc core channel arguments from the keepalive flags (``grpc.keepalive_time_ms``...)."""
    grpc_compression_level: str = "none"
    """``--grpc-infer-response-compression-level``: none, low, medium or high."""
    grpc_frontend: str = "native"
    """``--grpc-frontend``: native or python (``frontend.native.public_port.choose``)."""
    http_max_input_bytes: int = 64 << 20
    """``--http-max-input-size``: the largest HTTP request body, compressed or inflated."""
    grpc_header_forward_pattern: str = ""
    """``--grpc-header-forward-pattern``: metadata forwarded as request parameters."""
    http_header_forward_pattern: str = ""
    """``--http-header-forward-pattern``: HTTP headers forwarded as request parameters."""
    strict_readiness: bool = True
    """``--strict-readiness``: ServerReady needs every model ready."""
    first_request_id: int = 1
    """Where this process's request and query ids start: a frontend restarted in a dead
    one's place counts from a new range (``FRONTEND_ID_RANGE`` per start), so an answer to
    the dead one's request that still reaches its rings is never taken for one of its own."""
    frontend_restarts: dict[int, int] = {}
    """Per frontend id: how often the supervisor restarted it so far (``triton-mp stat``
    and ``triton_mp_frontend_restarts``); later ones arrive as ``FrontendRestarts``."""


FRONTEND_ID_RANGE = 1 << 40
"""Request ids per start of a frontend (``FrontendSpec.first_request_id``): start ``n``
counts from ``n * FRONTEND_ID_RANGE + 1``; ``ipc.protocol.messages.direct_batch_id`` keeps them
below 2**63 for starts 0 to 8190."""


_SPEC_TYPES: dict[str, type[FrontendSpec | SchedulerSpec | WorkerSpec]] = {
    "frontend": FrontendSpec,
    "scheduler": SchedulerSpec,
    "worker": WorkerSpec,
}


def with_current_log(role: str, spec_bytes: bytes) -> bytes:
    """A child's encoded spec with ``log`` set to ``current_log_spec()``: a process the
    supervisor restarts after a client changed the log settings starts with them."""
    now = current_log_spec()
    spec = msgspec.msgpack.decode(spec_bytes, type=_SPEC_TYPES[role])
    if spec.log == now:
        return spec_bytes
    return msgspec.msgpack.encode(msgspec.structs.replace(spec, log=now))
