"""``triton-mp`` command line: ``start`` (serve a model repository), ``stat`` (watch its queues).

Imported by the console script. ``start`` parses flags with ``tritonserver``'s names and
defaults into a frozen ``ServerConfig`` and hands it to the supervisor; ``stat`` hands its
flags to ``triton_mp.cli.stat``. No serving or rendering logic lives here, and neither gRPC nor
rich is imported unless ``stat`` runs.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from pathlib import Path

import msgspec

from triton_mp.cli.serving_flags import add_cache_and_rate_limit, cache_and_rate_limit
from triton_mp.common.config import ServerConfig
from triton_mp.common.errors import TritonMPError
from triton_mp.common.host_policy import add_host_policy
from triton_mp.common.log import configure_logging
from triton_mp.common.trace_config import DeprecatedTraceFlags, TraceConfig, parse_trace_flags
from triton_mp.frontend.restricted import parse_restrictions

log = logging.getLogger(__name__)

DEFAULT_REPOSITORY = Path(__file__).resolve().parents[3] / "model_repository"
"""The project's own repository (a source checkout or an editable install)."""

_TRUE = {"true", "on", "1", "yes"}
_FALSE = {"false", "off", "0", "no"}


def _bool(text: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false/on/off/1/0), got '{text}'")


def _positive_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got '{text}'")
    return value


def _header(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> (key lowercased, as gRPC metadata keys are, value)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip().lower(), value


def _add_stat(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stat = sub.add_parser(
        "stat",
        help="show a running server's queues, instances and batches",
        description="Show a running triton-mp server's queues per model and priority level, "
        "its instances, the batch sizes formed and why batches closed.",
    )
    stat.add_argument("--url", default="localhost:8001", help="the server's gRPC host:port")
    stat.add_argument("--model", default="", help="one model only (default: every model)")
    stat.add_argument(
        "--header",
        action="append",
        default=[],
        type=_header,
        metavar="KEY=VALUE",
        help="gRPC metadata to send, e.g. triton-grpc-protocol-<key>=<value> for a server "
        "that restricts the statistics protocol (repeatable)",
    )
    mode = stat.add_mutually_exclusive_group()
    mode.add_argument(
        "--json", action="store_true", help="print one snapshot as JSON (for scripts)"
    )
    mode.add_argument("--watch", action="store_true", help="refresh like top until Ctrl-C")
    stat.add_argument(
        "--interval",
        type=_positive_s,
        default=1.0,
        metavar="S",
        help="seconds between --watch refreshes (default 1)",
    )


def _add_endpoints(start: argparse.ArgumentParser) -> None:
    """Where the frontends listen: gRPC, HTTP/REST and metrics (tritonserver's names)."""
    start.add_argument("--grpc-address", default="0.0.0.0")
    start.add_argument("--grpc-port", type=int, default=8001)
    start.add_argument("--http-address", default="0.0.0.0")
    start.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="KServe v2 HTTP/REST port, shared by every frontend process",
    )
    start.add_argument("--allow-http", type=_bool, default=True)
    start.add_argument(
        "--metrics-address",
        default="",
        help="address of the metrics endpoint (default: --http-address)",
    )
    start.add_argument(
        "--metrics-port", type=int, default=8002, help="Prometheus metrics port (GET /metrics)"
    )
    start.add_argument("--allow-metrics", type=_bool, default=True)
    start.add_argument("--allow-cpu-metrics", type=_bool, default=True)
    start.add_argument(
        "--allow-gpu-metrics",
        type=_bool,
        default=True,
        help="report nv_gpu_* metrics (utilization, memory, power, energy) per GPU",
    )
    start.add_argument("--metrics-interval-ms", type=int, default=2000)
    start.add_argument(
        "--frontend-processes",
        type=int,
        default=1,
        help="gRPC frontend processes sharing the port (SO_REUSEPORT)",
    )


def _add_repository(start: argparse.ArgumentParser) -> None:
    """The model repository, its control mode and how models' configs are completed."""
    start.add_argument(
        "--model-repository",
        "--model-store",
        dest="model_repository",
        default=None,
        help="model repository directory (default: the project's model_repository/)",
    )
    start.add_argument(
        "--model-control-mode", type=str.lower, default="none", choices=["none", "poll", "explicit"]
    )
    start.add_argument(
        "--load-model",
        action="append",
        default=[],
        dest="load_models",
        help="explicit mode: a model to load at start (repeatable; '*' loads all)",
    )
    start.add_argument(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        help="poll mode: seconds between rescans of the model repository",
    )
    start.add_argument("--disable-auto-complete-config", action="store_true")
    start.add_argument("--strict-model-config", type=_bool, default=False)
    start.add_argument(
        "--backend-config",
        action="append",
        default=[],
        help="<backend>,<key>=<value>; onnxruntime,default-max-batch-size=N",
    )


def _add_security(start: argparse.ArgumentParser) -> None:
    """Client shared memory and restricted protocols (Triton's security flags)."""
    start.add_argument(
        "--allow-client-shm",
        type=_bool,
        default=True,
        help="serve the system shared memory extension (default true; Triton >= 26.04 "
        "defaults to false)",
    )
    start.add_argument(
        "--client-shm-prefix",
        default="",
        help="system shared memory regions may only be registered from objects whose key "
        "starts with this (default: any key); they must be owned by the server's user",
    )
    start.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="<protocols>:<key>=<value>",
        help="answer these gRPC protocols (comma-separated: health, metadata, inference, "
        "shared-memory, model-config, model-repository, statistics, trace, logging) only "
        "to requests with the header triton-grpc-protocol-<key>: <value>; repeatable",
    )
    start.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="<apis>:<key>=<value>",
        help="answer these HTTP APIs (same names) only to requests with the header "
        "<key>: <value>; repeatable",
    )


