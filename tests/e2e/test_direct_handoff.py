"""The direct handoff end to end (``ipc.direct``): a frontend hands a request of a version
without a batching delay straight to an idle instance, and everything the scheduler keeps
stays right: statistics, ``triton-mp stat``'s view, a worker killed while it runs a direct
request (its client gets the error), an unload while one runs, and a model with a delay,
whose requests always go through the scheduler.

The models are ``tests/helpers/fault_models`` (python backend, the default scheduler: eligible).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.test_faults import _infer, _inputs, _instance, _pid
from tests.helpers.fault_models import write_faulty_model
from tests.helpers.server import ServerProcess, counted, wait_for
from triton_mp._proto import admin_pb2, admin_pb2_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HANDED = "handed to instance"
"""The frontend's debug line for each request it hands to an instance itself."""


def _in_flight(server: ServerProcess, model: str) -> int:
    """Batches the scheduler sees running on ``model``'s instances (``triton-mp stat``)."""
    with grpc.insecure_channel(server.url) as channel:
        reply = admin_pb2_grpc.AdminStub(channel).QueueStatus(
            admin_pb2.QueueStatusRequest(model=model), timeout=30
        )
    return sum(inst.batches_in_flight for m in reply.models for inst in m.instances)


def _stats(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int, int]:
    (st,) = client.get_inference_statistics(model).model_stats
    return st.inference_count, st.execution_count, st.inference_stats.fail.count


def _in_background(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except InferenceServerException as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_requests_without_a_delay_are_handed_to_idle_instances_and_counted(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "echo_py", "none", count=2)
    delayed = write_faulty_model(repo, "delay_py", "none")
    cfg = delayed / "config.pbtxt"
    cfg.write_text(
        cfg.read_text().replace("max_batch_size: 0", "max_batch_size: 8")
        + "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
    )
    server = start_server(repo, "--log-verbose=1")
    client = server.client()
    for i in range(20):
        assert _infer(client, "echo_py", i) == i
    assert server.log().count(HANDED) >= 15, "most went straight to an instance"
    # NOTE: the worker re-offers its lease after each batch (ipc.direct.worker_reoffers):
    # the scheduler sleeps through c=1 traffic, and counts it when a query wakes it.
    scheduler = psutil.Process(_pid(server, "triton-mp: scheduler"))
    slept = scheduler.num_ctx_switches().voluntary
    for i in range(40):
        assert _infer(client, "echo_py", i) == i
    woken = scheduler.num_ctx_switches().voluntary - slept
    assert woken < 10, f"the scheduler slept and woke {woken} times for 40 requests"
    # NOTE: a batch is counted when its BatchDone reaches the scheduler, after the answer
    stats = counted(lambda: _stats(client, "echo_py"), lambda s: s[0] >= 60, "60 counted")
    assert stats == (60, 60, 0)
    (st,) = client.get_inference_statistics("echo_py").model_stats
    assert (st.inference_stats.success.count, st.inference_stats.queue.count) == (60, 60)
    assert sum(b.compute_infer.count for b in st.batch_stats) == 60
    # NOTE: 4 clients on 2 instances: re-offered leases, queued requests and records read
    # out of order race; every request is answered and counted once.
    answers = _from_clients(server, "echo_py", clients=4, each=30)
    assert answers == [[float(i) for i in range(30)]] * 4
    stats = counted(lambda: _stats(client, "echo_py"), lambda s: s[0] >= 180, "180 counted")
    assert stats == (180, 180, 0)
    handed = server.log().count(HANDED)
    for i in range(5):
        res = client.infer("delay_py", [_batched(i)])
        assert float(res.as_numpy("OUTPUT0")[0, 0]) == i
    assert server.log().count(HANDED) == handed, "a model with a delay is always batched"
    assert _stats(client, "delay_py") == (5, 5, 0)
    assert _in_flight(server, "echo_py") == 0
    client.close()


def _from_clients(server: ServerProcess, model: str, clients: int, each: int) -> list[list[float]]:
    """``clients`` threads, each with its own client, each sending ``each`` requests in turn
    (values 0 .. each-1); the answers per client."""
    out: list[list[float]] = [[] for _ in range(clients)]

    def run(k: int) -> None:
        c = server.client()
        try:
            out[k] = [_infer(c, model, i) for i in range(each)]
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def _batched(value: float) -> grpcclient.InferInput:
    x = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], np.float32))
    return x


def test_a_worker_killed_during_a_direct_request_fails_it_and_comes_back(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "slow_py", "none", sleep_ms=4000)
    server = start_server(repo, "--log-verbose=1")
    client = server.client()
    victim = _pid(server, "triton-mp: worker slow_py_0_0")
    t, out = _in_background(lambda: client.infer("slow_py", _inputs(2), client_timeout=120))
    wait_for(lambda: HANDED in server.log(), 30, "the request to be handed over")
    wait_for(lambda: _in_flight(server, "slow_py") == 1, 30, "stat to show it running")
    os.kill(victim, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive(), "the client got no answer"
    (err,) = out
    assert isinstance(err, InferenceServerException), err
    assert err.status() == "StatusCode.UNAVAILABLE", err
    assert "slow_py_0_0" in err.message(), err.message()
    assert "exit code -9" in err.message(), err.message()
    wait_for(
        lambda: _instance(server, "slow_py", "slow_py_0_0") == {"live": True, "restarts": 1},
        120,
        "the killed instance to be restarted",
    )
    assert _stats(client, "slow_py")[2] == 1, "the failure is counted"
    before = server.log().count(HANDED)
    assert _infer(client, "slow_py", 3) == 3
    assert server.log().count(HANDED) == before + 1, "the restarted instance is offered again"
    assert client.is_server_ready()
    client.close()


def test_an_unload_waits_for_a_direct_request_then_refuses_new_ones(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "slow_py", "none", sleep_ms=2000)
    server = start_server(
        repo, "--log-verbose=1", "--model-control-mode=explicit", "--load-model=slow_py"
    )
    client = server.client()
    t, out = _in_background(lambda: client.infer("slow_py", _inputs(5), client_timeout=120))
    wait_for(lambda: HANDED in server.log(), 30, "the request to be handed over")
    started = time.monotonic()
    client.unload_model("slow_py")
    t.join(60)
    (res,) = out
    assert not isinstance(res, Exception), res
    assert float(res.as_numpy("OUTPUT0")[0]) == 5  # type: ignore[attr-defined]
    wait_for(lambda: not client.is_model_ready("slow_py"), 60, "the unload to finish")
    assert time.monotonic() - started < 60
    with pytest.raises(InferenceServerException):
        client.infer("slow_py", _inputs(1), client_timeout=30)
    client.load_model("slow_py")
    assert _infer(client, "slow_py", 2) == 2
    assert client.is_server_ready()
    client.close()
