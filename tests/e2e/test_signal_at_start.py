"""SIGINT or SIGTERM while a model loads at start, side by side with the real Triton 2.51
(``.peers/``; where it is not installed, triton-mp alone is held to what 2.51 does).

A python model whose ``initialize`` takes ``INIT_S`` marks its start in its directory; the
server gets the signal then, with an exit budget of ``EXIT_TIMEOUT_S``. 2.51 has no handler
yet (server main.cc installs it once ``TRITONSERVER_ServerNew`` loaded the models) and dies
by the signal at once; triton-mp does the same (``supervisor.processes.start_signal``): exit
status ``-signum`` well before the load could end, none of its ports ever accepts a
connection, and it leaves no process and no shared memory. The same with
``--model-control-mode=explicit --load-model``.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, group_alive
from tests.helpers.triton_peer import RealTriton, peers_env
from triton_mp.ipc.memory.shm import list_objects

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

INIT_S = 6.0
"""How long the model's ``initialize`` takes."""
EXIT_TIMEOUT_S = 3
EXITED_WITHIN_S = 2.5
"""How soon after the signal a server must be gone: before the budget, and far before the
load could end (``INIT_S``)."""
MODEL_NAME = "slow_init"
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
MODEL = f"""
import time
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        Path(args["model_repository"], "initializing").touch()
        time.sleep({INIT_S})

    def execute(self, requests):
        return []
"""

Server = ServerProcess | RealTriton


class _PortWatch:
    """Tries to connect to each port every ``POLL_S`` on a thread until ``stop``; records
    each port that accepted a connection."""

    POLL_S = 0.02

    def __init__(self, ports: tuple[int, ...]) -> None:
        self.accepted: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ports,), daemon=True)
        self._thread.start()

    def _run(self, ports: tuple[int, ...]) -> None:
        while not self._done.is_set():
            for port in ports:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    self.accepted.add(port)
                except OSError:
                    pass
            time.sleep(self.POLL_S)

    def stop(self) -> set[int]:
        self._done.set()
        self._thread.join()
        return self.accepted


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., tuple[Server, Path]]]:
    """``start(name, *flags)``: ``triton-mp`` or ``triton`` (skipped where not installed) on
    a repository of its own holding the slow model, with the exit budget. Returns it and the
    file the model creates when its ``initialize`` starts; each is stopped (by PID, its
    process group and 2.51's regions too) when the test ends."""
    started: list[Server] = []

    def one(name: str, *flags: str) -> tuple[Server, Path]:
        repo = tmp_path / f"repo_{len(started)}"
        write_python_model(repo, MODEL_NAME, CONFIG, MODEL)
        argv = (f"--exit-timeout-secs={EXIT_TIMEOUT_S}", *flags)
        server: Server
        if name == "triton":
            env = peers_env()
            if env is None:
                pytest.skip("the real Triton 2.51 is not installed (.peers/)")
            # NOTE: a SIGINT ignored here (a background job) would be ignored by 2.51 too,
            # which has no handler of its own yet: exec resets a handled signal to default.
            old = signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                server = RealTriton(
                    env, tmp_path / "triton.log", f"--model-repository={repo}", *argv
                )
            finally:
                signal.signal(signal.SIGINT, old)
        else:
            server = ServerProcess(repo, tmp_path / f"ours_{len(started)}.log", *argv)
        started.append(server)
        return server, repo / MODEL_NAME / "initializing"

    try:
        yield one
    finally:
        for server in started:
            server.stop()


def _signal_while_loading(
    server: Server, mark: Path, sig: int
) -> tuple[int | None, float, set[int]]:
    """Once the model's ``initialize`` runs (``mark`` exists), ``sig``. Returns the exit
    status (None: still running ``EXITED_WITHIN_S`` after the signal), the seconds it took,
    and the ports that accepted a connection from the server's start to a moment after its
    exit."""
    watch = _PortWatch((server.grpc_port, server.http_port, server.metrics_port))
    deadline = time.monotonic() + 120
    while not mark.exists():
        assert server.proc.poll() is None, server.log()
        assert time.monotonic() < deadline, "the model never started to load"
        time.sleep(0.02)
    server.proc.send_signal(sig)
    t0 = time.monotonic()
    try:
        code: int | None = server.proc.wait(timeout=EXITED_WITHIN_S)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: still running
        code = None
    took = time.monotonic() - t0
    print(f"exit {code} {took:.2f} s after the signal")  # noqa: T201 - shown with -s
    time.sleep(0.3)  # NOTE: a port opened by a late child would show by now
    return code, took, watch.stop()


def _left_behind(pid: int) -> tuple[bool, list[str]]:
    """Whether a process of ``pid``'s group still runs (within 2 s), and its shared memory."""
    deadline = time.monotonic() + 2.0
    while group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return group_alive(pid), list_objects(str(pid))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("name", ["triton", "triton-mp"])
def test_a_signal_while_a_model_loads_ends_the_start_by_it(
    start: Callable[..., tuple[Server, Path]], name: str, sig: int
) -> None:
    server, mark = start(name)
    code, took, accepted = _signal_while_loading(server, mark, sig)
    assert code == -sig, (took, server.log()[-3000:])
    assert accepted == set()
    if name == "triton-mp":
        assert "triton-mp serving" not in server.log()
        assert _left_behind(server.pid) == (False, [])


@pytest.mark.parametrize("name", ["triton", "triton-mp"])
def test_explicit_mode_with_load_model_at_start_too(
    start: Callable[..., tuple[Server, Path]], name: str
) -> None:
    server, mark = start(name, "--model-control-mode=explicit", f"--load-model={MODEL_NAME}")
    code, took, accepted = _signal_while_loading(server, mark, signal.SIGINT)
    assert code == -signal.SIGINT, (took, server.log()[-3000:])
    assert accepted == set()
    if name == "triton-mp":
        assert _left_behind(server.pid) == (False, [])
