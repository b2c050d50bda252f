"""What a model's statistics and metrics count for requests its queue refuses or times out,
side by side: every case runs against triton-mp and, where ``.peers/`` has it, the real
Triton 2.51 on the same python models (tritonclient over gRPC, ``/metrics``), and both must
count the same. A full queue's refusal ("Exceeds maximum queue size": core
``PolicyQueue::Enqueue``, before the request is queued) is counted nowhere; a queue timeout
("Request timeout expired": the dynamic batcher's FinishRejectedCancelledRequests) is a
failure with reason REJECTED. A request its client cancels while it waits is dropped and
counted CANCELED by triton-mp in every model; 2.51 does so only where the queue has a
policy, and runs it elsewhere (pinned for both servers: README "Request cancellation").
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, counted
from tests.helpers.triton_peer import RealTriton, peers_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODEL = """
import json, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            time.sleep(json.loads(r.parameters() or "{}").get("sleep", 0))
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""
CONFIG = """
name: "%s"
backend: "python"
max_batch_size: 8
input [{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
instance_group [{ count: 1, kind: KIND_CPU }]
dynamic_batching { default_queue_policy { %s } }
"""
POLICIES = {
    "full_py": "max_queue_size: 1",
    "late_py": "timeout_action: REJECT default_timeout_microseconds: 100000",
    "policed_py": "max_queue_size: 8",
}
PLAIN = """
name: "plain_py"
backend: "python"
max_batch_size: 8
input [{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


class Server:
    """One server's gRPC URL and metrics port."""

    def __init__(self, url: str, metrics_port: int) -> None:
        self.url, self.metrics_port = url, metrics_port

    def counts(self, model: str) -> dict[str, float]:
        """The model's statistics (``success``, ``fail``, ``inference_count``) and its
        ``nv_inference_request_failure`` per reason, now."""
        client = grpcclient.InferenceServerClient(self.url)
        try:
            (st,) = client.get_inference_statistics(model).model_stats
        finally:
            client.close()
        got = {
            "success": float(st.inference_stats.success.count),
            "fail": float(st.inference_stats.fail.count),
            "inference_count": float(st.inference_count),
        }
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith("nv_inference_request_failure{") and f'model="{model}"' in line:
                reason = line.split('reason="')[1].split('"')[0]
                got[reason] = float(line.rsplit(" ", 1)[1])
        return got


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed."""
    repo = tmp_path_factory.mktemp("queue_counts") / "repo"
    for name, policy in POLICIES.items():
        write_python_model(repo, name, CONFIG % (name, policy), MODEL)
    write_python_model(repo, "plain_py", PLAIN, MODEL)
    logs = tmp_path_factory.mktemp("logs")
    ours = ServerProcess(repo, logs / "ours.log")
    theirs: RealTriton | None = None
    try:
        env = peers_env()
        if env is not None:  # NOTE: started before ours is live: side by side
            theirs = RealTriton(env, logs / "triton.log", f"--model-repository={repo}")
        ours.wait_live()
        found = {"triton-mp": Server(ours.url, ours.metrics_port)}
        if theirs is not None:
            theirs.wait_live()
            found["triton"] = Server(theirs.url, theirs.metrics_port)
        yield found
    finally:
        if theirs is not None:
            theirs.stop(wait=False)
        ours.stop()


def _behind_a_blocker(url: str, model: str, n: int) -> list[str]:
    """A request that runs for 1 s, then ``n`` more sent 0.3 s later, 20 ms apart, while it
    runs: each one's outcome, "OK" or its message."""
    outcomes = [""] * (n + 1)

    def send(k: int, sleep: float) -> None:
        client = grpcclient.InferenceServerClient(url)
        x = grpcclient.InferInput("IN", [1, 1], "FP32")
        x.set_data_from_numpy(np.full((1, 1), k, np.float32))
        try:
            client.infer(model, [x], parameters={"sleep": sleep})
            outcomes[k] = "OK"
        except InferenceServerException as e:
            outcomes[k] = e.message() or ""
        finally:
            client.close()

    threads = [threading.Thread(target=send, args=(0, 1.0))]
    threads[0].start()
    time.sleep(0.3)
    for k in range(1, n + 1):
        threads.append(threading.Thread(target=send, args=(k, 0.0)))
        threads[-1].start()
        time.sleep(0.02)
    for t in threads:
        t.join(timeout=60)
    return outcomes


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def _settled(server: Server, model: str, before: dict[str, float], n: int) -> dict[str, float]:
    """The counts ``model`` gained since ``before`` once its statistics hold ``n`` requests
    (successes and failures): a batch is counted after its answers leave, on both servers."""
    return counted(
        lambda: _delta(before, server.counts(model)),
        lambda c: c.get("success", 0) + c.get("fail", 0) >= n,
        f"{model}'s statistics to count {n} requests",
    )


