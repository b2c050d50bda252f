"""End to end: ``GET /metrics`` of a running server after known traffic through tritonclient.

One server for the module serves add_sub (ONNX, batching) and python models written here:
``picky_py`` raises for a negative input (BACKEND), ``bounded_py`` sleeps for
its input's seconds behind ``max_queue_size: 2`` (REJECTED, CANCELED) and ``victim_py`` has
its worker killed mid-request (OTHER, a restart). Every count is checked exactly, per model
and reason, and against the ModelStatistics RPC the same scheduler answers. The flags
(``--allow-metrics=false``, a metrics port in use) get servers of their own.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import ServerProcess, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SLEEPY_OR_PICKY = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        time.sleep(max(0.0, max(float(x.flat[0]) for x in xs)))
        # NOTE: raised, not returned: python_be.cc counts a returned error response as a
        # success and only a failed execute as a BACKEND failure (test_r13_error_stats.py)
        if any((x < 0).any() for x in xs):
            raise ValueError("negative values are not allowed")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]) for x in xs]
"""

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

PY_MODELS = {
    "picky_py": "",
    "bounded_py": "dynamic_batching { default_queue_policy { max_queue_size: 2 } }",
    "victim_py": "",
}

LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
"""One ``name="value"`` pair of a sample's labels (our label values need no unescaping)."""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: ServerProcess) -> Samples:
    """Every sample of ``GET /metrics``, keyed by (sample name, labels)."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"  # 2.51's
        text = resp.read().decode()
    # NOTE: read as written on the wire; prometheus-client's parser would rename counter
    # samples to <name>_total, which is not what Prometheus stores for Triton's names.
    samples: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, number = line.rpartition(" ")
        name, _, labels = series.partition("{")
        samples[(name, frozenset(LABEL.findall(labels)))] = float(number)
    assert {f.name for f in text_string_to_metric_families(text)} >= {
        "nv_inference_request_success",
        "triton_mp_batch_size",
    }
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (KeyError when the series does not exist)."""
    return samples[(name, frozenset(labels.items()))]


