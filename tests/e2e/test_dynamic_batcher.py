"""End to end: the dynamic batcher's rules, observed through tritonclient on a running server.

One server for the module, serving one slow python model under several ``dynamic_batching``
configurations. The model sleeps for the longest ``INPUT0[0, 0]`` (seconds) of its batch, then
answers each request with ``OUT = 2 * INPUT0``, ``SEQ`` (how many batches its instance ran
before this one: the order of execution) and ``COUNT`` (requests in the batch). The rules
themselves are unit-tested with a fake clock (tests/unit/test_priority_queue.py); here each
is shown to hold across processes: priorities, max_queue_size, REJECT and DELAY timeouts,
preserve_ordering, ragged batching and the batch sizes that statistics report.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, counted, server_factory, wait_queued

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SLOW_MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executions = 0

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        time.sleep(max(float(x.flat[0]) for x in inputs))
        seq = self.executions
        self.executions += 1
        responses = []
        for x in inputs:
            rows = x.shape[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", (x * 2).astype(np.float32)),
                pb_utils.Tensor("SEQ", np.full((rows, 1), seq, np.int64)),
                pb_utils.Tensor("COUNT", np.full((rows, 1), len(requests), np.int32)),
            ]))
        return responses
"""

IO = """
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] {ragged} }} ]
output [
  {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "SEQ" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
"""

MODELS = {
    "prio_py": (1, 1, "", "dynamic_batching { priority_levels: 2 default_priority_level: 2 }"),
    "bounded_py": (1, 1, "", "dynamic_batching { default_queue_policy { max_queue_size: 4 } }"),
    "reject_py": (
        1,
        1,
        "",
        """dynamic_batching {
             default_queue_policy {
               timeout_action: REJECT
               default_timeout_microseconds: 300000
               allow_timeout_override: true
             }
           }""",
    ),
    "delay_py": (
        1,
        1,
        "",
        """dynamic_batching {
             default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 500000 }
           }""",
    ),
    "ordered_py": (1, 2, "", "dynamic_batching { preserve_ordering: true }"),
    "unordered_py": (1, 2, "", "dynamic_batching { }"),
    "batch_py": (
        8,
        1,
        "",
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 200000 }",
    ),
    "ragged_py": (
        8,
        1,
        "allow_ragged_batch: true",
        "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 300000 }",
    ),
    "strict_py": (
        8,
        1,
        "",
        "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 300000 }",
    ),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    for name, (mbs, instances, ragged, batching) in MODELS.items():
        config = IO.format(mbs=mbs, instances=instances, ragged=ragged) + batching + "\n"
        write_python_model(repo, name, config, SLOW_MODEL)
    with server_factory(Path(tmp_path_factory.mktemp("logs"))) as start:
        yield start(repo)


@dataclass
class Result:
    tag: str
    seq: int = -1
    count: int = -1
    error: InferenceServerException | None = None
    done_at: float = 0.0


@dataclass
class Calls:
    """Asynchronous requests through one tritonclient connection; results in completion order."""

    client: grpcclient.InferenceServerClient
    done: list[Result] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0

    def send(
        self,
        model: str,
        tag: str,
        sleep_s: float = 0.0,
        *,
        width: int = 2,
        priority: int = 0,
        timeout_us: int | None = None,
    ) -> None:
        x = np.full((1, width), sleep_s, np.float32)
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)

        def on_done(result: grpcclient.InferResult | None, error: object) -> None:
            r = Result(tag, done_at=time.monotonic())
            if error is not None:
                assert isinstance(error, InferenceServerException)
                r.error = error
            else:
                assert result is not None
                np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2)
                r.seq = int(result.as_numpy("SEQ")[0, 0])
                r.count = int(result.as_numpy("COUNT")[0, 0])
            with self.lock:
                self.done.append(r)

        kwargs: dict[str, object] = {"priority": priority}
        if timeout_us is not None:
            kwargs["timeout"] = timeout_us
        self.client.async_infer(model, [inp], on_done, **kwargs)  # type: ignore[arg-type]
        self.sent += 1

    def wait(self, timeout_s: float = 60.0) -> dict[str, Result]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.done) == self.sent:
                    return {r.tag: r for r in self.done}
            time.sleep(0.01)
        raise AssertionError(f"only {len(self.done)} of {self.sent} requests were answered")


@pytest.fixture
def calls(server: ServerProcess) -> Iterator[Calls]:
    client = server.client()
    try:
        yield Calls(client)
    finally:
        client.close()


def _batch_stats(
    server: ServerProcess, model: str, requests: int
) -> tuple[dict[int, int], int, int]:
    """({batch size: executions}, success count, fail count) from ModelStatistics, once
    ``requests`` requests are counted (successes and failures)."""

    def counts(st: dict) -> int:
        s = st["inference_stats"]
        return int(s["success"].get("count", 0)) + int(s["fail"].get("count", 0))

    client = server.client()
    try:
        st = counted(
            lambda: client.get_inference_statistics(model, as_json=True)["model_stats"][0],
            lambda st: counts(st) >= requests,
            f"{requests} requests counted",
        )
    finally:
        client.close()
    sizes = {
        int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in st.get("batch_stats", [])
    }
    stats = st["inference_stats"]
    return sizes, int(stats["success"].get("count", 0)), int(stats["fail"].get("count", 0))


