"""The dynamic batcher's delay and preferred size side by side with Triton 2.51: requests
that come within a waiting batch's delay join it, the request that reaches the preferred
size sends the batch at once, a burst over it leaves the rest for the delay, and the
statistics (inference and execution counts, executions per batch size) are 2.51's.

One python model (fixed shapes, ``max_batch_size`` 8, preferred size 4, a 1 s delay, one
instance) answers each request with ``COUNT``, the requests in its batch. Both servers get
the same requests: a first one, then two more within its delay (one batch of 3 when the
delay runs out); four (a batch of 4 at once); six at once (4 at once, then 2 at the delay).
The timing rules are unit-tested with a fake clock (tests/unit/test_dynamic_batcher.py);
tests/e2e/test_dynamic_batcher.py shows the other rules across processes, on ours only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory
from tests.helpers.spaced_requests import send_spaced
from tests.helpers.triton_peer import RealTriton, peers_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DELAY_S = 1.0

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1000000 }
"""

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = len(requests)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("COUNT", np.full((1, 1), n, np.int32))])
            for _ in requests
        ]
"""


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """gRPC URLs: ``triton-mp`` always, ``triton`` when the real Triton is installed."""
    repo = tmp_path_factory.mktemp("repo")
    write_python_model(repo, "join_py", CONFIG, MODEL)
    logs = tmp_path_factory.mktemp("logs")
    with server_factory(logs) as start:
        ours: ServerProcess = start(repo, wait=False)
        found = {"triton-mp": ours.url}
        env = peers_env()
        if env is None:
            ours.wait_live()
            yield found
            return
        # NOTE: the real Triton starts while ours does
        with RealTriton(env, logs / "triton.log", f"--model-repository={repo}") as theirs:
            ours.wait_live()
            theirs.wait_live()
            found["triton"] = theirs.url
            yield found


def _send(url: str, gaps_s: list[float]) -> list[tuple[int, float]]:
    """``send_spaced`` to join_py (client timeout 60 s)."""
    return send_spaced(url, "join_py", gaps_s, 60)


def _each(urls: dict[str, str], fn: Callable[[str, str], None]) -> None:
    for name, url in urls.items():
        fn(name, url)


def test_requests_within_the_delay_join_its_batch_as_in_triton(urls: dict[str, str]) -> None:
    def check(name: str, url: str) -> None:
        got = _send(url, [0.0, 0.05, 0.05])
        assert [c for c, _ in got] == [3, 3, 3], name
        assert min(t for _, t in got) >= DELAY_S * 0.9, (name, got)  # the delay sent it

    _each(urls, check)


def test_the_request_that_reaches_the_preferred_size_sends_the_batch_at_once(
    urls: dict[str, str],
) -> None:
    def check(name: str, url: str) -> None:
        got = _send(url, [0.0, 0.02, 0.02, 0.02])
        assert [c for c, _ in got] == [4] * 4, name
        assert max(t for _, t in got) < DELAY_S, (name, got)

    _each(urls, check)


def _stats(url: str) -> tuple[int, int, dict[int, int]]:
    """(inference_count, execution_count, executions per batch size) of join_py."""
    with grpcclient.InferenceServerClient(url) as client:
        (st,) = client.get_inference_statistics("join_py").model_stats
    sizes = {b.batch_size: b.compute_infer.count for b in st.batch_stats}
    return st.inference_count, st.execution_count, sizes


def test_a_burst_over_the_preferred_size_and_the_statistics_match(urls: dict[str, str]) -> None:
    seen = {}

    def check(name: str, url: str) -> None:
        before = _stats(url)
        got = _send(url, [0.0, 0.02, 0.02, 0.02, 0.02, 0.02])
        assert sorted(c for c, _ in got) == [2, 2, 4, 4, 4, 4], name
        late = sorted(t for c, t in got if c == 2)
        assert late[0] >= DELAY_S * 0.9, (name, got)
        after = _stats(url)
        sizes = {k: v - before[2].get(k, 0) for k, v in after[2].items()}
        seen[name] = (
            after[0] - before[0],
            after[1] - before[1],
            {k: v for k, v in sizes.items() if v},
        )

    _each(urls, check)
    assert seen["triton-mp"] == (6, 2, {4: 1, 2: 1})
    if "triton" in seen:
        assert seen["triton"] == seen["triton-mp"]
