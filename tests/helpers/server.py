"""A ``triton-mp start`` subprocess for end-to-end tests (not a test module).

The server runs in its own session (process group), so teardown can stop the whole tree
by its group id: SIGINT first (a clean drain), SIGKILL to the group after a deadline.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import tritonclient.grpc as grpcclient

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT_REPOSITORY = REPO_ROOT / "model_repository"


T = TypeVar("T")


def default_sigint() -> None:
    """``preexec_fn`` for a child a test interrupts with SIGINT (Ctrl-C): the default
    disposition, whatever the test run inherited. A shell without job control (``cmd &``
    in a script, as CI runners do) starts background jobs with SIGINT ignored, and Python
    then installs no KeyboardInterrupt handler in the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_PORTS_BELOW_EPHEMERAL = (20000, 32768)
"""Where ``free_port`` draws from: under Linux's default ``ip_local_port_range``
(32768-60999), from which every outgoing connection of the test run (clients,
perf_analyzer, the servers' own channels) takes its local port. A port bound to 0 comes
from that range too, and CI once lost a test to a client's connection taking the metrics
port between ``free_port`` and the server's bind."""

_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, never handed out before in this
    test run, drawn from under the ephemeral range (``_PORTS_BELOW_EPHEMERAL``)."""
    low, high = _PORTS_BELOW_EPHEMERAL
    while True:
        port = random.randrange(low, high)
        if port in _handed_out:
            continue
        _handed_out.add(port)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


GRPC_FRONTEND_ENV = "TRITON_MP_TEST_GRPC_FRONTEND"
"""When set (native or python), every test server gets ``--grpc-frontend <it>`` unless the
test names one: the whole gRPC suite runs through either frontend."""


def _grpc_frontend(extra: tuple[str, ...]) -> tuple[str, ...]:
    chosen = os.environ.get(GRPC_FRONTEND_ENV, "")
    if not chosen or any(a.startswith("--grpc-frontend") for a in extra):
        return ()
    return ("--grpc-frontend", chosen)


def _frontend_spare(extra: tuple[str, ...]) -> tuple[str, ...]:
    """``--frontend-spare=false`` unless the test names the flag. The tests that kill
    frontends (test_frontend_restart.py, test_block_handover.py) name it true; elsewhere the
    spare imported grpc, aiohttp and numpy (~0.6 CPU-s of this machine's 2 cores) beside
    each test's first requests, for a restart that never came."""
    if any(a.startswith("--frontend-spare") for a in extra):
        return ()
    return ("--frontend-spare=false",)


START = ("-m", "triton_mp", "start")
"""``triton-mp start``, as ``python <START> <flags>``."""
TRITONSERVER = (
    "-c",
    "import sys; from triton_mp.cli.main import tritonserver_main; sys.exit(tritonserver_main())",
)
"""``triton-mp-tritonserver`` (tritonserver's argv unchanged), as ``python <TRITONSERVER>``:
the console script of this checkout, whichever copy pip installed."""

STARTED_PIDS: set[int] = set()
"""Every server this test session started (the leak checks judge only objects of these, and
of the test process itself: other sessions' servers on the machine come and go)."""


_QUICK_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 10),
    ("grpc.max_reconnect_backoff_ms", 20),
]
"""Channel arguments of a client that polls a port nobody listens on yet: gRPC's reconnect
backoff (1 s, then x1.6 with jitter) otherwise fails every poll fast until it expires, and
the server was seen live 0.4 to 2.9 s after its frontend listened; with these, 10-30 ms."""

LIVE_POLL_S = 0.02
"""How often ``wait_grpc_live`` asks: every server start of the suite (some 300) waited
half a poll on average, 50 ms at the 0.1 s this was (a failed connect costs well under
a millisecond of the test process)."""


def wait_grpc_live(
    url: str, proc: subprocess.Popen[bytes], log: Callable[[], str], timeout_s: float, what: str
) -> None:
    """Poll ServerLive over gRPC at ``url`` every ``LIVE_POLL_S`` until it answers true.

    Raises:
        RuntimeError: ``proc`` exited or ``timeout_s`` passed, with ``log()`` appended.
    """
    deadline = time.monotonic() + timeout_s
    client = grpcclient.InferenceServerClient(url, channel_args=_QUICK_RECONNECT)
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log()}")
            try:
                if client.is_server_live():
                    return
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            time.sleep(LIVE_POLL_S)
    finally:
        client.close()
    raise RuntimeError(f"{what} not live after {timeout_s}s:\n{log()}")


