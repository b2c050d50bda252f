"""The flags of the endpoints a client reaches: HTTP/REST, gRPC, the cloud endpoints and metrics.

Imported by ``cli.flag_table``, which lists these rows in ``FLAGS`` where tritonserver's
usage lists them (``src/command_line_parser.cc``, ``TritonParser::SetupOptions``). Rows as
``cli.flag_table`` describes them: ``dest`` set, triton-mp acts on the flag; ``unused`` set,
accepted with one warning line when given.
"""

from __future__ import annotations

from triton_mp.cli.flags import (
    BOOL,
    FLOAT,
    INT,
    STR,
    Flag,
    in_range,
    metrics_setting,
    one_of,
    truncated_int,
)

NO_SAGEMAKER = "has no effect here: triton-mp serves no SageMaker endpoint"
NO_VERTEX = "has no effect here: triton-mp serves no Vertex AI endpoint"
NO_THREADS = "has no effect here: each frontend process serves every call on one event loop"
NO_POOL = "has no effect here: grpc.aio allocates each call's state"

G_HTTP, G_GRPC, G_CLOUD, G_METRICS = "HTTP", "GRPC", "Cloud", "Metrics"

HTTP_FLAGS: tuple[Flag, ...] = (
    Flag("allow-http", BOOL, "allow_http", True, help="serve HTTP/REST", group=G_HTTP),
    Flag("http-address", STR, "http_address", "0.0.0.0", help="HTTP bind address", group=G_HTTP),
    Flag("http-port", INT, "http_port", 8000, help="HTTP/REST port", group=G_HTTP),
    Flag(
        "reuse-http-port",
        BOOL,
        "reuse_http_port",
        False,
        help="other servers may share the HTTP port (no in-use check at start)",
        group=G_HTTP,
    ),
    Flag(
        "http-header-forward-pattern",
        STR,
        "http_header_forward_pattern",
        None,
        help="infer request headers whose name matches this regex (any case) become parameters",
        group=G_HTTP,
    ),
    Flag("http-thread-count", INT, unused=NO_THREADS, help="HTTP threads", group=G_HTTP),
    Flag(
        "http-max-input-size",
        INT,
        "http_max_input_bytes",
        64 << 20,
        check=in_range("Error: --http-max-input-size must be greater than 0.", 1),
        help="largest HTTP request body, compressed or inflated, in bytes (default 64 MiB)",
        group=G_HTTP,
    ),
    Flag(
        "http-restricted-api",
        STR,
        "http_restricted_api",
        repeat=True,
        arg="<string>:<string>=<string>",
        help="<apis>:<key>=<value>: these APIs answer only requests with header <key>: <value>",
        group=G_HTTP,
    ),
)
"""``--allow-http`` to ``--http-restricted-api``, in usage order."""

