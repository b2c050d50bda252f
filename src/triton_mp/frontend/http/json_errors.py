"""Where and why a request body is not JSON, in RapidJSON's words (Triton's parser).

Imported by ``frontend.http.json_tensors``, only after msgspec refused a body, so it never
runs on the hot path. Triton parses request JSON with RapidJSON (common ``triton_json.h``
``Value::Parse``) and answers INTERNAL (HTTP 500) "failed to parse the request JSON buffer:
<GetParseError_En(code)> at <byte offset>". ``rapidjson_error`` walks the bytes as
RapidJSON's ``GenericReader`` does with TritonJson's flags (``kParseNanAndInfFlag``: ``NaN``,
``Inf`` and ``Infinity`` with an optional ``-`` are numbers; no comments, no trailing
commas; a UTF-8 byte-order mark is skipped; the input ends at its length or at a NUL byte)
and returns the first error with its offset. ``rapidjson_decode`` reads a body RapidJSON
takes and msgspec refused (those literals, a byte-order mark, bytes after a NUL).
"""

from __future__ import annotations

import json
import math
from typing import Any

MESSAGES = {
    "empty": "The document is empty.",
    "not_singular": "The document root must not be followed by other values.",
    "value": "Invalid value.",
    "miss_name": "Missing a name for object member.",
    "miss_colon": "Missing a colon after a name of object member.",
    "miss_comma_brace": "Missing a comma or '}' after an object member.",
    "miss_comma_bracket": "Missing a comma or ']' after an array element.",
    "hex": "Incorrect hex digit after \\u escape in string.",
    "surrogate": "The surrogate pair in string is invalid.",
    "escape": "Invalid escape character in string.",
    "quote": "Missing a closing quotation mark in string.",
    "encoding": "Invalid encoding in string.",
    "fraction": "Miss fraction part in number.",
    "exponent": "Miss exponent in number.",
    "too_big": "Number too big to be stored in double.",
}
"""RapidJSON's ``GetParseError_En`` texts for the errors the scanner finds."""

_WS = b" \n\r\t"
_ESCAPES = b'"\\/bfnrt'
_HEX = b"0123456789abcdefABCDEF"
_DIGITS = b"0123456789"


class _Error(Exception):
    def __init__(self, kind: str, offset: int) -> None:
        super().__init__(kind)
        self.kind, self.offset = kind, offset


