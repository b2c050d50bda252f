"""SIGINT with HTTP clients that have not read their answers, beyond the one-client cases of
tests/e2e/test_s18_stop_http_unread.py: several frontends (``--frontend-processes 2``,
clients spread over both by the kernel's SO_REUSEPORT), a client that reads beside one that
does not, and a client still sending its request.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_r19_stop_unread import (
    EXIT_TIMEOUT_EXPIRED,
    EXIT_TIMEOUT_S,
    GRACE_S,
    _answered,
    _exit_after,
)
from tests.e2e.test_r19_stop_unread import repo as repo  # noqa: F401 - a fixture
from tests.e2e.test_s18_stop_http_unread import _StuckHttp
from tests.helpers.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def two_frontends(repo: Path, tmp_path: Path) -> Iterator[ServerProcess]:  # noqa: F811
    server = ServerProcess(
        repo,
        tmp_path / "ours.log",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        "--frontend-processes=2",
    )
    try:
        server.wait_live()
        yield server
    finally:
        server.stop()


def _stuck_clients(server: ServerProcess, n: int) -> list[_StuckHttp]:
    stuck = [_StuckHttp(server.http_url) for _ in range(n)]
    deadline = time.monotonic() + 120
    while _answered(server) < n:
        assert time.monotonic() < deadline, "the model did not answer the stuck calls"
        time.sleep(0.05)
    time.sleep(0.3)
    return stuck


def test_unread_answers_on_two_frontends_exit_1_at_the_budget(
    two_frontends: ServerProcess,
) -> None:
    stuck = _stuck_clients(two_frontends, 4)
    two_frontends.proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    code, took = _exit_after(two_frontends, t0, EXIT_TIMEOUT_S + GRACE_S)
    assert code == 1, (code, took)
    assert took >= EXIT_TIMEOUT_S - 0.5, took
    assert EXIT_TIMEOUT_EXPIRED in two_frontends.log()
    assert not any(s.read() for s in stuck)


def test_answers_read_within_the_budget_on_two_frontends_exit_0(
    two_frontends: ServerProcess,
) -> None:
    stuck = _stuck_clients(two_frontends, 4)
    two_frontends.proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    time.sleep(1.0)
    read = [s.read() for s in stuck]
    code, took = _exit_after(two_frontends, t0, EXIT_TIMEOUT_S + GRACE_S)
    assert read == [True] * 4
    assert code == 0, (code, took)
    assert EXIT_TIMEOUT_EXPIRED not in two_frontends.log()


def test_a_client_still_sending_its_request_does_not_hold_the_stop(
    two_frontends: ServerProcess,
) -> None:
    host, port = two_frontends.http_url.rsplit(":", 1)
    partial = socket.create_connection((host, int(port)))
    partial.sendall(b"POST /v2/models/x/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\nab")
    time.sleep(0.3)
    two_frontends.proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    code, took = _exit_after(two_frontends, t0, EXIT_TIMEOUT_S + GRACE_S)
    partial.close()
    assert code == 0, (code, took)
    assert took < EXIT_TIMEOUT_S, took