def test_a_priority_1_request_behind_100_priority_2_requests_is_served_next(
    server: ServerProcess, calls: Calls
) -> None:
    calls.send("prio_py", "blocker", 3.0)
    wait_queued(server.url, "prio_py", running=1)  # everything else queues behind it
    for i in range(100):
        calls.send("prio_py", f"low{i}", priority=2)
    wait_queued(server.url, "prio_py", running=1, waiting=100)
    calls.send("prio_py", "urgent", priority=1)
    results = calls.wait()
    assert all(r.error is None for r in results.values())
    assert results["blocker"].seq == 0
    assert results["urgent"].seq == 1
    assert sorted(results[f"low{i}"].seq for i in range(100)) == list(range(2, 102))


def test_max_queue_size_rejects_the_overflow_of_a_burst(
    server: ServerProcess, calls: Calls
) -> None:
    for i in range(20):
        calls.send("bounded_py", f"r{i}", 1.0)
    results = calls.wait().values()
    ok = [r for r in results if r.error is None]
    refused = [r for r in results if r.error is not None]
    # one running and four queued, or four queued when the burst reached the scheduler
    # before it dispatched the first request
    assert len(ok) in (4, 5)
    for r in refused:
        assert r.error is not None
        assert r.error.status() == "StatusCode.UNAVAILABLE"
        assert r.error.message().endswith("Exceeds maximum queue size")
        assert r.error.message().startswith("[request id: ")
    assert sorted(r.seq for r in ok) == list(range(len(ok)))
    # NOTE: a full queue's refusals are counted nowhere, as in Triton 2.51 (core
    # PolicyQueue::Enqueue; side by side in tests/e2e/test_queue_counts.py)
    sizes, success, fail = _batch_stats(server, "bounded_py", len(ok))
    assert (success, fail) == (len(ok), 0)


def test_reject_timeout_fails_queued_requests_while_the_instance_is_busy(
    server: ServerProcess, calls: Calls
) -> None:
    start = time.monotonic()
    calls.send("reject_py", "blocker", 1.5)
    wait_queued(server.url, "reject_py", running=1)
    calls.send("reject_py", "default")  # the model's 300 ms
    calls.send("reject_py", "short", timeout_us=50_000)  # shortened by allow_timeout_override
    calls.send("reject_py", "long", timeout_us=10_000_000)  # cannot lengthen it
    results = calls.wait()
    assert results["blocker"].error is None
    for tag in ("default", "short", "long"):
        err = results[tag].error
        assert err is not None, tag
        assert (err.status(), err.message()) == (
            "StatusCode.UNAVAILABLE",
            "Request timeout expired",
        )
        # answered when the timeout expired, not when the instance became free
        assert results[tag].done_at < results["blocker"].done_at
    assert results["short"].done_at - start < results["default"].done_at - start


def test_delay_timeout_moves_an_expired_request_behind_later_ones(calls: Calls) -> None:
    # t=0 blocker runs until 1.1 s; "early" queues at 0.1 s and its 500 ms run out at 0.6 s;
    # "late" queues at 0.9 s and is still in time (1.4 s) when the blocker ends
    calls.send("delay_py", "blocker", 1.1)
    time.sleep(0.1)
    calls.send("delay_py", "early")
    time.sleep(0.8)
    calls.send("delay_py", "late")
    results = calls.wait()
    assert all(r.error is None for r in results.values())
    assert results["late"].seq < results["early"].seq


@pytest.mark.parametrize(("model", "ordered"), [("ordered_py", True), ("unordered_py", False)])
def test_preserve_ordering_releases_responses_in_arrival_order(
    server: ServerProcess, calls: Calls, model: str, ordered: bool
) -> None:
    calls.send(model, "slow", 1.0)  # instance A
    wait_queued(server.url, model, running=1)
    calls.send(model, "fast", 0.0)  # instance B, done long before A
    calls.wait()
    order = [r.tag for r in calls.done]
    assert order == (["slow", "fast"] if ordered else ["fast", "slow"])


def test_batch_sizes_follow_preferred_size_and_delay(server: ServerProcess, calls: Calls) -> None:
    calls.send("batch_py", "blocker", 1.0)  # alone: goes when its 200 ms delay runs out
    wait_queued(server.url, "batch_py", running=1)
    for i in range(10):
        calls.send("batch_py", f"r{i}")
    results = calls.wait()
    assert all(r.error is None for r in results.values())
    # queued behind the blocker past their delay: everything up to max_batch_size goes at
    # once (preferred sizes notwithstanding), then the rest
    counts = sorted(r.count for tag, r in results.items() if tag != "blocker")
    assert counts == [2, 2] + [8] * 8
    # four requests within the delay reach the preferred size and go without waiting
    calls.done.clear()
    calls.sent = 0
    start = time.monotonic()
    for i in range(4):
        calls.send("batch_py", f"p{i}")
    results = calls.wait()
    assert {r.count for r in results.values()} == {4}
    assert max(r.done_at for r in results.values()) - start < 0.2
    sizes, success, fail = _batch_stats(server, "batch_py", 15)
    assert sizes == {1: 1, 8: 1, 2: 1, 4: 1}
    assert (success, fail) == (15, 0)


@pytest.mark.parametrize(("model", "together"), [("ragged_py", True), ("strict_py", False)])
def test_different_shapes_batch_together_only_with_allow_ragged_batch(
    calls: Calls, model: str, together: bool
) -> None:
    for width in (1, 2, 3):
        calls.send(model, f"w{width}", 0.0, width=width)
    results = calls.wait()
    assert all(r.error is None for r in results.values())
    counts = {r.count for r in results.values()}
    assert counts == ({3} if together else {1})
