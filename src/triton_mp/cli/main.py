"""``triton-mp`` command line: serve a Triton model repository, and watch, tune and trace it.

Imported by the console scripts. ``start`` parses tritonserver's flags (``cli.flags``,
``cli.flag_table``) into a frozen ``ServerConfig`` and hands it to the supervisor
(``triton-mp-tritonserver`` is the same with tritonserver's argv unchanged); ``stat`` hands
its flags to ``triton_mp.cli.stat``. No serving or rendering logic lives here, and neither gRPC nor
rich is imported unless ``stat`` runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
from pathlib import Path

import msgspec

from triton_mp.cli.flag_table import FLAGS
from triton_mp.cli.flags import NOT_YET, FlagError, Parsed, parse, usage
from triton_mp.cli.serving_flags import cache_and_rate_limit
from triton_mp.common.config import ServerConfig
from triton_mp.common.errors import TritonMPError
from triton_mp.common.process.host_policy import add_host_policy
from triton_mp.common.process.log import configure_logging, log_to_file
from triton_mp.common.trace_config import DeprecatedTraceFlags, TraceConfig, parse_trace_flags
from triton_mp.frontend.header_forward import CASE_INSENSITIVE, pattern_error
from triton_mp.frontend.restricted import parse_restrictions

log = logging.getLogger(__name__)

DEFAULT_REPOSITORY = Path(__file__).resolve().parents[3] / "model_repository"
"""The project's own repository (a source checkout or an editable install)."""


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


