"""SIGINT while a gRPC client that read every answer is stopped (SIGSTOP), side by side with
the real Triton 2.51 (``.peers/``; where it is not installed, triton-mp alone is held to what
it does).

The client sends ``CALLS`` identity calls of 8 MiB on one connection, reads every answer, then
stops itself: its connection stays open with nothing in flight and nothing unread, and it
answers nothing more (not the ping that gRPC's graceful GOAWAY sends at the stop).

- 2.51 exits 0 with no "Exit timeout expired", but only once gRPC gave up on that ping's
  answer, 20 s into its gRPC teardown (grpc's graceful GOAWAY timer), whatever the budget.
- triton-mp exits 0 with no such line too, at once: a connection with no call running holds
  nothing to hand over, so the stop closes it rather than wait (docs/differences.md). It used
  to wait for the ping up to the whole budget (B4 in session 18), and the Python gRPC server
  (``--grpc-frontend=python``) then even said it had cut calls and exited 1.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.test_native_large_answers import CONFIG, MODEL, MODEL_NAME
from tests.e2e.test_r19_stop_unread import EXIT_TIMEOUT_EXPIRED, Server
from tests.helpers.repos import write_python_model
from tests.helpers.server import group_alive
from tests.helpers.stop_sides import side_starter
from triton_mp.ipc.memory.shm import list_objects

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EXIT_TIMEOUT_S = 8
CALLS = 4
GOAWAY_WAIT_S = 20.0
"""How long grpc's graceful GOAWAY waits for its ping's answer before it closes the
connection anyway (chttp2 ``GracefulGoaway``: a fixed 20 s)."""
QUICK_S = 4.0
"""The most a stop with nothing to hand over may take on a loaded 2-core machine: well
inside the budget."""
CLIENT = """
import os, signal, sys
import numpy as np
import tritonclient.grpc as grpcclient

client = grpcclient.InferenceServerClient(sys.argv[1])
x = grpcclient.InferInput("INPUT0", [1, 2 * 1024 * 1024], "FP32")
x.set_data_from_numpy(np.ones((1, 2 * 1024 * 1024), np.float32))
for _ in range(int(sys.argv[2])):
    assert client.infer(sys.argv[3], [x]).as_numpy("OUTPUT0").shape == (1, 2 * 1024 * 1024)
print("read", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""
"""The client: ``CALLS`` calls of 8 MiB each answered and read on one connection, then it
stops itself, its connection open."""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stop_stopped_client") / "repo"
    write_python_model(path, MODEL_NAME, CONFIG, MODEL)
    return path


@pytest.fixture
def start(repo: Path, tmp_path: Path) -> Iterator[Callable[[str], Server]]:
    """``start(name)``: ``triton-mp``, ``triton-mp-python`` (its Python gRPC server) or
    ``triton`` (skipped where not installed) on ``repo`` with the exit budget, live; each is
    stopped (by PID) when the test ends."""
    with side_starter(repo, tmp_path, EXIT_TIMEOUT_S) as one:
        yield one


@pytest.fixture
def stopped_client() -> Iterator[Callable[[Server], None]]:
    """``stopped_client(server)``: runs ``CLIENT`` against ``server`` and returns once it
    read every answer and is stopped; it is killed (by PID) when the test ends."""
    clients: list[subprocess.Popen[str]] = []

    def one(server: Server) -> None:
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, server.url, str(CALLS), MODEL_NAME],
            stdout=subprocess.PIPE,
            text=True,
        )
        clients.append(client)
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "read"
        deadline = time.monotonic() + 30
        while _state(client.pid) != "T":
            assert time.monotonic() < deadline, "the client did not stop"
            time.sleep(0.02)

    try:
        yield one
    finally:
        for client in clients:
            client.send_signal(signal.SIGCONT)
            client.kill()
            client.wait(timeout=10)


def _state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("name", ["triton", "triton-mp", "triton-mp-python"])
def test_a_stopped_client_that_read_everything(
    start: Callable[[str], Server], stopped_client: Callable[[Server], None], name: str
) -> None:
    server = start(name)
    stopped_client(server)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGINT)
    code = server.proc.wait(timeout=GOAWAY_WAIT_S + 30)
    took = time.monotonic() - t0
    assert code == 0, took
    assert EXIT_TIMEOUT_EXPIRED not in server.log()
    if name == "triton":
        # NOTE: 2.51 waits for grpc's GOAWAY ping, unbounded by the budget
        assert took > GOAWAY_WAIT_S - 2.0
        return
    assert took < QUICK_S
    assert "cut calls" not in server.log()
    assert not group_alive(server.pid)
    assert list_objects(str(server.pid)) == []