class ServerProcess:
    """``triton-mp start`` on a repository, with free ports, stopped by PID and group.

    Attributes:
        url: ``127.0.0.1:<grpc port>`` for tritonclient.
        http_url: ``127.0.0.1:<http port>`` for tritonclient.http and raw HTTP requests.
        pid: the supervisor's pid (also the process group id).
        metrics_port: the free port given as ``--metrics-port`` (``GET /metrics``).
        log_path: where the server's stdout and stderr go.
        repository: the model repository it serves (files a test's models read sit there).
    """

    def __init__(
        self,
        repository: Path,
        log_path: Path,
        *extra: str,
        entry: tuple[str, ...] = START,
        repository_flag: str = "--model-repository",
    ) -> None:
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.http_port = free_port()
        self.url = f"127.0.0.1:{self.grpc_port}"
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.log_path = log_path
        self.repository = repository
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = [
            sys.executable,
            *entry,
            f"{repository_flag}={repository}",
            "--grpc-address",
            "127.0.0.1",
            "--grpc-port",
            str(self.grpc_port),
            "--http-address",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--metrics-port",
            str(self.metrics_port),
            *_grpc_frontend(extra),
            *_frontend_spare(extra),
            *extra,
        ]
        # NOTE: the server runs this checkout's code, whichever copy pip installed.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")) if p
        )
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO_ROOT,
            env=env,
        )
        self.pid = self.proc.pid
        STARTED_PIDS.add(self.pid)

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait_live(self, timeout_s: float = 120.0) -> None:
        """Wait until the gRPC frontend answers ServerLive (the last process to start).

        Raises:
            RuntimeError: the server exited or did not come up in time (with its log).
        """
        wait_grpc_live(self.url, self.proc, self.log, timeout_s, "server")

    def client(self) -> grpcclient.InferenceServerClient:
        """A new tritonclient gRPC client for this server."""
        return grpcclient.InferenceServerClient(self.url)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 60.0) -> int | None:
        """Signal the supervisor, wait, then SIGKILL the whole group. Returns its exit code."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        if group_alive(self.pid):
            os.killpg(self.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while group_alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode


def counted(
    read: Callable[[], T], done: Callable[[T], bool], what: str, timeout_s: float = 10
) -> T:
    """``read()`` once ``done`` holds for it (polled every 50 ms): the server's statistics
    after the last answer. A batch is counted when the worker's BatchDone, sent after its
    answers, reaches the scheduler, so a read right after the client has its last answer
    may miss that batch (Triton 2.51 also reports a batch's statistics after its responses,
    when the python backend's ProcessRequests returns). AssertionError naming ``what``, with
    the last value read, after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last read: {value!r}")
        time.sleep(0.05)


def settled_stats(
    read: Callable[[], dict[str, tuple[int, ...]]],
    before: dict[str, tuple[int, ...]],
    sent: dict[str, int],
    timeout_s: float = 10,
) -> dict[str, tuple[int, ...]]:
    """``read()`` (model -> (success count, fail count, ...)) once every model in ``sent``
    counts at least that many more requests (successes and failures) than ``before`` and
    two reads 0.3 s apart agree, or after ``timeout_s`` seconds (the last read): Triton's
    request tracker reports an ensemble's statistics after its response is sent, so under
    load a read right after the answer can miss them."""
    last = read()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = read()
        done = all(
            now[m][0] + now[m][1] - before[m][0] - before[m][1] >= n for m, n in sent.items()
        )
        if now == last and done:
            break
        last = now
    return last


def wait_for(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``pred`` every 50 ms until it is true; AssertionError naming ``what`` after
    ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def queue_state(url: str, model: str) -> tuple[int, int]:
    """(requests running on ``model``'s instances, requests waiting in its queues), as the
    scheduler reports them to ``triton-mp stat`` (admin QueueStatus at ``url``)."""
    import grpc  # noqa: PLC0415 - only tests that watch queues need it

    from triton_mp._proto import admin_pb2, admin_pb2_grpc  # noqa: PLC0415

    with grpc.insecure_channel(url) as channel:
        reply = admin_pb2_grpc.AdminStub(channel).QueueStatus(
            admin_pb2.QueueStatusRequest(model=model), timeout=30
        )
    running = sum(i.requests_in_flight for m in reply.models for i in m.instances)
    waiting = sum(lv.depth for m in reply.models for lv in m.levels)
    return running, waiting


def wait_queued(
    url: str, model: str, running: int = 1, waiting: int = 0, timeout_s: float = 30
) -> None:
    """Wait until ``model`` runs at least ``running`` requests and holds at least
    ``waiting`` in its queues: instead of sleeping "long enough" for a blocker to start."""

    def reached() -> bool:
        r, w = queue_state(url, model)
        return r >= running and w >= waiting

    wait_for(reached, timeout_s, f"{model} to run {running} and queue {waiting} requests")


@contextlib.contextmanager
def server_factory(log_dir: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Context manager yielding ``start(repository, *flags)``; stops every server on exit."""
    servers: list[ServerProcess] = []

    def start(repository: Path, *flags: str, wait: bool = True, **kw: Any) -> ServerProcess:
        server = ServerProcess(repository, log_dir / f"server{len(servers)}.log", *flags, **kw)
        servers.append(server)
        if wait:
            server.wait_live()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()
            assert not group_alive(server.pid), f"server {server.pid} left processes behind"
