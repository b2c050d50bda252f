"""Header forwarding (``frontend.header_forward``): which headers a pattern selects, the
reserved names refused, the merge into the backend's parameters, and the flags reaching the
config (upstream server ``ForwardHeadersAsParameters`` / ``ForwardHeaders``)."""

from __future__ import annotations

import json

import pytest

from triton_mp.cli.main import config_from_flags, parse_flags
from triton_mp.common.errors import ErrorCode, InvalidRequest
from triton_mp.frontend.header_forward import (
    RESERVED_PARAMETER_KEYS,
    HeaderForward,
    check_forwarded,
    merge_forwarded,
    pattern_error,
)

HEADERS = (
    ("user-agent", "grpc-python/1.0"),
    ("my-header", "a"),
    ("x-my-header-2", "b"),
    ("My-Upper", "c"),
    ("other", "d"),
)


def test_the_pattern_matches_anywhere_in_the_name() -> None:
    # RE2::PartialMatch: "my-" matches "x-my-header-2" too; the regex itself is
    # case-sensitive (the CLI adds the (?i) tritonserver's parser adds).
    assert HeaderForward("my-").select(HEADERS) == (("my-header", "a"), ("x-my-header-2", "b"))
    assert HeaderForward("^my-").select(HEADERS) == (("my-header", "a"),)
    assert HeaderForward("(?i)^my-").select(HEADERS) == (("my-header", "a"), ("My-Upper", "c"))
    assert HeaderForward("^other$").select(HEADERS) == (("other", "d"),)
    assert HeaderForward("(?i)").select(HEADERS) == HEADERS


def test_no_pattern_or_an_invalid_one_forwards_nothing() -> None:
    assert not HeaderForward("").active
    assert HeaderForward("").select(HEADERS) == ()
    assert pattern_error("(") != ""
    assert pattern_error("my-.*") == ""
    assert not HeaderForward("(").active
    assert HeaderForward("(").select(HEADERS) == ()


def test_binary_metadata_and_nul_bytes_pass_as_c_strings() -> None:
    # tritonserver forwards a -bin key's decoded bytes via c_str(): up to the first NUL.
    got = HeaderForward("my").select(
        [("my-bin", b"ab\x00cd"), ("my-u-bin", b"\xff!"), ("my-s", "v")]
    )
    assert got == (("my-bin", "ab"), ("my-u-bin", "\ufffd!"), ("my-s", "v"))


def test_patterns_are_re2_s() -> None:
    # Python's re would accept these; RE2 (and so tritonserver) refuses them.
    for pattern in ("(?=my)m", "(?<=x)y", "(a)\\1"):
        assert pattern_error(pattern) != ""
        assert not HeaderForward(pattern).active
    # And RE2's own syntax, which re lacks, is accepted.
    assert pattern_error("\\Cmy") == ""
    assert HeaderForward("[[:alpha:]]+-a$").select([("my-a", "1"), ("1-a", "2")]) == (
        ("my-a", "1"),
    )


@pytest.mark.parametrize("name", [*RESERVED_PARAMETER_KEYS, "triton_anything", "triton_"])
def test_reserved_names_are_refused_in_tritons_words(name: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        check_forwarded([("ok", "1"), (name, "x")])
    assert e.value.code is ErrorCode.INVALID_ARG
    assert e.value.message == (
        f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
    )


def test_names_near_reserved_ones_pass() -> None:
    check_forwarded([("Priority", "1"), ("x-triton_a", "1"), ("triton-b", "1"), ("timeouts", "")])


def test_headers_merge_after_the_parameters_and_the_last_value_wins() -> None:
    merged = json.loads(
        merge_forwarded(
            json.dumps({"keep": 1, "my-header": "from-parameter"}),
            [("my-header", "first"), ("my-new", "n"), ("my-header", "last")],
        )
    )
    assert merged == {"keep": 1, "my-header": "last", "my-new": "n"}
    assert merge_forwarded('{"a": true}', ()) == '{"a": true}'
    assert json.loads(merge_forwarded("{}", [("h", "v")])) == {"h": "v"}


def test_the_flags_reach_the_config_case_insensitive_and_an_invalid_regex_warns() -> None:
    parsed = parse_flags(
        ["--grpc-header-forward-pattern=MY-.*", "--http-header-forward-pattern", "("]
    )
    cfg = config_from_flags(parsed.values)
    # tritonserver's command_line_parser.cc: case_insensitive_prefix + optarg.
    assert cfg.grpc_header_forward_pattern == "(?i)MY-.*"
    assert HeaderForward(cfg.grpc_header_forward_pattern).select([("my-a", "1")]) == (
        ("my-a", "1"),
    )
    assert cfg.http_header_forward_pattern == "(?i)("
    assert len(parsed.warnings) == 1
    assert parsed.warnings[0].startswith("'--http-header-forward-pattern=(' is not a valid regex (")
    assert parsed.warnings[0].endswith("): no header is forwarded")
    quiet = parse_flags(["--grpc-header-forward-pattern=my-.*"])
    assert quiet.warnings == []
    assert config_from_flags(parse_flags([]).values).http_header_forward_pattern == ""
    # Given empty: "(?i)", which matches every header (as in tritonserver).
    given_empty = config_from_flags(parse_flags(["--http-header-forward-pattern="]).values)
    assert given_empty.http_header_forward_pattern == "(?i)"