def test_a_full_queues_refusals_are_counted_nowhere(servers: dict[str, Server]) -> None:
    full = "[request id: <id_unknown>] Exceeds maximum queue size"
    for side, server in servers.items():
        before = server.counts("full_py")
        assert _behind_a_blocker(server.url, "full_py", 3) == ["OK", "OK", full, full], side
        counts = _settled(server, "full_py", before, 2)
        assert counts == {
            "success": 2,
            "fail": 0,
            "inference_count": 2,
            **dict.fromkeys(REASONS, 0),
        }, side


def test_a_queue_timeout_is_a_rejected_failure(servers: dict[str, Server]) -> None:
    for side, server in servers.items():
        before = server.counts("late_py")
        assert _behind_a_blocker(server.url, "late_py", 1) == ["OK", "Request timeout expired"]
        counts = _settled(server, "late_py", before, 2)
        assert counts == {
            "success": 1,
            "fail": 1,
            "inference_count": 1,
            **dict.fromkeys(REASONS, 0),
            "REJECTED": 1,
        }, side


def _cancel_one_behind_a_blocker(url: str, model: str) -> None:
    """A request that runs for 1 s; behind it, two queued, the first of which the client
    cancels (``async_infer(...).cancel()``) 0.1 s later; returns once the other is answered."""
    client = grpcclient.InferenceServerClient(url)
    answered: list[object] = []

    def x() -> list[grpcclient.InferInput]:
        i = grpcclient.InferInput("IN", [1, 1], "FP32")
        i.set_data_from_numpy(np.ones((1, 1), np.float32))
        return [i]

    def back(result: object, error: object) -> None:
        if error is None:  # NOTE: the cancelled call's callback gets the client's CANCELLED
            answered.append(result)

    try:
        client.async_infer(model, x(), back, parameters={"sleep": 1.0})
        time.sleep(0.3)
        doomed = client.async_infer(model, x(), back)
        client.async_infer(model, x(), back)
        time.sleep(0.1)
        doomed.cancel()
        deadline = time.monotonic() + 30
        while len(answered) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(answered) == 2
    finally:
        client.close()


DROPPED = {"success": 2, "fail": 1, "inference_count": 2, **dict.fromkeys(REASONS, 0)}
DROPPED["CANCELED"] = 1


@pytest.mark.parametrize("model", ["policed_py", "plain_py"])
def test_a_request_cancelled_while_queued_is_dropped_and_counted_canceled(
    servers: dict[str, Server], model: str
) -> None:
    # NOTE: triton-mp drops it in every model, as Triton's request_cancellation.md says the
    # core does. 2.51 drops it only where the queue applies a policy (core PriorityQueue::
    # PolicyQueue::ApplyPolicy, run for a dynamic_batching default_queue_policy with a size
    # or timeout); a model without one (no dynamic batching here; a bare
    # `dynamic_batching {}` as well) runs it, with `request.is_cancelled()` true, and
    # counts it a success. README "Request cancellation".
    theirs = {"policed_py": DROPPED, "plain_py": {**DROPPED, "success": 3, "fail": 0}}
    theirs["plain_py"].update(CANCELED=0, inference_count=3)
    for side, server in servers.items():
        before = server.counts(model)
        _cancel_one_behind_a_blocker(server.url, model)
        counts = _settled(server, model, before, 3)
        assert counts == (theirs[model] if side == "triton" else DROPPED), side