GRPC_FLAGS: tuple[Flag, ...] = (
    Flag("allow-grpc", BOOL, "allow_grpc", True, help="serve gRPC", group=G_GRPC),
    Flag("grpc-address", STR, "grpc_address", "0.0.0.0", help="gRPC bind address", group=G_GRPC),
    Flag("grpc-port", INT, "grpc_port", 8001, help="gRPC port", group=G_GRPC),
    Flag(
        "reuse-grpc-port",
        BOOL,
        "reuse_grpc_port",
        False,
        help="other servers may share the gRPC port (no in-use check at start)",
        group=G_GRPC,
    ),
    Flag(
        "grpc-header-forward-pattern",
        STR,
        "grpc_header_forward_pattern",
        None,
        help="gRPC metadata whose name matches this regex (any case) becomes request parameters",
        group=G_GRPC,
    ),
    Flag(
        "grpc-infer-thread-count",
        INT,
        unused=NO_THREADS,
        check=in_range(
            "invalid argument for --grpc_infer_thread_count. Must be in the range 2 to 128.",
            2,
            128,
        ),
        help="gRPC inference threads",
        group=G_GRPC,
    ),
    Flag(
        "grpc-infer-allocation-pool-size",
        INT,
        unused=NO_POOL,
        help="request/response states kept",
        group=G_GRPC,
    ),
    Flag(
        "grpc-max-response-pool-size",
        INT,
        unused=NO_POOL,
        check=in_range("Error: --grpc-max-response-pool-size must be greater than 0.", 1),
        help="response objects kept",
        group=G_GRPC,
    ),
    Flag("grpc-use-ssl", BOOL, "grpc_use_ssl", False, help="serve gRPC over TLS", group=G_GRPC),
    Flag(
        "grpc-use-ssl-mutual",
        BOOL,
        "grpc_use_ssl_mutual",
        False,
        help="TLS with client certificates (implies --grpc-use-ssl)",
        group=G_GRPC,
    ),
    Flag("grpc-server-cert", STR, "grpc_server_cert", "", help="PEM server cert", group=G_GRPC),
    Flag("grpc-server-key", STR, "grpc_server_key", "", help="PEM server key", group=G_GRPC),
    Flag("grpc-root-cert", STR, "grpc_root_cert", "", help="PEM root cert", group=G_GRPC),
    Flag(
        "grpc-infer-response-compression-level",
        STR,
        "grpc_compression_level",
        "none",
        check=one_of("--grpc_infer_response_compression_level", "none", "low", "medium", "high"),
        help="none, low, medium or high: compression of gRPC responses",
        group=G_GRPC,
    ),
    Flag(
        "grpc-keepalive-time",
        INT,
        "grpc_keepalive_time_ms",
        help="ms between keepalive pings (gRPC's default 7200000)",
        group=G_GRPC,
    ),
    Flag(
        "grpc-keepalive-timeout",
        INT,
        "grpc_keepalive_timeout_ms",
        help="ms to wait for a keepalive ack (default 20000)",
        group=G_GRPC,
    ),
    Flag(
        "grpc-keepalive-permit-without-calls",
        BOOL,
        "grpc_keepalive_permit_without_calls",
        help="keepalive pings without calls in flight (default false)",
        group=G_GRPC,
    ),
    Flag(
        "grpc-http2-max-pings-without-data",
        INT,
        "grpc_http2_max_pings_without_data",
        help="pings without data (default 2; 0 = no limit)",
        group=G_GRPC,
    ),
    Flag(
        "grpc-http2-min-recv-ping-interval-without-data",
        INT,
        "grpc_http2_min_recv_ping_interval_without_data_ms",
        help="least ms between pings without data before a strike (default 300000)",
        group=G_GRPC,
    ),
    Flag(
        "grpc-http2-max-ping-strikes",
        INT,
        "grpc_http2_max_ping_strikes",
        help="bad pings before GOAWAY (default 2; 0 = any)",
        group=G_GRPC,
    ),
    Flag(
        "grpc-max-connection-age",
        INT,
        "grpc_max_connection_age_ms",
        help="ms a connection may exist",
        group=G_GRPC,
    ),
    Flag(
        "grpc-max-connection-age-grace",
        INT,
        "grpc_max_connection_age_grace_ms",
        help="ms of grace after the max age",
        group=G_GRPC,
    ),
    Flag(
        "grpc-restricted-protocol",
        STR,
        "grpc_restricted_protocol",
        repeat=True,
        arg="<string>:<string>=<string>",
        help="<protocols>:<key>=<value>: these answer only calls with "
        "triton-grpc-protocol-<key>: <value>",
        group=G_GRPC,
    ),
)
"""``--allow-grpc`` to ``--grpc-restricted-protocol``, in usage order."""

CLOUD_FLAGS: tuple[Flag, ...] = (
    Flag("allow-sagemaker", BOOL, unused=NO_SAGEMAKER, quiet=(False,), group=G_CLOUD),
    Flag("sagemaker-port", INT, unused=NO_SAGEMAKER, group=G_CLOUD),
    Flag(
        "sagemaker-safe-port-range",
        STR,
        unused=NO_SAGEMAKER,
        arg="<integer>-<integer>",
        group=G_CLOUD,
    ),
    Flag("sagemaker-thread-count", INT, unused=NO_SAGEMAKER, group=G_CLOUD),
    Flag("allow-vertex-ai", BOOL, unused=NO_VERTEX, quiet=(False,), group=G_CLOUD),
    Flag("vertex-ai-port", INT, unused=NO_VERTEX, group=G_CLOUD),
    Flag("vertex-ai-thread-count", INT, unused=NO_VERTEX, group=G_CLOUD),
    Flag("vertex-ai-default-model", STR, unused=NO_VERTEX, group=G_CLOUD),
)
"""SageMaker's and Vertex AI's endpoints, accepted with a warning."""

METRICS_FLAGS: tuple[Flag, ...] = (
    Flag("allow-metrics", BOOL, "allow_metrics", True, help="serve /metrics", group=G_METRICS),
    Flag(
        "allow-gpu-metrics",
        BOOL,
        "allow_gpu_metrics",
        True,
        help="nv_gpu_* gauges and nv_energy_consumption of every GPU this server sees",
        group=G_METRICS,
    ),
    Flag(
        "allow-cpu-metrics",
        BOOL,
        "allow_cpu_metrics",
        True,
        help="nv_cpu_* gauges",
        group=G_METRICS,
    ),
    Flag(
        "metrics-address",
        STR,
        "metrics_address",
        "",
        help="metrics bind address (default: --http-address)",
        group=G_METRICS,
    ),
    Flag("metrics-port", INT, "metrics_port", 8002, help="metrics port", group=G_METRICS),
    Flag(
        "metrics-interval-ms",
        FLOAT,
        "metrics_interval_ms",
        2000,
        check=truncated_int,
        help="ms between samples of the CPU gauges",
        group=G_METRICS,
    ),
    Flag(
        "metrics-config",
        STR,
        "metrics_config",
        repeat=True,
        check=metrics_setting,
        arg="<string>=<string>",
        help="<setting>=<value>; acted on: histogram_latencies=true",
        group=G_METRICS,
    ),
)
"""``--allow-metrics`` to ``--metrics-config``, in usage order."""
