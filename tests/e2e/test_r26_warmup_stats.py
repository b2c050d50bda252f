"""A model's ``model_warmup`` executions in its statistics and ``/metrics``, side by side with
the real Triton 2.51 on the session's shared pair.

Core ``TritonModelInstance::WarmUp`` stamps each warmup request's start and runs it on the
backend like any request, so the model's statistics count every warmup execution: each
request a success (queued for no time) and an inference, each execution one batch of its
requests (``batch_stats``), ``last_inference`` set; ``nv_inference_count`` and
``nv_inference_request_success`` count them too. triton-mp's workers warm up before the
scheduler sees them, and their runs were left out: a model with warmup showed 0 until its
first request.
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIDE_BY_SIDE_MODELS = {
    "r26_warm": PythonModel(
        """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
model_warmup [
  { name: "one" batch_size: 1
    inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } },
  { name: "pairs" batch_size: 2 count: 3
    inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 2 ] random_data: true } } }
]
"""
    )
}
"""r26_warm: INPUT0 answered as OUTPUT0, two instances, each warming up with one execution
of one request and three of two requests (tests/e2e/conftest.py's ``shared_side_by_side``
serves it; no test sends it a request)."""

PER_INSTANCE = {"executions": 1 + 3, "requests": 1 + 3 * 2}
EXPECTED = {
    "inference_count": 2 * PER_INSTANCE["requests"],
    "execution_count": 2 * PER_INSTANCE["executions"],
    "success": 2 * PER_INSTANCE["requests"],
    "fail": 0,
    "queue": 2 * PER_INSTANCE["requests"],
    "compute_input": 2 * PER_INSTANCE["requests"],
    "compute_infer": 2 * PER_INSTANCE["requests"],
    "compute_output": 2 * PER_INSTANCE["requests"],
    "batch_stats": {1: 2 * 1, 2: 2 * 3},
    "last_inference_set": True,
    "nv_inference_count": 2.0 * PER_INSTANCE["requests"],
    "nv_inference_exec_count": 2.0 * PER_INSTANCE["executions"],
    "nv_inference_request_success": 2.0 * PER_INSTANCE["requests"],
}


def _counts(server: ServerProcess | RealTriton) -> dict[str, object]:
    """r26_warm's statistics counts (HTTP) and its ``/metrics`` counters."""
    url = f"http://{server.http_url}/v2/models/r26_warm/stats"
    with urllib.request.urlopen(url, timeout=30) as r:
        (st,) = json.load(r)["model_stats"]
    found: dict[str, object] = {
        "inference_count": st["inference_count"],
        "execution_count": st["execution_count"],
        **{k: v.get("count", 0) for k, v in st["inference_stats"].items() if "cache" not in k},
        "batch_stats": {b["batch_size"]: b["compute_infer"]["count"] for b in st["batch_stats"]},
        "last_inference_set": st["last_inference"] > 0,
    }
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        text = r.read().decode()
    for family in ("nv_inference_count", "nv_inference_exec_count", "nv_inference_request_success"):
        pattern = rf'^{family}\{{model="r26_warm",version="1"\}} (\S+)$'
        found[family] = sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))
    return found


@pytest.mark.parametrize("which", ["triton-mp", "triton"])
def test_warmup_executions_are_counted(
    shared_side_by_side: dict[str, ServerProcess | RealTriton], which: str
) -> None:
    urls_of(shared_side_by_side, which)
    assert _counts(shared_side_by_side[which]) == EXPECTED
