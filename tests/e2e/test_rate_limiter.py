"""End to end: the rate limiter (``--rate-limit execution_count``), beside the real Triton.

One repository of python models that sleep 50 ms per request and append each execution's
``start end`` (``time.monotonic``, the same clock in every process) to a file in their
model directory: ``rl_a`` and ``rl_b`` need resource ``R`` (count 1, the only unit there is),
``rl_free`` needs nothing; ``rl_p1`` and ``rl_p2`` need global resource ``G`` with
priorities 1 and 2. The same tests run against triton-mp and, where the peers are
installed, the real Triton 2.51 with the same flags (the ``server`` fixture's parameters):
``rl_a`` and ``rl_b`` never run at the same time while ``rl_free`` runs beside them; under
contention priority 2 gets about half the executions of priority 1; a model that needs
more of a resource than ``--rate-limit-resource`` gives fails to load with Triton's
message, and the server keeps serving.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import server_factory
from tests.helpers.triton_peer import start_triton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SOURCE = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "runs.log")

    def execute(self, requests):
        start = time.monotonic()
        time.sleep(0.05)
        end = time.monotonic()
        with open(self.log, "a") as f:
            f.write(f"{start} {end}\\n")
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""


def _config(rate_limiter: str) -> str:
    return f"""
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU {rate_limiter} }} ]
"""


MODELS = {
    "rl_a": 'rate_limiter { resources [ { name: "R" count: 1 } ] }',
    "rl_b": 'rate_limiter { resources [ { name: "R" count: 1 } ] }',
    "rl_free": "",
    "rl_p1": 'rate_limiter { resources [ { name: "G" global: true count: 1 } ] priority: 1 }',
    "rl_p2": 'rate_limiter { resources [ { name: "G" global: true count: 1 } ] priority: 2 }',
    "rl_greedy": 'rate_limiter { resources [ { name: "R" count: 2 } ] }',
}
SERVED = ("rl_a", "rl_b", "rl_free", "rl_p1", "rl_p2")
FLAGS = (
    "--rate-limit=execution_count",
    "--rate-limit-resource=R:1",
    "--rate-limit-resource=G:1",
    "--model-control-mode=explicit",
    *(f"--load-model={m}" for m in SERVED),
)


@dataclass
class Endpoint:
    kind: str
    url: str
    repo: Path


@pytest.fixture(scope="module", params=["triton-mp", "triton"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Endpoint]:
    repo = tmp_path_factory.mktemp("rate_limit") / "repo"
    for name, limiter in MODELS.items():
        write_python_model(repo, name, _config(limiter), SOURCE)
    if request.param == "triton":
        with start_triton(repo, tmp_path_factory.mktemp("triton") / "triton.log", *FLAGS) as peer:
            yield Endpoint("triton", peer.url, repo)
        return
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield Endpoint("triton-mp", start(repo, *FLAGS).url, repo)


def _runs(ep: Endpoint, model: str) -> list[tuple[float, float]]:
    path = ep.repo / model / "runs.log"
    if not path.exists():
        return []
    return [tuple(map(float, line.split())) for line in path.read_text().splitlines()]  # type: ignore[misc]


def _load(ep: Endpoint, model: str, seconds: float, threads: int = 3) -> None:
    """``threads`` clients each sending one request after another for ``seconds``."""
    stop = time.monotonic() + seconds
    errors: list[BaseException] = []

    def loop() -> None:
        client = grpcclient.InferenceServerClient(ep.url)
        inp = grpcclient.InferInput("IN", [1], "FP32")
        inp.set_data_from_numpy(np.ones(1, np.float32))
        try:
            while time.monotonic() < stop:
                client.infer(model, [inp])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            client.close()

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors


def _loads(ep: Endpoint, models: tuple[str, ...], seconds: float) -> None:
    workers = [threading.Thread(target=_load, args=(ep, m, seconds)) for m in models]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def _overlaps(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> int:
    return sum(1 for s1, e1 in a for s2, e2 in b if s1 < e2 and s2 < e1)


def test_a_shared_resource_of_one_is_never_held_twice(server: Endpoint) -> None:
    _loads(server, ("rl_a", "rl_b", "rl_free"), 2.0)
    a, b, free = (_runs(server, m) for m in ("rl_a", "rl_b", "rl_free"))
    assert len(a) >= 5
    assert len(b) >= 5
    assert _overlaps(a, b) == 0, "rl_a and rl_b ran at the same time"
    assert _overlaps(free, a + b) >= 3, "the model without resources was held back"


def test_priority_two_gets_about_half_the_executions_of_priority_one(server: Endpoint) -> None:
    _loads(server, ("rl_p1", "rl_p2"), 3.0)
    p1, p2 = len(_runs(server, "rl_p1")), len(_runs(server, "rl_p2"))
    assert p2 >= 5
    assert 1.5 <= p1 / p2 <= 2.7, (p1, p2)
    assert _overlaps(_runs(server, "rl_p1"), _runs(server, "rl_p2")) == 0


def test_a_need_above_the_given_count_fails_the_load_with_triton_s_message(
    server: Endpoint,
) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("rl_greedy")
        assert (
            'Resource count for "R" is limited to 1 which will prevent scheduling of one or '
            "more model instances, the minimum required count is 2"
        ) in e.value.message()
        assert client.is_model_ready("rl_a")
        assert not client.is_model_ready("rl_greedy")
    finally:
        client.close()
