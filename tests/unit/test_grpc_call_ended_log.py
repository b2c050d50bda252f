"""grpc.aio's ERROR report of a reply to a call that grpc core had already ended (a deadline
or a cancel racing the reply) becomes one DEBUG line, shown only when verbose; every other
record of that logger passes as it was (frontend.grpc.server_setup.CallEndedFilter)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from triton_mp.frontend.grpc.server_setup import CALL_ENDED, GRPC_AIO_LOGGER, CallEndedFilter


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[_Keep]:
    """A handler on grpc.aio's logger with the filter, the root at INFO; restored after."""
    aio, root = logging.getLogger(GRPC_AIO_LOGGER), logging.getLogger()
    handler, level, propagate = _Keep(), root.level, aio.propagate
    f = CallEndedFilter()
    aio.addFilter(f)
    aio.addHandler(handler)
    aio.propagate = False
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        aio.removeFilter(f)
        aio.removeHandler(handler)
        aio.propagate = propagate
        root.setLevel(level)


def _report(message: str) -> None:
    """Log as grpc.aio's ``_handle_exceptions`` does: ``_LOGGER.exception`` in an except."""
    try:
        raise RuntimeError('Failed "execute_batch"')
    except RuntimeError:
        logging.getLogger(GRPC_AIO_LOGGER).exception(message)


def test_a_reply_to_an_ended_call_is_not_an_error(kept: _Keep) -> None:
    _report(f"{CALL_ENDED} [/inference.GRPCInferenceService/ModelInfer]")
    assert kept.records == []


def test_it_is_one_debug_line_without_traceback_when_verbose(kept: _Keep) -> None:
    logging.getLogger().setLevel(logging.DEBUG)
    _report(f"{CALL_ENDED} [/inference.GRPCInferenceService/ModelInfer]")
    (record,) = kept.records
    assert record.levelno == logging.DEBUG
    assert record.exc_info is None
    assert "ModelInfer" in record.getMessage()
    assert "\n" not in logging.Formatter().format(record)


@pytest.mark.parametrize(
    "message", ["Unexpected [ValueError] raised by servicer method [/x]", f"x {CALL_ENDED}"]
)
def test_every_other_error_passes_unchanged(kept: _Keep, message: str) -> None:
    _report(message)
    (record,) = kept.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == message
    assert record.exc_info is not None
    assert record.exc_info[0] is RuntimeError
