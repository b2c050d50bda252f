"""A queue policy's timeout shorter than the way to an idle instance, side by side with the
real Triton 2.51.

The dynamic batcher applies the queue policy when it forms a batch (core
``PriorityQueue::ApplyPolicyAtCursor``), so a request whose timeout ran out on its way there
is refused even when the instance was idle: with a timeout of 1 µs, 2.51 refuses every
request, "Request timeout expired" (UNAVAILABLE). Longer timeouts are served as ever.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

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
SIDE_BY_SIDE_MODELS = {"timed_py": PythonModel(CONFIG)}
"""timed_py: an identity behind a REJECT queue policy whose timeout requests may override
(tests/e2e/conftest.py's ``shared_side_by_side`` serves it)."""


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


def test_a_long_timeout_is_served(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    for name, server in shared_side_by_side.items():
        assert _answers(server, 5_000_000) == ["served"] * 5, name


def test_a_timeout_that_runs_out_before_the_batch_is_formed_is_refused(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    expired = "StatusCode.UNAVAILABLE: Request timeout expired"
    for name, server in shared_side_by_side.items():
        assert _answers(server, 1) == [expired] * 5, name
