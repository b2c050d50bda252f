"""A queue policy's timeout shorter than the way to an idle instance, side by side with the
real Triton 2.51.

The dynamic batcher applies the queue policy when it forms a batch (core
``PriorityQueue::ApplyPolicyAtCursor``), so a request whose timeout ran out on its way there
is refused even when the instance was idle: with a timeout of 1 µs, 2.51 refuses every
request, "Request timeout expired" (UNAVAILABLE). Longer timeouts are served as ever.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, side_by_side

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching {
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 10000000
    allow_timeout_override: true
  }
}
"""
MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""
"""timed_py: an identity behind a REJECT queue policy whose timeout requests may override."""


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, ServerProcess | RealTriton]]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed."""
    repo = tmp_path_factory.mktemp("queue_timeout") / "repo"
    write_python_model(repo, "timed_py", CONFIG, MODEL)
    with side_by_side(repo, tmp_path_factory.mktemp("logs")) as found:
        yield found


def _answers(server: ServerProcess | RealTriton, timeout_us: int, n: int = 5) -> list[str]:
    """``n`` calls one after another (the instance idle for each) with ``timeout_us``."""
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[3]], np.int32))
    out = []
    with grpcclient.InferenceServerClient(server.url) as c:
        for _ in range(n):
            try:
                c.infer("timed_py", [t], timeout=timeout_us)
                out.append("served")
            except InferenceServerException as e:
                out.append(f"{e.status()}: {e.message()}")
    return out


def test_a_long_timeout_is_served(servers: dict[str, ServerProcess | RealTriton]) -> None:
    for name, server in servers.items():
        assert _answers(server, 5_000_000) == ["served"] * 5, name


def test_a_timeout_that_runs_out_before_the_batch_is_formed_is_refused(
    servers: dict[str, ServerProcess | RealTriton],
) -> None:
    expired = "StatusCode.UNAVAILABLE: Request timeout expired"
    for name, server in servers.items():
        assert _answers(server, 1) == [expired] * 5, name