def wait_for(server: ServerProcess, pred: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape until ``pred`` holds; returns that scrape."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        samples = scrape(server)
        if pred(samples):
            return samples
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = copy_models(tmp_path_factory.mktemp("repo"), "add_sub")
    for name, batching in PY_MODELS.items():
        write_python_model(repo, name, textwrap.dedent(CONFIG) + batching + "\n", SLEEPY_OR_PICKY)
    with server_factory(Path(tmp_path_factory.mktemp("logs"))) as start:
        yield start(repo)


def _x(v: float, rows: int = 1) -> list[grpcclient.InferInput]:
    x = np.full((rows, 2), v, np.float32)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


def _add_sub(rows: int) -> list[grpcclient.InferInput]:
    a = np.ones((rows, 16), np.float32)
    inputs = [grpcclient.InferInput(n, [rows, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return inputs


class Async:
    """tritonclient async_infer calls and their outcomes (None = success, else the error)."""

    def __init__(self, client: grpcclient.InferenceServerClient) -> None:
        self.client = client
        self.outcomes: dict[str, InferenceServerException | None] = {}
        self._lock = threading.Lock()

    def send(self, tag: str, model: str, v: float, **kwargs: object) -> None:
        def done(result: object, error: InferenceServerException | None) -> None:
            with self._lock:
                self.outcomes[tag] = error

        self.client.async_infer(model, _x(v), done, **kwargs)  # type: ignore[arg-type]

    def wait(self, *tags: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with self._lock:
                if all(t in self.outcomes for t in tags):
                    return
            time.sleep(0.02)
        raise AssertionError(f"no answer for {[t for t in tags if t not in self.outcomes]}")


def _one(model: str) -> dict[str, str]:
    return {"model": model, "version": "1"}


def test_counts_per_model_and_reason_after_known_traffic(server: ServerProcess) -> None:
    before = scrape(server)
    for name in ("add_sub", *PY_MODELS):
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
            assert value(before, "nv_inference_request_failure", reason=reason, **_one(name)) == 0
        assert value(before, "nv_inference_request_success", **_one(name)) == 0

    client = server.client()
    calls = Async(client)
    try:
        # add_sub: three batch-1 requests and one batch-4 request, one after another
        for rows in (1, 1, 1, 4):
            client.infer("add_sub", _add_sub(rows))
        # picky_py: two good, three refused by the model
        for v in (0.0, -1.0, 0.0, -2.0, -3.0):
            try:
                client.infer("picky_py", _x(v))
            except InferenceServerException:
                assert v < 0
        # bounded_py: a blocker runs, A waits; C waits and its client gives up; R1 waits
        # beside A, R2 and R3 find the queue full
        bounded = _one("bounded_py")
        calls.send("blocker", "bounded_py", 4.0)
        wait_for(
            server,
            lambda s: (
                value(
                    s, "triton_mp_instance_requests_in_flight", instance="bounded_py_0_0", **bounded
                )
                == 1
            ),
            "the blocker to run",
        )
        calls.send("A", "bounded_py", 0.0)
        calls.send("C", "bounded_py", 0.0, client_timeout=0.3)
        calls.wait("C")
        queued = wait_for(
            server,
            lambda s: value(s, "nv_inference_request_failure", reason="CANCELED", **bounded) == 1,
            "the cancelled request to leave the queue",
        )
        assert value(queued, "nv_inference_pending_request_count", **bounded) == 1
        assert value(queued, "triton_mp_queue_depth", level="0", **bounded) == 1
        assert value(queued, "triton_mp_queue_oldest_age_us", level="0", **bounded) > 0
        calls.send("R1", "bounded_py", 0.0)
        wait_for(
            server,
            lambda s: value(s, "triton_mp_queue_depth", level="0", **bounded) == 2,
            "R1 to queue",
        )
        calls.send("R2", "bounded_py", 0.0)
        calls.send("R3", "bounded_py", 0.0)
        calls.wait("blocker", "A", "C", "R1", "R2", "R3")
    finally:
        client.close()
    assert {t for t, e in calls.outcomes.items() if e is None} == {"blocker", "A", "R1"}
    for tag in ("R2", "R3"):
        err = calls.outcomes[tag]
        assert err is not None
        assert err.message().endswith("Exceeds maximum queue size")

    after = scrape(server)
    expected = {
        "add_sub": (4, {}, 7),
        "picky_py": (2, {"BACKEND": 3}, 2),
        "bounded_py": (3, {"CANCELED": 1}, 3),  # a full queue's refusals: counted nowhere
        "victim_py": (0, {}, 0),
    }
    for name, (success, failures, inferences) in expected.items():
        labels = _one(name)
        assert value(after, "nv_inference_request_success", **labels) == success, name
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
            got = value(after, "nv_inference_request_failure", reason=reason, **labels)
            assert got == failures.get(reason, 0), (name, reason)
        assert value(after, "nv_inference_count", **labels) == inferences, name
        assert value(after, "nv_inference_pending_request_count", **labels) == 0, name
    assert value(after, "nv_inference_exec_count", **_one("add_sub")) == 4
    assert value(after, "triton_mp_queue_rejected_total", level="0", **bounded) == 2

    # the batch-size histogram: add_sub formed batches of 1, 1, 1 and 4
    add_sub = _one("add_sub")
    buckets = {
        le: value(after, "triton_mp_batch_size_bucket", le=le, **add_sub)
        for le in ("1.0", "2.0", "4.0", "8.0", "+Inf")
    }
    assert buckets == {"1.0": 3, "2.0": 3, "4.0": 4, "8.0": 4, "+Inf": 4}
    assert value(after, "triton_mp_batch_size_sum", **add_sub) == 7
    closes = sum(
        v
        for (n, labels), v in after.items()
        if n == "triton_mp_batch_close_total" and ("model", "add_sub") in labels
    )
    assert closes == 4

    # the same numbers as the ModelStatistics RPC (one scheduler answers both)
    client = server.client()
    try:
        for st in client.get_inference_statistics(as_json=True)["model_stats"]:
            labels = _one(st["name"])
            inf = st["inference_stats"]
            assert value(after, "nv_inference_request_success", **labels) == int(
                inf["success"].get("count", 0)
            )
            fails = sum(
                value(after, "nv_inference_request_failure", reason=r, **labels)
                for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
            )
            assert fails == int(inf["fail"].get("count", 0))
            assert value(after, "nv_inference_exec_count", **labels) == int(
                st.get("execution_count", 0)
            )
            for metric, key in (
                ("nv_inference_request_duration_us", "success"),
                ("nv_inference_queue_duration_us", "queue"),
                ("nv_inference_compute_input_duration_us", "compute_input"),
                ("nv_inference_compute_infer_duration_us", "compute_infer"),
                ("nv_inference_compute_output_duration_us", "compute_output"),
            ):
                assert value(after, metric, **labels) == int(inf[key].get("ns", 0)) // 1000
    finally:
        client.close()


def _worker_pid(server: ServerProcess, instance: str) -> int:
    for child in psutil.Process(server.pid).children():
        if child.cmdline()[:1] == [f"triton-mp: worker {instance}"]:
            return child.pid
    raise AssertionError(f"no worker process {instance}")


def test_a_killed_worker_counts_as_other_and_a_restart(server: ServerProcess) -> None:
    victim = _one("victim_py")
    inst = {"instance": "victim_py_0_0", **victim}
    assert value(scrape(server), "triton_mp_instance_restarts_total", **inst) == 0
    client = server.client()
    calls = Async(client)
    try:
        calls.send("doomed", "victim_py", 30.0)
        wait_for(
            server,
            lambda s: value(s, "triton_mp_instance_requests_in_flight", **inst) == 1,
            "the request to run",
        )
        os.kill(_worker_pid(server, "victim_py_0_0"), signal.SIGKILL)
        calls.wait("doomed")
    finally:
        client.close()
    assert calls.outcomes["doomed"] is not None
    samples = wait_for(
        server,
        lambda s: (
            value(s, "triton_mp_instance_restarts_total", **inst) == 1
            and value(s, "triton_mp_instance_live", **inst) == 1
        ),
        "the worker to come back",
    )
    assert value(samples, "nv_inference_request_failure", reason="OTHER", **victim) == 1
    assert value(samples, "nv_inference_request_success", **victim) == 0


def test_cpu_gauges_and_the_memory_of_every_process(server: ServerProcess) -> None:
    samples = scrape(server)
    assert 0.0 <= value(samples, "nv_cpu_utilization") <= 1.0
    total = value(samples, "nv_cpu_memory_total_bytes")
    assert total == psutil.virtual_memory().total
    assert 0 < value(samples, "nv_cpu_memory_used_bytes") < total
    rss = {
        (dict(labels)["role"], dict(labels)["instance"]): v
        for (name, labels), v in samples.items()
        if name == "triton_mp_process_resident_memory_bytes"
    }
    expected = {("supervisor", ""), ("scheduler", ""), ("frontend", "0")} | {
        ("worker", f"{m}_0_0") for m in ("add_sub", *PY_MODELS)
    }
    assert expected <= set(rss)
    assert all(v > 1 << 20 for v in rss.values())


def test_allow_metrics_false_serves_nothing_and_needs_no_port(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        # the port is taken, yet the server starts: it does not even look at it
        server = start_server(repo, "--allow-metrics", "false", "--metrics-port", str(port))
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    client = server.client()
    assert client.is_server_ready()
    client.close()


def test_a_metrics_port_in_use_stops_the_start_like_a_grpc_port_in_use(tmp_path: Path) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        flags = ("--metrics-address", "127.0.0.1", "--metrics-port", str(port))
        clash = ServerProcess(repo, tmp_path / "clash.log", *flags)
        try:
            assert clash.proc.wait(timeout=60) == 1
            message = f"failed to start Metrics service: Socket '127.0.0.1:{port}' already in use"
            assert message in clash.log()
        finally:
            clash.stop()
