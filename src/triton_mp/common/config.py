"""The server's flags as one frozen struct: validated once at the edge, then passed down.

Built by the CLI (``cli.main``) from ``triton-mp start``'s argv and read by the supervisor;
every role receives only the parts it needs, as runtime specs (``ipc.protocol.specs``). Fields carry
their units and follow ``tritonserver``'s flag names and defaults. Every field is
restart-required.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from triton_mp.common.trace_config import TraceConfig

Port = Annotated[int, Meta(ge=0, le=65535)]


class CacheConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The response cache (``--cache-config <cache>,<key>=<value>``, repeatable, or the
    deprecated ``--response-cache-byte-size N`` = ``local,size=N``)."""

    kind: Literal["local", "redis"]
    """``local``: one shared-memory cache for every frontend (``ipc.memory.response_cache``);
    ``redis``: entries in a Redis server (``frontend.cache.redis_store``)."""
    settings: dict[str, str] = {}
    """The ``<key>=<value>`` pairs as given: ``size`` (bytes) for local; ``host``, ``port``
    and the redis cache's optional keys (``user``, ``password``, ``db``,
    ``connect_timeout``, ``socket_timeout``, ``pool_size``, ``wait_timeout``,
    ``tls_enabled``, ``cert``, ``key``, ``cacert``, ``cacert_dir``, ``sni``) for redis."""

    @property
    def size_bytes(self) -> int:
        """The local cache's ``size`` in bytes (0 for redis)."""
        return int(self.settings.get("size", "0")) if self.kind == "local" else 0


