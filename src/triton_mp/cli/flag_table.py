"""Every ``tritonserver`` flag, and triton-mp's own, as one table (``FLAGS``).

Imported by ``cli.main``; parsed by ``cli.flags``. The rows of the endpoints (HTTP, gRPC,
the cloud endpoints, metrics) are ``cli.endpoint_flags``', triton-mp's own ``cli.mp_flags``';
they come here in usage order. The flags, their argument kinds and their checks are upstream
server's ``src/command_line_parser.cc`` (``TritonParser::SetupOptions`` and ``Parse``). Each
row says what the flag does here:

- ``dest`` set: triton-mp acts on it; ``cli.main.config_from_flags`` puts ``dest`` into the
  ``ServerConfig`` field of that name (a ``ServerConfig`` field with the same name is all a
  new flag needs there, unless its value must be reshaped);
- ``unused`` set: accepted, with one warning line when given (``NOT_YET`` for a flag whose
  meaning will be implemented: making it real is changing its row to a ``dest`` and adding
  the ``ServerConfig`` field).
"""

from __future__ import annotations

from triton_mp.cli.endpoint_flags import CLOUD_FLAGS, GRPC_FLAGS, HTTP_FLAGS, METRICS_FLAGS
from triton_mp.cli.flags import (
    BOOL,
    FLOAT,
    INT,
    INT_BOOL,
    NONE,
    NOT_YET,
    STR,
    Flag,
    backend_setting,
    non_empty,
    one_of,
)
from triton_mp.cli.mp_flags import MP_FLAGS

G_SERVER, G_REPO, G_LOG = "Server", "Model repository", "Logging"
G_TRACE, G_CACHE, G_RATE = "Tracing", "Cache", "Rate limiter"
G_MEM, G_SHM, G_BACKEND = "Memory/Device", "Shared memory", "Backend"

