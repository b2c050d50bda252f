"""tritonserver's command line: every flag accepted, its grammar, its messages, the flags
Model Analyzer, KServe and ModelMesh pass (``cli.flags``, ``cli.flag_table``, ``cli.main``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec
import pytest

from triton_mp.cli.flag_table import FLAGS
from triton_mp.cli.flags import NOT_YET, FlagError, Kind, parse, usage
from triton_mp.cli.main import (
    _RESHAPED,
    DEFAULT_REPOSITORY,
    config_from_flags,
    is_project_repository,
    parse_flags,
    tritonserver_main,
)
from triton_mp.common.config import ServerConfig
from triton_mp.common.errors import TritonMPError

# Every long option of upstream server's src/command_line_parser.cc (SetupOptions), main
# as of 2026-08: what tritonserver accepts.
TRITONSERVER_FLAGS = """
help id exit-timeout-secs model-store model-repository exit-on-error
disable-auto-complete-config strict-readiness model-control-mode repository-poll-secs
load-model model-config-name model-load-thread-count model-load-retry-count
model-namespacing enable-peer-access allow-http http-address http-port reuse-http-port
http-header-forward-pattern http-thread-count http-max-input-size http-restricted-api
allow-grpc grpc-address grpc-port reuse-grpc-port grpc-header-forward-pattern
grpc-infer-thread-count grpc-infer-allocation-pool-size grpc-max-response-pool-size
grpc-use-ssl grpc-use-ssl-mutual grpc-server-cert grpc-server-key grpc-root-cert
grpc-infer-response-compression-level grpc-keepalive-time grpc-keepalive-timeout
grpc-keepalive-permit-without-calls grpc-http2-max-pings-without-data
grpc-http2-min-recv-ping-interval-without-data grpc-http2-max-ping-strikes
grpc-max-connection-age grpc-max-connection-age-grace grpc-restricted-protocol
log-verbose log-info log-warning log-error log-format log-file allow-sagemaker
sagemaker-port sagemaker-safe-port-range sagemaker-thread-count allow-vertex-ai
vertex-ai-port vertex-ai-thread-count vertex-ai-default-model allow-metrics
allow-gpu-metrics allow-cpu-metrics metrics-address metrics-port metrics-interval-ms
metrics-config trace-config cache-config cache-directory rate-limit rate-limit-resource
pinned-memory-pool-byte-size cuda-memory-pool-byte-size cuda-virtual-address-size
min-supported-compute-capability buffer-manager-thread-count host-policy
model-load-gpu-limit allow-client-shm backend-directory backend-config
repoagent-directory strict-model-config response-cache-byte-size trace-file trace-level
trace-rate trace-count trace-log-frequency
""".split()  # noqa: SIM905 - the list as the source lists it

SAMPLE = {Kind.STR: "x", Kind.INT: "4", Kind.FLOAT: "2.5", Kind.BOOL: "true", Kind.INT_BOOL: "1"}
VALID = {
    "model-control-mode": "explicit",
    "log-format": "ISO8601",
    "grpc-infer-response-compression-level": "low",
    "rate-limit": "off",
    "backend-config": "python,shm-default-byte-size=1048576",
    "grpc-restricted-protocol": "health:k=v",
    "http-restricted-api": "health:k=v",
    "grpc-infer-thread-count": "8",
    "metrics-config": "histogram_latencies=true",
}


def _arg(name: str) -> list[str]:
    flag = {f.name: f for f in FLAGS}[name]
    if flag.kind is Kind.NONE:
        return [f"--{name}"]
    return [f"--{name}={VALID.get(name, SAMPLE[flag.kind])}"]


def test_the_table_has_every_tritonserver_flag_once() -> None:
    names = [f.name for f in FLAGS]
    assert len(names) == len(set(names))
    assert set(TRITONSERVER_FLAGS) - set(names) == set()


@pytest.mark.parametrize("name", [n for n in TRITONSERVER_FLAGS if n != "help"])
def test_every_tritonserver_flag_is_accepted_in_both_forms(name: str) -> None:
    (arg,) = _arg(name)
    eq = parse([arg], FLAGS)
    if "=" in arg:
        key, _, value = arg.partition("=")
        assert parse([key, value], FLAGS).values == eq.values
    assert eq.given == [name]


def test_every_flag_is_acted_on_or_warns_and_every_dest_reaches_the_config() -> None:
    fields = set(ServerConfig.__struct_fields__)
    for f in FLAGS:
        if f.name == "help":
            continue
        assert bool(f.dest) != bool(f.unused), f.name
        if f.dest:
            assert f.dest in fields or f.dest in _RESHAPED, f"{f.name}: {f.dest} goes nowhere"


def test_an_unused_flag_warns_once_unless_its_value_is_what_we_do() -> None:
    parsed = parse(
        ["--allow-sagemaker=false", "--allow-vertex-ai=false", "--rate-limit=off"], FLAGS
    )
    assert parsed.warnings == []
    parsed = parse(
        ["--pinned-memory-pool-byte-size=1", "--pinned-memory-pool-byte-size", "2"], FLAGS
    )
    assert parsed.warnings == [f"'--pinned-memory-pool-byte-size' is accepted but {NOT_YET}"]
    parsed = parse(["--allow-sagemaker=true"], FLAGS)
    assert parsed.warnings == [
        "'--allow-sagemaker' is accepted but has no effect here: triton-mp serves no SageMaker "
        "endpoint"
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--foo=1"], "tritonserver: unrecognized option '--foo=1'"),
        (["--model-repository=/m", "extra"], "Unexpected argument: extra"),
        (["--", "extra"], "Unexpected argument: extra"),
        (["-x"], "tritonserver: invalid option -- 'x'"),
        (["--grpc-port=abc"], 'Bad option: "--grpc-port".\nInvalid option value. Got abc'),
        (
            ["--allow-http=maybe"],
            'Bad option: "--allow-http".\ninvalid value for bool option: maybe',
        ),
        (["--grpc-port"], "tritonserver: option '--grpc-port' requires an argument"),
        (
            ["--disable-auto-complete-config=true"],
            "tritonserver: option '--disable-auto-complete-config' doesn't allow an argument",
        ),
        (
            ["--model-control-mode=sometimes"],
            'Bad option: "--model-control-mode".\ninvalid argument for --model-control-mode',
        ),
        (
            ["--log-format=iso8601"],
            'Bad option: "--log-format".\ninvalid argument for --log-format',
        ),
        (
            ["--grpc-infer-thread-count=1"],
            'Bad option: "--grpc-infer-thread-count".\ninvalid argument for '
            "--grpc_infer_thread_count. Must be in the range 2 to 128.",
        ),
        (
            ["--http-max-input-size=0"],
            'Bad option: "--http-max-input-size".\nError: --http-max-input-size must be greater '
            "than 0.",
        ),
        (
            ["--grpc-max-response-pool-size=0"],
            'Bad option: "--grpc-max-response-pool-size".\nError: --grpc-max-response-pool-size '
            "must be greater than 0.",
        ),
        (
            ["--backend-config=,a=b"],
            'Bad option: "--backend-config".\nNo backend specified. --backend-config option '
            "format is <backend name>,<setting>=<value> or <setting>=<value>. Got ,a=b",
        ),
        (
            ["--backend-config=python,nothing"],
            'Bad option: "--backend-config".\n--backend-config option format is '
            "'<backend name>,<setting>=<value>'. Got python,nothing",
        ),
        (
            ["--model-config-name="],
            'Bad option: "--model-config-name".\nError: empty argument for --model-config-name',
        ),
        (
            ["--grpc-s=a"],
            "tritonserver: option '--grpc-s=a' is ambiguous; possibilities: "
            "'--grpc-server-cert' '--grpc-server-key'",
        ),
    ],
)
def test_refusals_are_worded_as_tritonserver(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError) as e:
        parse(argv, FLAGS)
    assert str(e.value) == message


def test_grammar_booleans_prefixes_repeats_and_last_wins() -> None:
    parsed = parse(
        [
            "--allow-http=OFF",
            "--allow-metrics",
            "On",
            "--model-repo=/a",  # a unique prefix, as getopt_long takes it
            "--load-model=x",
            "--load-model",
            "y",
            "--grpc-port=1",
            "--grpc-port=2",
            "--log-verbose=true",
            "--metrics-interval-ms=1500.7",
        ],
        FLAGS,
    )
    v = parsed.values
    assert (v["allow_http"], v["allow_metrics"]) == (False, True)
    assert v["model_repository"] == ("/a",)
    assert v["load_models"] == ("x", "y")
    assert v["grpc_port"] == 2
    assert v["log_verbose"] == 1
    assert v["metrics_interval_ms"] == 1500  # stoi, as Triton reads it


def _config(*argv: str) -> ServerConfig:
    return config_from_flags(parse_flags(list(argv)).values)


def test_kserve_serving_runtime_flags() -> None:
    argv = [
        "--model-store=/mnt/models",
        "--grpc-port=9000",
        "--http-port=8080",
        "--allow-grpc=true",
        "--allow-http=true",
    ]
    parsed = parse_flags(argv)
    assert parsed.warnings == []
    cfg = config_from_flags(parsed.values)
    assert (cfg.model_repository, cfg.grpc_port, cfg.http_port) == ("/mnt/models", 9000, 8080)
    assert cfg.allow_grpc
    assert cfg.allow_http


def test_model_analyzer_local_mode_flags() -> None:
    parsed = parse_flags(
        [
            "--model-repository",
            "/tmp/output_model_repository",
            "--http-port",
            "8000",
            "--grpc-port",
            "8001",
            "--metrics-port",
            "8002",
            "--model-control-mode",
            "explicit",
            "--strict-model-config=false",
            "--metrics-interval-ms",
            "1000",
        ]
    )
    assert parsed.warnings == [
        "'--strict-model-config' has been deprecated! Please use "
        "'--disable-auto-complete-config' instead."
    ]
    cfg = config_from_flags(parsed.values)
    assert cfg.auto_complete
    assert cfg.metrics_interval_ms == 1000
    assert cfg.model_control_mode == "explicit"
    assert not _config("--strict-model-config=true").auto_complete
    assert not _config("--disable-auto-complete-config").auto_complete


def test_modelmesh_flags_and_grpc_keepalive_become_channel_arguments() -> None:
    parsed = parse_flags(
        [
            "--model-store=/models/_triton_models",
            "--model-control-mode=explicit",
            "--strict-readiness=false",
            "--allow-http=true",
            "--allow-sagemaker=false",
            "--grpc-keepalive-time=60000",
            "--grpc-keepalive-timeout=10000",
            "--grpc-keepalive-permit-without-calls=true",
            "--grpc-http2-max-pings-without-data=0",
            "--grpc-http2-min-recv-ping-interval-without-data=5000",
            "--grpc-http2-max-ping-strikes=0",
        ]
    )
    assert parsed.warnings == []
    cfg = config_from_flags(parsed.values)
    assert cfg.strict_readiness is False
    assert cfg.grpc_channel_args == {
        "grpc.keepalive_time_ms": 60000,
        "grpc.keepalive_timeout_ms": 10000,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
        "grpc.http2.min_ping_interval_without_data_ms": 5000,
        "grpc.http2.max_ping_strikes": 0,
    }
    assert _config().grpc_channel_args == {}


def test_post_parse_checks() -> None:
    with pytest.raises(TritonMPError, match="requires setting '--model-control-mode=explicit'"):
        _config("--load-model=a")
    with pytest.raises(TritonMPError, match="serves one model repository"):
        _config("--model-repository=/a", "--model-store=/b")
    assert _config("--model-repository=/a", "--model-store=/a").model_repository == "/a"
    assert _config().model_repository == str(DEFAULT_REPOSITORY)
    cfg = _config("--backend-config=onnxruntime,default-max-batch-size=2")
    assert cfg.default_max_batch_size == 2
    parsed = parse_flags(["--backend-config=python,shm-default-byte-size=1"])
    assert parsed.warnings == [
        f"'--backend-config=python,shm-default-byte-size=1' is accepted but {NOT_YET}"
    ]
    # ISO8601 writes console text; the logging extension answers "ISO8601", as Triton does
    assert _config("--log-format=ISO8601").log_format == "ISO8601"
    assert _config("--log-format=default").log_format == "console"
    assert _config("--log-format=json").log_format == "json"
    with pytest.raises(TritonMPError, match="invalid flag"):
        _config("--grpc-port=70000")


def test_usage_lists_every_flag_and_help_exits_1_as_tritonserver(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = usage(FLAGS)
    assert text.startswith("Usage: tritonserver [options]")
    for name in TRITONSERVER_FLAGS:
        assert f"  --{name}" in text
    assert tritonserver_main(["--help"]) == 1
    assert "--grpc-keepalive-time <integer>" in capsys.readouterr().err
    assert tritonserver_main(["--nope"]) == 1
    assert "tritonserver: unrecognized option '--nope'" in capsys.readouterr().err


def test_the_console_script_is_declared() -> None:
    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["triton-mp-tritonserver"] == "triton_mp.cli.main:tritonserver_main"


def test_the_projects_repository_is_recognised_however_named(tmp_path: Path) -> None:
    assert is_project_repository(DEFAULT_REPOSITORY)
    rel = Path("model_repository")
    assert is_project_repository(DEFAULT_REPOSITORY.parent / rel / ".." / rel)
    assert not is_project_repository(tmp_path)


def test_server_config_round_trips_through_msgspec() -> None:
    cfg = _config("--grpc-use-ssl=true", "--grpc-server-cert=c", "--grpc-server-key=k")
    assert msgspec.convert(msgspec.to_builtins(cfg), ServerConfig) == cfg


def test_the_tritonserver_entry_point_refuses_no_repository_as_tritonserver_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from triton_mp.cli.main import tritonserver_main

    assert tritonserver_main(["--http-port=0"]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: creating server: Invalid argument - --model-repository must be specified"
    )


def test_exit_on_error_reaches_the_config() -> None:
    """``--exit-on-error`` is acted on (ServerConfig.exit_on_error); absent, it is left to
    the entry point (None), which ``cli.main.start`` resolves."""
    assert parse_flags([]).values["exit_on_error"] is None
    values = parse_flags(["--exit-on-error=true"]).values
    assert values["exit_on_error"] is True
    assert config_from_flags(values).exit_on_error is True
    assert config_from_flags(parse_flags(["--exit-on-error=false"]).values).exit_on_error is False
    assert not parse_flags(["--exit-on-error=true"]).warnings


def test_ring_bytes_sizes_the_request_rings_and_refuses_less_than_a_page() -> None:
    # A request's id and parameters travel in a record of at most half a request ring.
    assert _config().ring_bytes == 1 << 20
    assert _config("--ring-bytes=33554432").ring_bytes == 32 << 20
    with pytest.raises(FlagError, match="--ring-bytes must be at least 4096"):
        parse_flags(["--ring-bytes=4095"])


def test_metrics_config_acts_on_histogram_latencies_and_warns_of_the_rest() -> None:
    parsed = parse_flags(
        ["--metrics-config=histogram_latencies=true", "--metrics-config", "summary_latencies=true"]
    )
    assert parsed.values["metrics_config"] == (
        ("histogram_latencies", "true"),
        ("summary_latencies", "true"),
    )
    assert parsed.warnings == [
        f"'--metrics-config=summary_latencies=true' is accepted but {NOT_YET}"
    ]
    with pytest.raises(FlagError, match="option format is <setting>=<value>. Got a,b=1"):
        parse(["--metrics-config=a,b=1"], FLAGS)