def _add_limits_and_logs(start: argparse.ArgumentParser) -> None:
    """Resource limits, shutdown, hung-process detection and logging."""
    start.add_argument(
        "--arena-budget-bytes",
        type=int,
        default=4 << 30,
        help="most shared memory (/dev/shm) one process may hold for tensors: a frontend for "
        "request inputs, a worker for outputs (default 4 GiB); a request that can never fit "
        "fails with RESOURCE_EXHAUSTED, one that fits later with UNAVAILABLE",
    )
    start.add_argument(
        "--host-policy",
        action="append",
        default=[],
        metavar="<policy_name>,<setting>=<value>",
        help="a host policy setting: cpu-cores=<a>-<b>[,<c>...] pins the worker processes of "
        "instances with that policy to those CPUs, numa-node=<n> binds their memory to that "
        "node; instance groups name a policy with host_policy (default: cpu, gpu_<n>, "
        "model); repeatable",
    )
    start.add_argument("--exit-timeout-secs", type=float, default=30.0)
    start.add_argument(
        "--min-supported-compute-capability",
        type=float,
        default=6.0,
        help="GPUs of a lower CUDA compute capability are not used (default 6.0)",
    )
    start.add_argument(
        "--heartbeat-timeout-secs",
        type=float,
        default=30.0,
        help="kill (and restart) a process whose heartbeat thread has been silent this long: "
        "a stopped process or one stuck in C code holding the GIL; a long execute() is not "
        "hung (default 30, 0 = off)",
    )
    start.add_argument("--log-verbose", type=int, default=0)
    start.add_argument("--log-format", choices=["console", "json"], default="console")
    start.add_argument("--id", default="triton", dest="server_id_name")


def _add_analyze(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from triton_mp.analyze.options import add_arguments

    analyze = sub.add_parser(
        "analyze",
        help="sweep a model's config and recommend the best ones (like Model Analyzer)",
        description="Load config variants into a server, measure each with perf_analyzer, "
        "and write the best configs and a report.",
    )
    add_arguments(analyze)


def _run_analyze(args: argparse.Namespace) -> int:
    from triton_mp.analyze.checkpoint import CheckpointError
    from triton_mp.analyze.client import ServerError
    from triton_mp.analyze.options import settings_from_args
    from triton_mp.analyze.runner import run

    configure_logging("analyze", "", 0, "console")
    try:
        return run(settings_from_args(args))
    except (ValueError, ServerError, CheckpointError) as e:
        log.error("%s", e)
        return 1


def _add_trace(start: argparse.ArgumentParser) -> None:
    """Request tracing (tritonserver's ``--trace-config`` and its deprecated flags)."""
    start.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[<mode>,]<setting>=<value>",
        help="trace setting, repeatable: rate=N (every Nth request, default 1000), "
        "level=OFF|TIMESTAMPS|TENSORS (repeatable), count=N (-1 unlimited), "
        "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
        "opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, "
        "opentelemetry,bsp_max_queue_size|bsp_schedule_delay|bsp_max_export_batch_size=N",
    )
    start.add_argument("--trace-file", default=None, help="DEPRECATED: triton,file=")
    start.add_argument(
        "--trace-level", action="append", default=[], help="DEPRECATED: level= (repeatable)"
    )
    start.add_argument("--trace-rate", default=None, help="DEPRECATED: rate=")
    start.add_argument("--trace-count", default=None, help="DEPRECATED: count=")
    start.add_argument(
        "--trace-log-frequency", default=None, help="DEPRECATED: triton,log-frequency="
    )


