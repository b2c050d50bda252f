"""``--trace-config`` and the deprecated ``--trace-*`` flags: Triton's rules and error texts
(tritonserver 2.51's ``command_line_parser.cc``, checked against the real binary)."""

from __future__ import annotations

import pytest

from triton_mp.cli.main import config_from_flags, parse_flags
from triton_mp.common.errors import TritonMPError
from triton_mp.common.trace_config import (
    DeprecatedTraceFlags,
    TraceLevel,
    parse_trace_flags,
)


def parse(*args: str, old: DeprecatedTraceFlags | None = None, env: dict | None = None):  # type: ignore[no-untyped-def]
    return parse_trace_flags(list(args), old or DeprecatedTraceFlags(), env or {})


def test_defaults_are_tritons() -> None:
    config, warnings = parse()
    assert (config.level, config.rate, config.count, config.log_frequency) == (0, 1000, -1, 0)
    assert config.mode == "triton"
    assert config.file == ""
    assert not warnings
    assert not config.enabled


def test_global_and_triton_settings() -> None:
    config, _ = parse(
        "triton,file=/tmp/t.json",
        "triton,log-frequency=50",
        "rate=100",
        "level=TIMESTAMPS",
        "level=TENSORS",
        "count=7",
    )
    assert config.file == "/tmp/t.json"
    assert config.log_frequency == 50
    assert config.rate == 100
    assert config.count == 7
    assert config.level == TraceLevel.TIMESTAMPS | TraceLevel.TENSORS


def test_an_explicit_off_wins() -> None:
    config, _ = parse("level=TIMESTAMPS", "level=OFF")
    assert config.level == 0


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("rate=abc", 'Bad option: "--trace-config rate".\nInvalid option value. Got abc'),
        ("count=x", 'Bad option: "--trace-config count".\nInvalid option value. Got x'),
        (
            "foo,rate=1",
            'Bad option: "--trace-config".\ninvalid value for trace mode option: foo. '
            'Available options are "triton" and "opentelemetry"',
        ),
        (
            ",rate=1",
            "No trace mode specified. --trace-config option format is "
            "<trace mode>,<setting>=<value> or <setting>=<value>. Got ,rate=1",
        ),
        ("rate", "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate"),
        ("rate=", "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate="),
        (
            "level=bogus",
            'Bad option: "--trace-config level".\ninvalid value for trace level option: bogus',
        ),
        (
            "triton,log-frequency=x",
            'Bad option: "--trace-config triton,log-frequency".\nInvalid option value. Got x',
        ),
        (
            "rate=99999999999",
            'Bad option: "--trace-config rate".\n'
            "Provided option value is out of bound. Got 99999999999",
        ),
    ],
)
def test_bad_values_get_tritons_errors(arg: str, message: str) -> None:
    with pytest.raises(TritonMPError) as e:
        parse(arg)
    assert e.value.message == message


def test_deprecated_flags_map_and_warn_and_lose_to_trace_config() -> None:
    old = DeprecatedTraceFlags(file="/a", levels=("TIMESTAMPS",), rate="5", count="3")
    config, warnings = parse("rate=9", old=old)
    assert (config.file, config.level, config.rate, config.count) == ("/a", 4, 9, 3)
    assert any("'--trace-file' has been deprecated" in w for w in warnings)
    assert any("Overriding deprecated '--trace-rate'" in w for w in warnings)


def test_a_mode_setting_without_its_mode_is_ignored_with_a_warning() -> None:
    # Triton 2.51 and main (SetGlobalTraceArgs) ignore it; tests/e2e/test_triton_http_messages
    config, warnings = parse("log-frequency=1", "triton,file=/t")
    assert (config.log_frequency, config.file) == (0, "/t")
    assert any("'<trace mode>,log-frequency=1'" in w for w in warnings)


def test_opentelemetry_settings_and_bsp_environment() -> None:
    config, warnings = parse(
        "mode=opentelemetry",
        "level=TIMESTAMPS",
        "opentelemetry,url=http://h:1/v1/traces",
        "opentelemetry,resource=service.name=svc",
        "opentelemetry,resource=a=b",
        "opentelemetry,bsp_max_export_batch_size=3",
        old=DeprecatedTraceFlags(file="/ignored"),
        env={"OTEL_BSP_SCHEDULE_DELAY": "10"},
    )
    assert config.mode == "opentelemetry"
    assert config.otel_url == "http://h:1/v1/traces"
    assert config.otel_resource == (("service.name", "svc"), ("a", "b"))
    assert (config.bsp_max_export_batch_size, config.bsp_schedule_delay_ms) == (3, 10)
    assert config.bsp_max_queue_size == 2048
    assert config.file == ""
    assert any("ignored with opentelemetry" in w for w in warnings)
    with pytest.raises(TritonMPError, match="bsp_max_queue_size"):
        parse("mode=opentelemetry", "opentelemetry,bsp_max_queue_size=-1")


def test_the_cli_puts_the_trace_flags_in_the_config() -> None:
    parsed = parse_flags(
        ["--trace-config", "rate=1", "--trace-level", "TIMESTAMPS", "--trace-file", "/f"]
    )
    assert parsed.warnings == []
    config = config_from_flags(parsed.values)
    assert (config.trace.rate, config.trace.level, config.trace.file) == (1, 4, "/f")