class RateLimitResource(msgspec.Struct, frozen=True, kw_only=True):
    """One ``--rate-limit-resource <name>:<count>[:<device>]``."""

    name: str
    count: Annotated[int, Meta(ge=0)]
    device: int = -1
    """-1: every device (and the count of a global resource)."""


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``triton-mp start`` flags (names and defaults follow ``tritonserver``'s)."""

    model_repository: str
    """``--model-repository``: the Triton model repository directory."""
    grpc_address: str = "0.0.0.0"
    grpc_port: Port = 8001
    http_address: str = "0.0.0.0"
    http_port: Port = 8000
    """``--http-port``: KServe v2 HTTP/REST, served by every frontend (SO_REUSEPORT)."""
    allow_http: bool = True
    """``--allow-http``: false serves no HTTP/REST."""
    allow_grpc: bool = True
    """``--allow-grpc``: false serves no gRPC (nor ``triton-mp stat``'s admin service)."""
    reuse_grpc_port: bool = False
    """``--reuse-grpc-port``: skip the start-up check that the gRPC port is free, so other
    servers started with the flag can share it (the frontends always bind with
    ``SO_REUSEPORT``)."""
    reuse_http_port: bool = False
    """``--reuse-http-port``: as ``reuse_grpc_port``, for HTTP/REST."""
    http_max_input_bytes: Annotated[int, Meta(gt=0)] = 64 << 20
    """``--http-max-input-size``: the largest HTTP request body, compressed or inflated."""
    grpc_header_forward_pattern: str = ""
    """``--grpc-header-forward-pattern``: gRPC call metadata whose name this regex matches
    (anywhere in the name) is added to each inference request as string parameters
    (``frontend.header_forward``); "" forwards none."""
    http_header_forward_pattern: str = ""
    """``--http-header-forward-pattern``: as ``grpc_header_forward_pattern``, for HTTP
    ``infer`` request headers."""
    grpc_use_ssl: bool = False
    """``--grpc-use-ssl``: serve gRPC over TLS with ``grpc_server_cert``/``grpc_server_key``."""
    grpc_use_ssl_mutual: bool = False
    """``--grpc-use-ssl-mutual``: TLS that requires a client certificate signed by
    ``grpc_root_cert`` (implies ``grpc_use_ssl``)."""
    grpc_server_cert: str = ""
    """``--grpc-server-cert``: PEM file."""
    grpc_server_key: str = ""
    """``--grpc-server-key``: PEM file."""
    grpc_root_cert: str = ""
    """``--grpc-root-cert``: PEM file (client certificates' root)."""
    grpc_compression_level: Literal["none", "low", "medium", "high"] = "none"
    """``--grpc-infer-response-compression-level``: grpc core's default compression level
    of responses (for clients that accept a compressed encoding)."""
    grpc_channel_args: dict[str, int] = {}
    """The gRPC keepalive flags (``--grpc-keepalive-time`` ...) as grpc core channel
    arguments (``grpc.keepalive_time_ms`` ...); only those given."""
    exit_on_error: bool = False
    """``--exit-on-error``: stop with Triton's "failed to load all models" when a model
    fails to load at start. tritonserver's default is true; ``triton-mp start`` keeps
    serving the others unless the flag is given (``triton-mp-tritonserver`` defaults to
    true, see ``cli.main.start``)."""
    strict_readiness: bool = True
    """``--strict-readiness``: ServerReady only when every model is ready (a model
    unloaded on request does not count, as in Triton); false: when the server is live."""
    metrics_address: str = ""
    """``--metrics-address``; empty: ``http_address``, as Triton reuses the HTTP address."""
    metrics_port: Port = 8002
    """``--metrics-port``: Prometheus metrics (``GET /metrics``), served by frontend 0."""
    allow_metrics: bool = True
    """``--allow-metrics``: false serves nothing on the metrics port."""
    allow_cpu_metrics: bool = True
    """``--allow-cpu-metrics``: the ``nv_cpu_*`` gauges."""
    allow_gpu_metrics: bool = True
    """``--allow-gpu-metrics``: the ``nv_gpu_*`` gauges and ``nv_energy_consumption`` of
    every GPU this server sees (``common.process.gpus``); nothing where there is none."""
    metrics_interval_ms: Annotated[int, Meta(gt=0)] = 2000
    """``--metrics-interval-ms``: how often the CPU and GPU gauges are sampled."""
    metrics_config: tuple[tuple[str, str], ...] = ()
    """``--metrics-config`` (setting, value) pairs in order; acted on:
    ``histogram_latencies=true`` (``frontend.metrics.latency``)."""
    min_compute_capability: Annotated[float, Meta(ge=0)] = 6.0
    """``--min-supported-compute-capability``: GPUs below it cannot be named by instance
    groups (Triton's TRITON_MIN_COMPUTE_CAPABILITY by default, ``common.process.gpus``)."""
    frontend_processes: Annotated[int, Meta(ge=1, le=64)] = 1
    frontend_spare: bool = True
    """``--frontend-spare``: keep one frontend process started ahead, its code imported,
    to take a dead frontend's place (``supervisor.processes.frontend_restart``); without
    it a restart starts a process from scratch, and the server spends neither the spare's
    memory nor the CPU-second of its imports after it starts serving."""
    grpc_frontend: Literal["native", "python"] = "native"
    """``--grpc-frontend``: the native server (``frontend.native``) owns the gRPC port and
    hands the Python server what it does not serve (the default; the Python server where
    the extension was not built), or the Python server owns it."""
    model_control_mode: Literal["none", "poll", "explicit"] = "none"
    allow_client_shm: bool = False
    """``--allow-client-shm``: serve the system shared memory extension (off by default, as
    in Triton since server PR #8721: a register call is refused UNSUPPORTED)."""
    client_shm_prefix: str = ""
    """``--client-shm-prefix``: clients may register only shared-memory objects whose key
    starts with it (empty: any key); objects must also be owned by the server's user and
    never be triton-mp's own."""
    grpc_restricted: dict[str, tuple[str, str]] = {}
    """``--grpc-restricted-protocol``: category -> (header key, value); see ``restricted``."""
    http_restricted: dict[str, tuple[str, str]] = {}
    """``--http-restricted-api``: category -> (header key, value)."""
    host_policies: dict[str, dict[str, str]] = {}
    """``--host-policy <name>,<setting>=<value>``: policy name -> ``cpu-cores`` /
    ``numa-node`` -> value (``common.process.host_policy``); instances of groups with that
    ``host_policy`` (or Triton's default name) are pinned by it."""
    load_models: tuple[str, ...] = ()
    """``--load-model``: models loaded at start in explicit mode (``*`` = all)."""
    repository_poll_s: Annotated[float, Meta(ge=0)] = 15.0
    """``--repository-poll-secs``: how often poll mode rescans the repository."""
    exit_timeout_s: Annotated[float, Meta(ge=0)] = 30.0
    log_verbose: Annotated[int, Meta(ge=0)] = 0
    log_format: Literal["console", "json", "ISO8601"] = "console"
    """``--log-format``: ``ISO8601`` and ``console`` (also ``default``) both write console text;
    the logging extension answers ``ISO8601`` or ``default`` as Triton does."""
    log_info: bool = True
    """``--log-info``: INFO lines on (also ``log_warning``, ``log_error``; the logging
    extension changes them at run time)."""
    log_warning: bool = True
    log_error: bool = True
    server_id_name: str = "triton"
    """``--id``: the name ServerMetadata reports."""
    auto_complete: bool = True
    """False with ``--disable-auto-complete-config`` or ``--strict-model-config=true``."""
    default_max_batch_size: Annotated[int, Meta(ge=0)] = 4
    cache: CacheConfig | None = None
    """The response cache; None: no cache (``response_cache { enable: true }`` then does
    nothing, as in Triton)."""
    rate_limit: Literal["off", "execution_count"] = "off"
    """``--rate-limit``: ``execution_count`` makes executions wait for the resources their
    instance group's ``rate_limiter`` names and orders waiting instances by executions x
    priority (``scheduler.limits.rate_limiter``); ``off`` ignores every ``rate_limiter``."""
    rate_limit_resources: tuple[RateLimitResource, ...] = ()
    """``--rate-limit-resource``: the counts available; a resource not listed gets the
    largest count any instance asks for."""
    """``--backend-config=onnxruntime,default-max-batch-size=N``."""
    heartbeat_timeout_s: Annotated[float, Meta(ge=0)] = 30.0
    """``--heartbeat-timeout-secs``: a child that sends no heartbeat for this long is hung
    and is killed (a worker is then restarted); 0 turns heartbeats off. See
    ``ipc.memory.heartbeat`` for what stops a heartbeat (not a long-running ``execute``)."""
    startup_timeout_s: Annotated[float, Meta(gt=0)] = 120.0
    """How long each child may take to report ready."""
    input_arena_bytes: Annotated[int, Meta(ge=1 << 16)] = 16 << 20
    """First input arena of each frontend; later arenas grow as needed (each at least
    twice the block that needed it). Every arena's pages are reserved in ``/dev/shm`` when
    it is created, so this is what an idle frontend holds there once it has served."""
    output_arena_bytes: Annotated[int, Meta(ge=1 << 16)] = 4 << 20
    """First output arena of each worker (grows as the input arenas do)."""
    arena_budget_bytes: Annotated[int, Meta(ge=1 << 20)] = 4 << 30
    """``--arena-budget-bytes``: upper bound on the tensor arenas of one process (a
    frontend's input arenas, a worker's output arenas)."""
    ring_bytes: Annotated[int, Meta(ge=1 << 12)] = 1 << 20
    """Data area of each ring that carries requests or batches (frontend -> scheduler,
    scheduler -> worker, worker -> scheduler, scheduler -> frontend). A record may take at
    most half of it, which bounds one request's descriptor (its id and parameters, mostly).
    ``--ring-bytes``."""
    answer_ring_bytes: Annotated[int, Meta(ge=1 << 12)] = 64 << 10
    """Data area of each ring that carries only answers to requests (worker -> frontend,
    worker or scheduler -> a python worker's BLS inbox) or small control messages
    (supervisor -> worker and -> BLS inbox, frontend -> frontend): their count grows with the
    number of instances (BLS: python instances x instances) and frontends, and every ring's
    pages are reserved in ``/dev/shm``."""
    trace: TraceConfig = TraceConfig()
    """``--trace-config`` and the deprecated ``--trace-*`` flags: the starting trace
    settings (the frontends sample and write the traces)."""
    worker_ring_bytes: Annotated[int, Meta(ge=1 << 12)] = 256 << 10
    """Data area of each worker's ring to the scheduler (batch done notices, and the BLS
    requests of a python model)."""

    @property
    def repository_path(self) -> Path:
        """``model_repository`` as a Path."""
        return Path(self.model_repository)