def trace_config_from_args(args: argparse.Namespace) -> TraceConfig:
    """The trace flags -> ``TraceConfig``, logging Triton's warnings.

    Raises:
        TritonMPError: a value Triton refuses.
    """
    config, warnings = parse_trace_flags(
        args.trace_config,
        DeprecatedTraceFlags(
            file=args.trace_file,
            levels=tuple(args.trace_level),
            rate=args.trace_rate,
            count=args.trace_count,
            log_frequency=args.trace_log_frequency,
        ),
        os.environ,
    )
    for text in warnings:
        log.warning("%s", text)
    return config


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every sub-command."""
    parser = argparse.ArgumentParser(prog="triton-mp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="serve a Triton model repository")
    for add in (_add_repository, _add_endpoints, _add_security, _add_limits_and_logs, _add_trace):
        add(start)
    add_cache_and_rate_limit(start)
    _add_stat(sub)
    _add_analyze(sub)
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Validate parsed ``start`` flags into a ``ServerConfig``.

    Raises:
        TritonMPError: a flag combination Triton rejects too.
    """
    if args.load_models and args.model_control_mode != "explicit":
        raise TritonMPError(
            "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
        )
    default_mbs = 4
    for item in args.backend_config:
        backend, _, kv = item.partition(",")
        key, _, value = kv.partition("=")
        if backend == "onnxruntime" and key == "default-max-batch-size":
            default_mbs = int(value)
    repo = Path(args.model_repository) if args.model_repository else DEFAULT_REPOSITORY
    grpc_restricted = parse_restrictions(
        args.grpc_restricted_protocol, "--grpc-restricted-protocol"
    )
    http_restricted = parse_restrictions(args.http_restricted_api, "--http-restricted-api")
    host_policies: dict[str, dict[str, str]] = {}
    for item in args.host_policy:
        host_policies = add_host_policy(host_policies, item)
    trace = trace_config_from_args(args)
    try:
        return msgspec.convert(
            {
                "model_repository": str(repo),
                "grpc_address": args.grpc_address,
                "grpc_port": args.grpc_port,
                "http_address": args.http_address,
                "http_port": args.http_port,
                "allow_http": args.allow_http,
                "metrics_address": args.metrics_address,
                "metrics_port": args.metrics_port,
                "allow_metrics": args.allow_metrics,
                "allow_cpu_metrics": args.allow_cpu_metrics,
                "metrics_interval_ms": args.metrics_interval_ms,
                "allow_gpu_metrics": args.allow_gpu_metrics,
                "min_compute_capability": args.min_supported_compute_capability,
                "frontend_processes": args.frontend_processes,
                "model_control_mode": args.model_control_mode,
                "allow_client_shm": args.allow_client_shm,
                "client_shm_prefix": args.client_shm_prefix,
                "grpc_restricted": grpc_restricted,
                "http_restricted": http_restricted,
                "load_models": tuple(args.load_models),
                "host_policies": host_policies,
                "repository_poll_s": args.repository_poll_secs,
                "exit_timeout_s": args.exit_timeout_secs,
                "heartbeat_timeout_s": args.heartbeat_timeout_secs,
                "arena_budget_bytes": args.arena_budget_bytes,
                "log_verbose": args.log_verbose,
                "log_format": args.log_format,
                "server_id_name": args.server_id_name,
                "auto_complete": not (
                    args.disable_auto_complete_config or args.strict_model_config
                ),
                "default_max_batch_size": default_mbs,
                **cache_and_rate_limit(args),
                "trace": msgspec.to_builtins(trace),
            },
            ServerConfig,
        )
    except msgspec.ValidationError as e:
        raise TritonMPError(f"invalid flag: {e}") from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``triton-mp`` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "start":
        configure_logging("supervisor", "", args.log_verbose, args.log_format)
        try:
            config = config_from_args(args)
            if args.model_repository is None:
                from triton_mp.cli.assets import materialise_default_models

                materialise_default_models(config.repository_path)
            from triton_mp.supervisor.main import Supervisor

            return Supervisor(config).run()
        except TritonMPError as e:
            log.error("%s", e.message)
            return 1
    if args.command == "stat":
        from triton_mp.cli.stat import run_stat

        fetch = None
        if args.header:
            from triton_mp.cli.admin_client import fetch_queue_status

            fetch = functools.partial(fetch_queue_status, metadata=tuple(args.header))
        return run_stat(
            args.url,
            args.model,
            as_json=args.json,
            watch=args.watch,
            interval_s=args.interval,
            fetch=fetch,
        )
    if args.command == "analyze":
        return _run_analyze(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
