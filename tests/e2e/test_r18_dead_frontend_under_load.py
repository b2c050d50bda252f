"""A frontend killed -9 under load (r18's attack on ``DropSegments.requests_below``, the
restart's stop races and answers from the input block), through tritonclient against a
running server with two frontend processes and a spare (``--grpc-frontend`` native and
python):

- clients on their own connections call a batched echo (256 KiB answers named from the
  input block) and a sequence model (its state per correlation id) all the time;
- one frontend is killed -9 under that load: only clients whose connection it held see
  errors, each at most twice, all of them UNAVAILABLE-like; every answer any client got
  holds exactly its own bytes and every sequence step its right count; everyone keeps
  getting answers, the killed frontend is restarted;
- SIGINT afterwards stops the server with exit code 0 well inside its exit timeout.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import IDENTITY_PY, write_python_model
from tests.helpers.server import ServerProcess, server_factory, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

N = 1 << 16
THREADS = 8
EXIT_TIMEOUT_S = 20
ECHO_CONFIG = """
backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 1000 }
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
SEQ_CONFIG = """
backend: "python"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
SEQ_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.steps = {}

    def execute(self, requests):
        out = []
        for r in requests:
            cid = r.correlation_id()
            start = pb_utils.get_input_tensor_by_name(r, "START").as_numpy()
            n = 1 if start.reshape(-1)[0] else self.steps.get(cid, 0) + 1
            self.steps[cid] = n
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + n)]))
        return out
"""
SEQ_STEPS = 5


@pytest.fixture(params=["native", "python"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    repo = tmp_path / "repo"
    write_python_model(repo, "echo", ECHO_CONFIG, IDENTITY_PY)
    write_python_model(repo, "acc", SEQ_CONFIG, SEQ_MODEL)
    (tmp_path / "logs").mkdir()
    with server_factory(tmp_path / "logs") as start:
        yield start(
            repo,
            "--grpc-frontend",
            request.param,
            "--frontend-processes",
            "2",
            "--frontend-spare=true",
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        )


def _frontends(server: ServerProcess) -> dict[int, int]:
    """Serving frontend pid -> its established connections on the gRPC port."""
    out: dict[int, int] = {}
    for p in psutil.Process(server.pid).children(recursive=True):
        try:
            if not " ".join(p.cmdline()).startswith("triton-mp: frontend"):
                continue
            conns = p.net_connections(kind="tcp")
        except psutil.Error:
            continue
        listening = any(c.status == "LISTEN" and c.laddr.port == server.grpc_port for c in conns)
        if listening:
            out[p.pid] = sum(
                c.status == "ESTABLISHED" and c.laddr.port == server.grpc_port for c in conns
            )
    return out


class _Load:
    """THREADS clients, each on a connection of its own, calling until ``stop``; even ones
    the echo, odd ones sequences of SEQ_STEPS steps. A failed call drops the connection
    (and the sequence) and goes on with a new one."""

    def __init__(self, server: ServerProcess) -> None:
        self._url = server.url
        self._stop = threading.Event()
        self.ok = [0] * THREADS
        self.errors: list[list[str]] = [[] for _ in range(THREADS)]
        self.wrong: list[str] = []
        self._threads = [threading.Thread(target=self._run, args=(k,)) for k in range(THREADS)]
        for t in self._threads:
            t.start()

    def _client(self) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(
            self._url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )

    def _run(self, k: int) -> None:
        c = self._client()
        call = 0
        seq = 0
        try:
            while not self._stop.is_set():
                call += 1
                try:
                    if k % 2 == 0:
                        self._echo(c, k, call)
                    else:
                        seq += 1
                        self._sequence(c, k, seq)
                    self.ok[k] += 1
                except InferenceServerException as e:
                    self.errors[k].append(f"{e.status()} {e.message()}")
                    c.close()
                    self._stop.wait(0.05)
                    c = self._client()
        finally:
            c.close()

    def _echo(self, c: grpcclient.InferenceServerClient, k: int, call: int) -> None:
        x = (np.arange(N, dtype=np.float32) + np.float32(1000 * k + call))[None]
        inp = grpcclient.InferInput("INPUT0", [1, N], "FP32")
        inp.set_data_from_numpy(x)
        got = c.infer("echo", [inp], client_timeout=30).as_numpy("OUTPUT0")
        if not np.array_equal(got, x):
            self.wrong.append(f"echo {k}/{call}")

    def _sequence(self, c: grpcclient.InferenceServerClient, k: int, seq: int) -> None:
        cid = 1_000_000 * (k + 1) + seq
        for step in range(1, SEQ_STEPS + 1):
            x = np.full((1, 4), float(k), dtype=np.float32)
            inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            got = c.infer(
                "acc",
                [inp],
                sequence_id=cid,
                sequence_start=step == 1,
                sequence_end=step == SEQ_STEPS,
                client_timeout=30,
            ).as_numpy("OUTPUT0")
            if not np.array_equal(got, x + step):
                self.wrong.append(f"acc {k}/{seq} step {step}: {got}")

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def test_a_frontend_killed_under_load_loses_only_its_own_clients(server: ServerProcess) -> None:
    load = _Load(server)
    try:
        wait_for(lambda: min(load.ok) >= 3, 60, "every client answered")
        conns = _frontends(server)
        assert len(conns) == 2, conns
        victim = max(conns, key=lambda pid: conns[pid])
        assert conns[victim] >= 1, conns
        psutil.Process(victim).send_signal(signal.SIGKILL)
        wait_for(lambda: "restarted (restart 1)" in server.log(), 60, "the frontend back")
        after = list(load.ok)
        wait_for(
            lambda: all(o >= a + 3 for o, a in zip(load.ok, after, strict=True)),
            60,
            "every client answered again",
        )
    finally:
        load.stop()
    assert not load.wrong, load.wrong
    erred = [k for k in range(THREADS) if load.errors[k]]
    assert len(erred) <= conns[victim], (conns, load.errors)
    for k in erred:
        assert len(load.errors[k]) <= 2, load.errors[k]
    t0 = time.monotonic()
    code = server.stop(signal.SIGINT, timeout_s=EXIT_TIMEOUT_S + 30)
    took = time.monotonic() - t0
    assert code == 0, server.log()[-3000:]
    assert took < EXIT_TIMEOUT_S / 2, took
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("delay_s", [0.0, 0.03, 0.15, 0.5])
def test_sigint_soon_after_a_kill_under_load_exits_clean(
    server: ServerProcess, delay_s: float
) -> None:
    load = _Load(server)
    try:
        wait_for(lambda: min(load.ok) >= 2, 60, "every client answered")
        conns = _frontends(server)
        victim = max(conns, key=lambda pid: conns[pid])
        psutil.Process(victim).send_signal(signal.SIGKILL)
        time.sleep(delay_s)
        t0 = time.monotonic()
        code = server.stop(signal.SIGINT, timeout_s=EXIT_TIMEOUT_S + 30)
        took = time.monotonic() - t0
    finally:
        load.stop()
    assert not load.wrong, load.wrong
    assert code == 0, server.log()[-3000:]
    assert took < EXIT_TIMEOUT_S / 2, took
    assert "Traceback" not in server.log()