def _add_analyze(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from triton_mp.analyze.options import add_arguments

    analyze = sub.add_parser(
        "analyze",
        help="measure a model's config variants, recommend the best",
        description="Load config variants into a server, measure each with perf_analyzer, "
        "and write the best configs and a report.",
    )
    add_arguments(analyze)


def _run_analyze(args: argparse.Namespace) -> int:
    from triton_mp.analyze.options import settings_from_args
    from triton_mp.analyze.probe.client import ServerError
    from triton_mp.analyze.runner import run
    from triton_mp.analyze.sweep.checkpoint import CheckpointError

    configure_logging("analyze", "", 0, "console")
    try:
        repo = args.model_repository
        if repo is not None and Path(repo).resolve() == DEFAULT_REPOSITORY.resolve():
            # NOTE: as `start` does for its default repository: the OCR and VAD model files
            # come from wheels and are not in git
            from triton_mp.cli.assets import materialise_default_models

            materialise_default_models(DEFAULT_REPOSITORY)
        return run(settings_from_args(args))
    except TritonMPError as e:
        log.error("%s", e.message)
        return 1
    except (ValueError, ServerError, CheckpointError) as e:
        log.error("%s", e)
        return 1


def trace_config_from_args(args: argparse.Namespace) -> TraceConfig:
    """The trace flags' values (``trace_config``, ``trace_file``, ``trace_level``,
    ``trace_rate``, ``trace_count``, ``trace_log_frequency``) -> ``TraceConfig``, logging
    Triton's warnings.

    Raises:
        TritonMPError: a value Triton refuses.
    """
    config, warnings = parse_trace_flags(
        list(args.trace_config),
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


def _add_trace_tools(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    trace = sub.add_parser(
        "trace",
        help="read a trace file: per-model summary or a timeline",
        description="Read the trace file a server wrote with --trace-config triton,file=PATH.",
    )
    tools = trace.add_subparsers(dest="trace_command", required=True)
    summary = tools.add_parser(
        "summary", help="per model: mean, p50 and p99 of each phase of the traced requests"
    )
    summary.add_argument("file", type=Path)
    timeline = tools.add_parser(
        "timeline",
        help="write the Chrome trace-event format (Perfetto, chrome://tracing), one track "
        "per process",
    )
    timeline.add_argument("file", type=Path)
    timeline.add_argument("-o", "--output", type=Path, required=True)


def _run_trace_tools(args: argparse.Namespace) -> int:
    from triton_mp.cli import trace_tools

    try:
        traces = trace_tools.load(args.file)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.trace_command == "summary":
        sys.stdout.write(trace_tools.summary(traces))
        return 0
    doc = trace_tools.timeline(traces)
    args.output.write_text(json.dumps(doc))
    print(f"{args.output}: {len(traces)} traces; open it in https://ui.perfetto.dev")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every sub-command (``start`` takes its flags through
    ``cli.flags``, tritonserver's grammar; argparse only routes them)."""
    parser = argparse.ArgumentParser(
        prog="triton-mp",
        description="triton-mp: a Triton-compatible inference server, a pool of processes "
        "that talk through shared memory. Each command takes --help.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    start = sub.add_parser(
        "start",
        help="serve a Triton model repository (tritonserver's flags)",
        add_help=False,
    )
    start.add_argument("flags", nargs=argparse.REMAINDER)
    _add_stat(sub)
    _add_analyze(sub)
    _add_trace_tools(sub)
    return parser


_KEEPALIVE = {
    "grpc_keepalive_time_ms": "grpc.keepalive_time_ms",
    "grpc_keepalive_timeout_ms": "grpc.keepalive_timeout_ms",
    "grpc_keepalive_permit_without_calls": "grpc.keepalive_permit_without_calls",
    "grpc_http2_max_pings_without_data": "grpc.http2.max_pings_without_data",
    "grpc_http2_min_recv_ping_interval_without_data_ms": (
        "grpc.http2.min_ping_interval_without_data_ms"
    ),
    "grpc_http2_max_ping_strikes": "grpc.http2.max_ping_strikes",
    "grpc_max_connection_age_ms": "grpc.max_connection_age_ms",
    "grpc_max_connection_age_grace_ms": "grpc.max_connection_age_grace_ms",
}
"""The gRPC keepalive flags' dests -> the grpc core channel argument each sets (Triton's
``grpc::KeepAliveOptions``)."""

_RESHAPED = frozenset(
    {
        "model_repository",
        "disable_auto_complete",
        "strict_model_config",
        "http_restricted_api",
        "grpc_restricted_protocol",
        "grpc_header_forward_pattern",
        "http_header_forward_pattern",
        "backend_config",
        "cache_config",
        "response_cache_byte_size",
        "rate_limit",
        "rate_limit_resource",
        "host_policy",
        "trace_config",
        "log_file",
        "trace_file",
        "trace_level",
        "trace_rate",
        "trace_count",
        "trace_log_frequency",
        *_KEEPALIVE,
    }
)
"""Flag dests ``config_from_flags`` turns into other ``ServerConfig`` fields; every other
dest is the ``ServerConfig`` field of its name."""

ACTED_BACKEND_CONFIG = {("onnxruntime", "default-max-batch-size")}
"""``--backend-config`` settings triton-mp acts on; others get one warning each."""


def parse_flags(argv: list[str], prog: str = "tritonserver") -> Parsed:
    """``argv`` (tritonserver's flags) against ``flag_table.FLAGS``.

    Raises:
        FlagError: tritonserver's message for this command line.
    """
    parsed = parse(argv, FLAGS, prog)
    if "strict-model-config" in parsed.given:
        parsed.warnings.insert(
            0,
            "'--strict-model-config' has been deprecated! Please use "
            "'--disable-auto-complete-config' instead.",
        )
    for flag in ("grpc-header-forward-pattern", "http-header-forward-pattern"):
        pattern = parsed.values[flag.replace("-", "_")]
        if isinstance(pattern, str) and (why := pattern_error(CASE_INSENSITIVE + pattern)):
            # NOTE: Triton's RE2 logs the parse error and the pattern matches nothing.
            parsed.warnings.append(
                f"'--{flag}={pattern}' is not a valid regex ({why}): no header is forwarded"
            )
    for backend, setting, value in parsed.values["backend_config"]:  # type: ignore[attr-defined]
        if (backend, setting) not in ACTED_BACKEND_CONFIG:
            flag = f"--backend-config={backend + ',' if backend else ''}{setting}={value}"
            parsed.warnings.append(f"'{flag}' is accepted but {NOT_YET}")
    for setting, value in parsed.values["metrics_config"]:  # type: ignore[attr-defined]
        if setting != "histogram_latencies":
            flag = f"--metrics-config={setting}={value}"
            parsed.warnings.append(f"'{flag}' is accepted but {NOT_YET}")
    return parsed


def forward_patterns(values: dict[str, object]) -> dict[str, str]:
    """The header forward patterns as the frontends use them: tritonserver's parser
    prefixes a given pattern with ``(?i)`` (matched in any case; given empty, it matches
    every header); not given: "" (none forwarded)."""
    out = {}
    for dest in ("grpc_header_forward_pattern", "http_header_forward_pattern"):
        given = values[dest]
        out[dest] = "" if given is None else CASE_INSENSITIVE + str(given)
    return out


def config_from_flags(values: dict[str, object]) -> ServerConfig:
    """Parsed flags (``Parsed.values``) as a ``ServerConfig``.

    Raises:
        TritonMPError: a flag combination Triton rejects too (its message), or one
            triton-mp cannot serve.
    """
    if values["load_models"] and values["model_control_mode"] != "explicit":
        raise TritonMPError(
            "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
        )
    repos = values["model_repository"]
    assert isinstance(repos, tuple)
    if len(set(repos)) > 1:
        raise TritonMPError(
            "triton-mp serves one model repository; --model-repository was given "
            f"{len(set(repos))}: {', '.join(repos)}"
        )
    default_mbs = 4
    for backend, setting, value in values["backend_config"]:  # type: ignore[attr-defined]
        if (backend, setting) == ("onnxruntime", "default-max-batch-size"):
            default_mbs = int(value)
    host_policies: dict[str, dict[str, str]] = {}
    for item in values["host_policy"]:  # type: ignore[attr-defined]
        host_policies = add_host_policy(host_policies, item)
    namespace = argparse.Namespace(**values)
    trace = trace_config_from_args(namespace)
    fields = {k: v for k, v in values.items() if k not in _RESHAPED and v is not None}
    fields["log_format"] = (
        values["log_format"] if values["log_format"] in ("json", "ISO8601") else "console"
    )
    try:
        return msgspec.convert(
            {
                **fields,
                "model_repository": str(repos[-1] if repos else DEFAULT_REPOSITORY),
                "grpc_restricted": parse_restrictions(
                    list(values["grpc_restricted_protocol"]),  # type: ignore[call-overload]
                    "--grpc-restricted-protocol",
                ),
                "http_restricted": parse_restrictions(
                    list(values["http_restricted_api"]),  # type: ignore[call-overload]
                    "--http-restricted-api",
                ),
                "grpc_channel_args": {
                    arg: int(values[dest])  # type: ignore[call-overload]
                    for dest, arg in _KEEPALIVE.items()
                    if values[dest] is not None
                },
                **forward_patterns(values),
                "auto_complete": not (
                    values["disable_auto_complete"] or values["strict_model_config"]
                ),
                "default_max_batch_size": default_mbs,
                "host_policies": host_policies,
                **cache_and_rate_limit(namespace),
                "trace": msgspec.to_builtins(trace),
            },
            ServerConfig,
        )
    except msgspec.ValidationError as e:
        raise TritonMPError(f"invalid flag: {e}") from None


def start(argv: list[str], prog: str, *, repository_required: bool = False) -> int:
    """Serve with tritonserver's flags ``argv``; ``prog`` names the command in messages.
    ``repository_required``: refuse a command line without ``--model-repository`` (or
    ``--model-store``) as tritonserver does; ``triton-mp start`` serves the project's own.

    Returns:
        The exit status: 1 for a command line tritonserver refuses (its message on stderr,
        ``--help`` too, as tritonserver), else the server's.
    """
    try:
        parsed = parse_flags(argv, prog)
    except FlagError as e:
        print(f"{e}\nUsage: {prog} [options] (--help lists them)", file=sys.stderr)
        return 1
    if parsed.help:
        print(usage(FLAGS, prog), file=sys.stderr)
        return 1
    values = parsed.values
    if repository_required and not values["model_repository"]:
        # NOTE: tritonserver 2.51 prints this when it creates the server, after its table
        print(
            "error: creating server: Invalid argument - --model-repository must be specified",
            file=sys.stderr,
        )
        return 1
    if values["exit_on_error"] is None:
        # NOTE: tritonserver exits on a failed load unless told not to; tools that launch
        # it by path get that default, `triton-mp start` keeps serving the other models.
        values["exit_on_error"] = repository_required
    log_file = str(values["log_file"] or "")
    # NOTE: stderr is pointed at the file before any child starts, so all of them log there.
    log_file_failed = log_to_file(log_file) if log_file else ""
    configure_logging(
        "supervisor",
        "",
        values["log_verbose"],  # type: ignore[arg-type]
        values["log_format"],  # type: ignore[arg-type]
        levels=(bool(values["log_info"]), bool(values["log_warning"]), bool(values["log_error"])),
        file="" if log_file_failed else log_file,
    )
    if log_file_failed:
        # NOTE: tritonserver ignores the failure silently (main.cc drops SetLogFile's error)
        # and logs to the console; we say so once.
        log.warning(
            "failed to open log file '%s': %s; logging to stderr", log_file, log_file_failed
        )
    for line in parsed.warnings:
        log.warning("%s", line)
    try:
        config = config_from_flags(values)
        if is_project_repository(config.repository_path):
            from triton_mp.cli.assets import materialise_default_models

            materialise_default_models(config.repository_path)
        from triton_mp.supervisor.main import Supervisor

        return Supervisor(config).run()
    except TritonMPError as e:
        log.error("%s", e.message)
        return 1


def is_project_repository(path: Path) -> bool:
    """Whether ``path`` is the project's own ``model_repository`` (however it was named)."""
    try:
        return path.resolve() == DEFAULT_REPOSITORY.resolve()
    except OSError:
        return False


def tritonserver_main(argv: list[str] | None = None) -> int:
    """Entry point of ``triton-mp-tritonserver``: tritonserver's argv, unchanged (no
    ``start`` word), for tools that launch a ``tritonserver`` binary by path."""
    return start(sys.argv[1:] if argv is None else argv, "tritonserver", repository_required=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``triton-mp`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["start"]:
        # NOTE: not through argparse: tritonserver's grammar (cli.flags) is not argparse's.
        return start(argv[1:], "triton-mp start")
    args = build_parser().parse_args(argv)
    if args.command == "trace":
        return _run_trace_tools(args)
    if args.command == "stat":
        from triton_mp.cli.stat import run_stat

        fetch = None
        if args.header:
            from triton_mp.cli.admin_client import fetch_queue_snapshot

            fetch = functools.partial(fetch_queue_snapshot, metadata=tuple(args.header))
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