FLAGS: tuple[Flag, ...] = (
    Flag("help", NONE, help="Print usage", group=G_SERVER),
    Flag("id", STR, "server_id_name", "triton", help="ServerMetadata's name", group=G_SERVER),
    Flag(
        "exit-timeout-secs",
        FLOAT,
        "exit_timeout_s",
        30.0,
        help="seconds a stop waits for in-flight requests",
        group=G_SERVER,
    ),
    # ---------------------------------------------------------------- repository
    Flag(
        "model-store",
        STR,
        "model_repository",
        repeat=True,
        help="same as --model-repository",
        group=G_REPO,
    ),
    Flag(
        "model-repository",
        STR,
        "model_repository",
        repeat=True,
        help="the model repository directory (one; default: the project's model_repository/)",
        group=G_REPO,
    ),
    Flag(
        "exit-on-error",
        BOOL,
        "exit_on_error",
        None,
        help="exit when a model fails to load at start (default: true for "
        "triton-mp-tritonserver, as tritonserver; false for triton-mp start)",
        group=G_REPO,
    ),
    Flag(
        "disable-auto-complete-config",
        NONE,
        "disable_auto_complete",
        False,
        help="configs are not completed from the model files",
        group=G_REPO,
    ),
    Flag(
        "strict-readiness",
        BOOL,
        "strict_readiness",
        True,
        help="ServerReady only when every model is ready (an unloaded model does not count)",
        group=G_REPO,
    ),
    Flag(
        "model-control-mode",
        STR,
        "model_control_mode",
        "none",
        check=one_of("--model-control-mode", "none", "poll", "explicit"),
        help="none, poll or explicit",
        group=G_REPO,
    ),
    Flag(
        "repository-poll-secs",
        FLOAT,
        "repository_poll_s",
        15.0,
        help="poll mode: seconds between rescans of the repository",
        group=G_REPO,
    ),
    Flag(
        "load-model",
        STR,
        "load_models",
        repeat=True,
        help="explicit mode: a model to load at start (repeatable; '*' loads all)",
        group=G_REPO,
    ),
    Flag(
        "model-config-name",
        STR,
        unused=NOT_YET,
        check=non_empty("Error: empty argument for --model-config-name"),
        help="load configs/<name>.pbtxt instead of config.pbtxt where it exists",
        group=G_REPO,
    ),
    Flag(
        "model-load-thread-count",
        INT,
        unused="has no effect here: every model loads in its own worker processes, in parallel",
        group=G_REPO,
        help="threads loading models",
    ),
    Flag(
        "model-load-retry-count",
        INT,
        unused=NOT_YET,
        quiet=(0,),
        help="retries of a failed model load",
        group=G_REPO,
    ),
    Flag(
        "model-namespacing",
        BOOL,
        unused="has no effect here: triton-mp serves one repository, where names are unique",
        quiet=(False,),
        help="same-named models in different repositories",
        group=G_REPO,
    ),
    Flag(
        "enable-peer-access",
        BOOL,
        unused=NOT_YET,
        help="CUDA peer access between GPUs",
        group=G_REPO,
    ),
    Flag(
        "strict-model-config",
        BOOL,
        "strict_model_config",
        None,
        help="DEPRECATED: true is --disable-auto-complete-config",
        group=G_REPO,
    ),
    # ---------------------------------------------------------------------- HTTP
    *HTTP_FLAGS,
    *GRPC_FLAGS,
    # ------------------------------------------------------------------- logging
    Flag(
        "log-verbose",
        INT_BOOL,
        "log_verbose",
        0,
        help="> 0: per-request and per-batch detail",
        group=G_LOG,
    ),
    Flag("log-info", BOOL, "log_info", True, help="info lines", group=G_LOG),
    Flag("log-warning", BOOL, "log_warning", True, help="warning lines", group=G_LOG),
    Flag("log-error", BOOL, "log_error", True, help="error lines", group=G_LOG),
    Flag(
        "log-format",
        STR,
        "log_format",
        "console",
        check=one_of("--log-format", "default", "ISO8601", "console", "json", lower=False),
        help="default or ISO8601 (both: console lines with ISO 8601 times), or json",
        group=G_LOG,
    ),
    Flag("log-file", STR, "log_file", "", help="log to the end of this file", group=G_LOG),
    # ----------------------------------------------------------- cloud endpoints
    *CLOUD_FLAGS,
    *METRICS_FLAGS,
    # ------------------------------------------------------------------- tracing
    Flag(
        "trace-config",
        STR,
        "trace_config",
        repeat=True,
        arg="<string>,<string>=<string>",
        help="[<mode>,]<setting>=<value>: rate, level, count, mode, triton,file=..., "
        "triton,log-frequency=..., opentelemetry,url=...",
        group=G_TRACE,
    ),
    Flag("trace-file", STR, "trace_file", help="DEPRECATED: triton,file=", group=G_TRACE),
    Flag(
        "trace-level",
        STR,
        "trace_level",
        repeat=True,
        help="DEPRECATED: level= (repeatable)",
        group=G_TRACE,
    ),
    Flag("trace-rate", STR, "trace_rate", help="DEPRECATED: rate=", group=G_TRACE),
    Flag("trace-count", STR, "trace_count", help="DEPRECATED: count=", group=G_TRACE),
    Flag(
        "trace-log-frequency",
        STR,
        "trace_log_frequency",
        help="DEPRECATED: triton,log-frequency=",
        group=G_TRACE,
    ),
    # --------------------------------------------------------------------- cache
    Flag(
        "cache-config",
        STR,
        "cache_config",
        repeat=True,
        arg="<string>,<string>=<string>",
        help="<cache>,<setting>=<value>: local,size=<bytes> or redis,host=... / redis,port=...",
        group=G_CACHE,
    ),
    Flag(
        "cache-directory",
        STR,
        unused="has no effect here: the local and redis caches are built in",
        group=G_CACHE,
    ),
    Flag(
        "response-cache-byte-size",
        INT,
        "response_cache_byte_size",
        help="DEPRECATED: --cache-config=local,size=<bytes>",
        group=G_CACHE,
    ),
    # -------------------------------------------------------------- rate limiter
    Flag(
        "rate-limit",
        STR,
        "rate_limit",
        "off",
        check=lambda v: str(v).lower(),
        help="execution_count or off",
        group=G_RATE,
    ),
    Flag(
        "rate-limit-resource",
        STR,
        "rate_limit_resource",
        repeat=True,
        arg="<string>:<integer>:<integer>",
        help="<name>:<count>[:<device>]",
        group=G_RATE,
    ),
    # ------------------------------------------------------------ memory, device
    Flag("pinned-memory-pool-byte-size", INT, unused=NOT_YET, group=G_MEM),
    Flag("cuda-memory-pool-byte-size", STR, unused=NOT_YET, arg="<integer>:<integer>", group=G_MEM),
    Flag("cuda-virtual-address-size", STR, unused=NOT_YET, arg="<integer>:<integer>", group=G_MEM),
    Flag(
        "min-supported-compute-capability",
        FLOAT,
        "min_compute_capability",
        6.0,
        help="GPUs of a lower CUDA compute capability are not used (default 6.0)",
        group=G_MEM,
    ),
    Flag(
        "buffer-manager-thread-count",
        INT,
        unused="has no effect here: tensors are copied by the process that holds them",
        quiet=(0,),
        group=G_MEM,
    ),
    Flag(
        "host-policy",
        STR,
        "host_policy",
        repeat=True,
        arg="<string>,<string>=<string>",
        help="<policy>,<setting>=<value>: cpu-cores pins, numa-node binds the memory of the "
        "worker processes of instances with that policy",
        group=G_MEM,
    ),
    Flag("model-load-gpu-limit", STR, unused=NOT_YET, arg="<device_id>:<fraction>", group=G_MEM),
    # ------------------------------------------------------------- shared memory
    Flag(
        "allow-client-shm",
        BOOL,
        "allow_client_shm",
        False,
        help="serve the system shared memory extension (default false, as Triton since 26.04)",
        group=G_SHM,
    ),
    # ------------------------------------------------------------------ backends
    Flag(
        "backend-directory",
        STR,
        unused="has no effect here: the backends (onnxruntime, python) are built in",
        group=G_BACKEND,
    ),
    Flag(
        "backend-config",
        STR,
        "backend_config",
        repeat=True,
        check=backend_setting,
        arg="<string>,<string>=<string>",
        help="<backend>,<setting>=<value>; acted on: onnxruntime,default-max-batch-size=N",
        group=G_BACKEND,
    ),
    Flag(
        "repoagent-directory",
        STR,
        unused="has no effect here: triton-mp runs no repository agents",
        group=G_BACKEND,
    ),
    *MP_FLAGS,
)
"""Every flag ``triton-mp start`` and ``triton-mp-tritonserver`` accept, in usage order."""
