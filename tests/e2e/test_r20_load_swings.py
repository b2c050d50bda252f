"""A batching python model under load that swings from 16 clients to 1 and back, side by
side with the real Triton 2.51 (``.peers/``; where it is not installed, triton-mp alone).

At 16 clients a worker's batches are large and it asks the scheduler for no ``BatchDue``
notices (``workers.due``, the quiet flag of the scheduler's ring to it); at 1 client its
batches are of one request again and it must ask for them back. Whatever the flag says, no
request may wait past its ``max_queue_delay`` plus the machine's slack: each swing's lone
requests are answered within a bound, with the right numbers, over both priority levels;
also after the instance's worker is killed (SIGKILL) right after a burst, while its flag is
set, and restarted (triton-mp only: 2.51 has no worker process per instance to kill).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.test_sequences import PY_MODEL as SUM_MODEL
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import Models, PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SWING_CONFIG = """
backend: "python"
max_batch_size: 16
dynamic_batching {
  max_queue_delay_microseconds: 20000
  priority_levels: 2
  default_priority_level: 2
}
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
SWING_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests]
"""
"""r20_swing_py: OUTPUT0 = 2 * INPUT0; batches of up to 16 within 20 ms; two priority
levels."""

SEQ_CONFIG = """
backend: "python"
max_batch_size: 16
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 16 max_queue_delay_microseconds: 20000 }
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
"""r20_seq_py (``SUM_MODEL``, a running sum per sequence): the oldest strategy, 16
candidates, 20 ms delay."""

SIDE_BY_SIDE_MODELS: Models = {
    "r20_swing_py": PythonModel(SWING_CONFIG, SWING_MODEL),
    "r20_seq_py": PythonModel(SEQ_CONFIG, SUM_MODEL),
}
"""tests/e2e/conftest.py's ``shared_side_by_side`` serves it."""

DELAY_S = 0.02
"""The model's max_queue_delay."""
SLACK_S = 2.0
"""What a loaded 2-core machine may add to a lone request (a hang is what this catches)."""


@pytest.fixture(scope="module")
def servers(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> dict[str, ServerProcess]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed."""
    return shared_side_by_side  # type: ignore[return-value]  # NOTE: same url fields


def _call(client: grpcclient.InferenceServerClient, value: float, priority: int) -> bool:
    x = np.full((1, 4), value, dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    r = client.infer("r20_swing_py", [inp], priority=priority, client_timeout=30)
    return bool(np.array_equal(r.as_numpy("OUTPUT0"), x * 2))


def _burst(url: str, seconds: float) -> list[str]:
    """16 clients (half of them at priority 1) calling for ``seconds``: what went wrong."""
    bad: list[str] = []
    stop = time.monotonic() + seconds

    def one(i: int) -> None:
        with grpcclient.InferenceServerClient(url) as client:
            n = 0
            while time.monotonic() < stop:
                if not _call(client, float(i * 1000 + n), 1 + i % 2):
                    bad.append(f"client {i} call {n}: wrong answer")
                n += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return bad


def test_lone_requests_after_bursts_of_16_clients_wait_no_longer_than_the_delay(
    servers: dict[str, ServerProcess],
) -> None:
    for name, server in servers.items():
        bad: list[str] = []
        worst = 0.0
        for swing in range(3):
            bad += _burst(server.url, 1.5)
            with grpcclient.InferenceServerClient(server.url) as client:
                for n in range(12):
                    t0 = time.monotonic()
                    if not _call(client, float(-n), 1 + n % 2):
                        bad.append(f"swing {swing} lone call {n}: wrong answer")
                    worst = max(worst, time.monotonic() - t0)
        assert bad == [], name
        assert worst < DELAY_S + SLACK_S, (name, worst)


def _worker_pid(server: ServerProcess) -> int | None:
    """The pid of r20_swing_py's one worker (its process title), or None."""
    for p in psutil.Process(server.pid).children(recursive=True):
        try:
            if " ".join(p.cmdline()).strip() == "triton-mp: worker r20_swing_py_0_0":
                return p.pid
        except psutil.Error:
            continue
    return None


def test_a_worker_killed_after_a_burst_is_restarted_and_lone_requests_still_come_back(
    servers: dict[str, ServerProcess],
) -> None:
    server = servers["triton-mp"]
    assert _burst(server.url, 1.5) == []
    pid = _worker_pid(server)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    with grpcclient.InferenceServerClient(server.url) as client:
        while _worker_pid(server) in (None, pid) or not client.is_model_ready("r20_swing_py"):
            assert time.monotonic() < deadline, "r20_swing_py's worker was not restarted"
            time.sleep(0.1)
        worst = 0.0
        for n in range(12):
            t0 = time.monotonic()
            assert _call(client, float(n), 1 + n % 2)
            worst = max(worst, time.monotonic() - t0)
    assert _burst(server.url, 1.5) == []
    with grpcclient.InferenceServerClient(server.url) as client:
        for n in range(12):
            t0 = time.monotonic()
            assert _call(client, float(n), 1 + n % 2)
            worst = max(worst, time.monotonic() - t0)
    assert worst < DELAY_S + SLACK_S, worst


def _sequence(url: str, cid: int, steps: int) -> tuple[list[float], float]:
    """One sequence of ``steps`` requests (INPUT k at step k): its running sums and its
    slowest request in seconds."""
    sums, worst = [], 0.0
    with grpcclient.InferenceServerClient(url) as client:
        for k in range(steps):
            inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            inp.set_data_from_numpy(np.full((1, 1), k, dtype=np.float32))
            t0 = time.monotonic()
            r = client.infer(
                "r20_seq_py", [inp], sequence_id=cid, sequence_start=k == 0,
                sequence_end=k == steps - 1, client_timeout=30,
            )  # fmt: skip
            worst = max(worst, time.monotonic() - t0)
            sums.append(float(r.as_numpy("OUTPUT")[0, 0]))
    return sums, worst


def test_sequences_swinging_from_16_to_1_keep_their_sums_and_the_delay(
    servers: dict[str, ServerProcess],
) -> None:
    """16 sequences at once, then one alone, twice, with the oldest strategy: every running
    sum right, and the lone sequence's requests within the delay plus slack."""
    steps = 20
    want = [float(k * (k + 1) // 2) for k in range(steps)]
    for name, server in servers.items():
        lone_worst = 0.0
        for swing in range(2):
            base = 1000 * (swing + 1) + (0 if name == "triton" else 500)
            with ThreadPoolExecutor(16) as pool:
                got = list(pool.map(lambda c, u=server.url: _sequence(u, c, steps),
                                    range(base, base + 16)))  # fmt: skip
            assert [sums for sums, _ in got] == [want] * 16, name
            sums, worst = _sequence(server.url, base + 100, steps)
            assert sums == want, name
            lone_worst = max(lone_worst, worst)
        assert lone_worst < DELAY_S + SLACK_S, (name, lone_worst)