class _Scanner:
    """RapidJSON's reader over ``data``: ``peek`` is 0 at the end, as its stream's NUL."""

    def __init__(self, data: bytes, start: int = 0) -> None:
        self.data, self.i = data, start
        self.special: list[tuple[int, int, str]] = []
        """(start, end, Python json's spelling) of each NaN / Inf literal."""

    def peek(self) -> int:
        return self.data[self.i] if self.i < len(self.data) else 0

    def consume(self, c: bytes) -> bool:
        if self.peek() == c[0]:
            self.i += 1
            return True
        return False

    def skip_ws(self) -> None:
        while self.i < len(self.data) and self.data[self.i] in _WS:
            self.i += 1

    def value(self) -> None:
        c = self.peek()
        if c == ord("{"):
            self.obj()
        elif c == ord("["):
            self.array()
        elif c == ord('"'):
            self.string()
        elif c in (ord("n"), ord("t"), ord("f")):
            word = {ord("n"): b"null", ord("t"): b"true", ord("f"): b"false"}[c]
            self.i += 1
            for ch in word[1:]:
                if not self.consume(bytes([ch])):
                    raise _Error("value", self.i)
        else:
            self.number()

    def obj(self) -> None:
        self.i += 1
        self.skip_ws()
        if self.consume(b"}"):
            return
        while True:
            if self.peek() != ord('"'):
                raise _Error("miss_name", self.i)
            self.string()
            self.skip_ws()
            if not self.consume(b":"):
                raise _Error("miss_colon", self.i)
            self.skip_ws()
            self.value()
            self.skip_ws()
            if self.consume(b","):
                self.skip_ws()
            elif self.consume(b"}"):
                return
            else:
                raise _Error("miss_comma_brace", self.i)

    def array(self) -> None:
        self.i += 1
        self.skip_ws()
        if self.consume(b"]"):
            return
        while True:
            self.value()
            self.skip_ws()
            if self.consume(b","):
                self.skip_ws()
            elif self.consume(b"]"):
                return
            else:
                raise _Error("miss_comma_bracket", self.i)

    def hex4(self, escape_at: int) -> int:
        digits = self.data[self.i : self.i + 4]
        if len(digits) < 4 or any(d not in _HEX for d in digits):
            raise _Error("hex", escape_at)
        self.i += 4
        return int(digits, 16)

    def string(self) -> None:
        self.i += 1
        while True:
            c = self.peek()
            if c == ord("\\"):
                escape_at = self.i
                self.i += 1
                e = self.peek()
                if e and e in _ESCAPES:
                    self.i += 1
                elif e == ord("u"):
                    self.i += 1
                    self.surrogates(self.hex4(escape_at), escape_at)
                else:
                    raise _Error("escape", escape_at)
            elif c == ord('"'):
                self.i += 1
                return
            elif c == 0:
                raise _Error("quote", self.i)
            elif c < 0x20:
                # NOTE: Triton's RapidJSON says "Invalid escape character" here (2.51).
                raise _Error("escape", self.i)
            else:
                self.i += 1

    def surrogates(self, code: int, escape_at: int) -> None:
        if not 0xD800 <= code <= 0xDFFF:
            return
        if code > 0xDBFF or not (self.consume(b"\\") and self.consume(b"u")):
            raise _Error("surrogate", escape_at)
        if not 0xDC00 <= self.hex4(escape_at) <= 0xDFFF:
            raise _Error("surrogate", escape_at)

    def digits(self) -> None:
        while self.peek() and self.peek() in _DIGITS:
            self.i += 1

    def number(self) -> None:
        start = self.i
        minus = self.consume(b"-")
        if self.peek() in (ord("N"), ord("I")):
            self.nan_or_inf(start, minus)
            return
        self.numeral(start)

    def nan_or_inf(self, start: int, minus: bool) -> None:
        """``NaN``, ``Inf`` or ``Infinity`` (kParseNanAndInfFlag); the error offset is
        where RapidJSON stops matching."""
        word = b"NaN" if self.peek() == ord("N") else b"Inf"
        for ch in word:
            if not self.consume(bytes([ch])):
                raise _Error("value", self.i)
        if word == b"Inf" and self.consume(b"i"):
            for ch in b"nity":
                if not self.consume(bytes([ch])):
                    raise _Error("value", self.i)
        spelling = "NaN" if word == b"NaN" else ("-Infinity" if minus else "Infinity")
        self.special.append((start, self.i, spelling))

    def numeral(self, start: int) -> None:
        if not self.consume(b"0"):
            if not (self.peek() and self.peek() in b"123456789"):
                raise _Error("value", self.i)
            self.digits()
        if self.consume(b"."):
            if not (self.peek() and self.peek() in _DIGITS):
                raise _Error("fraction", self.i)
            self.digits()
        if self.consume(b"e") or self.consume(b"E"):
            if not self.consume(b"+"):
                self.consume(b"-")
            if not (self.peek() and self.peek() in _DIGITS):
                raise _Error("exponent", self.i)
            self.digits()
        if math.isinf(float(self.data[start : self.i])):
            raise _Error("too_big", start)


_BOM = b"\xef\xbb\xbf"


def _scan(data: bytes) -> _Scanner:
    """Walk ``data`` as RapidJSON reads a document.

    Raises:
        _Error: RapidJSON's first error.
    """
    scanner = _Scanner(data.split(b"\0", 1)[0], 3 if data.startswith(_BOM) else 0)
    scanner.skip_ws()
    if scanner.peek() == 0:
        raise _Error("empty", scanner.i)
    scanner.value()
    scanner.skip_ws()
    if scanner.peek() != 0:
        raise _Error("not_singular", scanner.i)
    return scanner


def rapidjson_error(data: bytes | memoryview) -> str | None:
    """RapidJSON's "<message> at <offset>" for the first error in ``data``; None when
    RapidJSON would read it (``rapidjson_decode`` then reads it, but for invalid UTF-8,
    which RapidJSON passes on and msgspec refuses)."""
    try:
        _scan(bytes(data))
    except _Error as e:
        return f"{MESSAGES[e.kind]} at {e.offset}"
    except RecursionError:
        return None  # NOTE: nested past the interpreter's limit: msgspec's words then
    return None


def rapidjson_decode(data: bytes | memoryview) -> Any:
    """A body RapidJSON reads, decoded: the document up to a NUL byte, after a byte-order
    mark, ``NaN`` / ``Inf`` / ``Infinity`` as floats. Only for bodies msgspec refused and
    ``rapidjson_error`` passed (Python's json: slower, never on the hot path).

    Raises:
        ValueError: what Python's json refuses (invalid UTF-8).
    """
    raw = bytes(data)
    scanner = _scan(raw)
    text = scanner.data
    if scanner.special:
        parts, pos = [], 0
        for start, end, spelling in scanner.special:
            parts += [text[pos:start], spelling.encode()]
            pos = end
        text = b"".join([*parts, text[pos:]])
    return json.loads(text.removeprefix(_BOM).decode("utf-8"))
