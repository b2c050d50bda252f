"""``frontend.http.json_errors``: RapidJSON's message and byte offset for bodies that are not
JSON, as Triton 2.51 answered them (tests/e2e/test_triton_http_messages.py runs the same
cases against both servers)."""

from __future__ import annotations

import pytest

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.http.json_errors import rapidjson_error
from triton_mp.frontend.http.json_tensors import decode_json


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"a": 1}x', "The document root must not be followed by other values. at 8"),
        (b"   ", "The document is empty. at 3"),
        (b"", "The document is empty. at 0"),
        (b"{1}", "Missing a name for object member. at 1"),
        (b'{"a": 1,}', "Missing a name for object member. at 8"),
        (b'{"a" 1}', "Missing a colon after a name of object member. at 5"),
        (b'{"a": 1 "b": 2}', "Missing a comma or '}' after an object member. at 8"),
        (b'{"a": 1', "Missing a comma or '}' after an object member. at 7"),
        (b"[1 2]", "Missing a comma or ']' after an array element. at 3"),
        (b"[1,]", "Invalid value. at 3"),
        (b'{"a": tru}', "Invalid value. at 9"),
        (b'{"a": -}', "Invalid value. at 7"),
        (b'{"a": "x', "Missing a closing quotation mark in string. at 8"),
        (b'{"a": "\\q"}', "Invalid escape character in string. at 7"),
        (b'["\\u12g4"]', "Incorrect hex digit after \\u escape in string. at 2"),
        (b'["\\ud800x"]', "The surrogate pair in string is invalid. at 2"),
        (b'["a\x01"]', "Invalid escape character in string. at 3"),  # NOTE: 2.51's words
        (b"[1e400]", "Number too big to be stored in double. at 1"),
        (b"[2, -1e999]", "Number too big to be stored in double. at 4"),
        (b"[Nax]", "Invalid value. at 3"),
        (b"[In]", "Invalid value. at 3"),
        (b"[Infin]", "Invalid value. at 6"),
        (b"\xef\xbb\xbf{1}", "Missing a name for object member. at 4"),
        (b"  \xef\xbb\xbf{}", "Invalid value. at 2"),
        (b"\x00{}", "The document is empty. at 0"),
        (b'["a\x00b"]', "Missing a closing quotation mark in string. at 3"),
        (b'{"a": 1.}', "Miss fraction part in number. at 8"),
        (b"[1e+]", "Miss exponent in number. at 4"),
    ],
)
def test_rapidjsons_message_and_offset(body: bytes, error: str) -> None:
    assert rapidjson_error(body) == error
    with pytest.raises(TritonMPError) as e:
        decode_json(body)
    assert (e.value.code, e.value.message) == (
        ErrorCode.INTERNAL,
        f"failed to parse the request JSON buffer: {error}",
    )


@pytest.mark.parametrize("body", [b'{"a": [1, 2.5e-3, "\\u00e9\\ud83d\\ude00", null]}', b" 0 "])
def test_json_passes(body: bytes) -> None:
    assert rapidjson_error(body) is None


@pytest.mark.parametrize(
    ("body", "value"),
    [
        (b"[NaN, -NaN, Inf, -Inf, Infinity, -Infinity]", "[nan, nan, inf, -inf, inf, -inf]"),
        (b'\xef\xbb\xbf{"a": 1}', "{'a': 1}"),
        (b'{"a": 1}\x00whatever', "{'a': 1}"),
        (b"[1e-400]", "[0.0]"),
    ],
)
def test_what_rapidjson_reads_and_msgspec_refuses_is_read(body: bytes, value: str) -> None:
    # TritonJson parses with kParseNanAndInfFlag; RapidJSON skips a byte-order mark and stops
    # at a NUL byte (2.51 side by side in tests/e2e/test_triton_http_messages.py)
    assert rapidjson_error(body) is None
    assert repr(decode_json(body)) == value
