"""An over-long answer made record-sized (workers.tensors.answer_size) and an over-long exception
logged as plain text (common.process.log.cap_long_exception)."""

from __future__ import annotations

import sys

import msgspec

from triton_mp.common.errors import ErrorCode, cut_utf8
from triton_mp.common.process.log import LONG_EXCEPTION_CHARS, cap_long_exception
from triton_mp.ipc.protocol.messages import BlockRef, ErrorInfo, InferResponse
from triton_mp.workers.tensors.answer_size import ERROR_BYTES, fit_answer


def test_an_error_keeps_its_code_and_the_start_of_its_message() -> None:
    msg = InferResponse(
        request_id=7, version=2, final=False,
        error=ErrorInfo(ErrorCode.INVALID_ARG, "x" * 100_000, "worker m_0"),
    )  # fmt: skip
    small = fit_answer(msg, "worker m_0")
    assert (small.request_id, small.version, small.final) == (7, 2, False)
    assert small.error is not None
    assert small.error.code is ErrorCode.INVALID_ARG
    assert (
        small.error.message == "x" * ERROR_BYTES + f"... [{100_000 - ERROR_BYTES} more bytes cut]"
    )
    # NOTE: half the default answer ring (64 KiB) is the largest record
    assert len(msgspec.msgpack.encode(small)) < 32 << 10
    assert len(msgspec.msgpack.encode(fit_answer(msg, "w", 512))) < 1024


def test_huge_parameters_become_an_internal_error_without_outputs() -> None:
    block = BlockRef("seg", 64)
    msg = InferResponse(request_id=1, version=1, block=block, parameters_json="{" + "a" * 70_000)
    small = fit_answer(msg, "worker m_0")
    assert small.block is None
    assert small.outputs == ()
    assert small.parameters_json == ""
    assert small.error is not None
    assert small.error.code is ErrorCode.INTERNAL
    assert "response parameters of 70001 bytes are too large to send" in small.error.message


def test_a_short_message_is_not_cut_and_a_cut_keeps_whole_characters() -> None:
    assert cut_utf8("short", ERROR_BYTES) == "short"
    assert cut_utf8("é" * 5, 5) == "éé... [6 more bytes cut]"


def test_a_long_exception_is_logged_as_cut_plain_text() -> None:
    try:
        raise RuntimeError("E" * 50_000)
    except RuntimeError:
        event = cap_long_exception(None, "error", {"event": "x", "exc_info": sys.exc_info()})
    assert "exc_info" not in event
    text = event["exception"]
    assert text.startswith("Traceback (most recent call last):")
    assert f"... [{50_000 + len('RuntimeError: ') - LONG_EXCEPTION_CHARS} more characters]" in text
    assert len(text) < 3 * LONG_EXCEPTION_CHARS


def test_a_short_exception_keeps_rich_formatting() -> None:
    try:
        raise RuntimeError("short")
    except RuntimeError:
        info = sys.exc_info()
    event = cap_long_exception(None, "error", {"event": "x", "exc_info": info})
    assert event["exc_info"] is info
    assert "exception" not in event
