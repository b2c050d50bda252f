"""The sequence batcher's refusals are counted nowhere, side by side with the real Triton 2.51.

Core ``SequenceBatchScheduler::Enqueue`` returns its refusals (no START for an unknown
sequence, a batch size over 1, no correlation ID) to the frontend before the request is
queued, so 2.51 counts them neither in the model's statistics (``fail``) nor in
``nv_inference_request_failure``; served requests are counted as ever.
"""

from __future__ import annotations

import json
import re
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching { max_sequence_idle_microseconds: 30000000 }
"""
SIDE_BY_SIDE_MODELS = {"seq_echo": PythonModel(CONFIG)}
"""seq_echo: a sequence model that answers INPUT0 as OUTPUT0 (tests/e2e/conftest.py's
``shared_side_by_side`` serves it)."""


def _counts(server: ServerProcess | RealTriton) -> tuple[int, int, float, float]:
    """success and fail counts of the model's statistics, and the sums of its
    ``nv_inference_request_success`` and ``nv_inference_request_failure`` series."""
    url = f"http://{server.http_url}/v2/models/seq_echo/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        stats = json.load(r)["model_stats"][0]["inference_stats"]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        text = r.read().decode()

    def total(family: str) -> float:
        pattern = rf'^{family}\{{[^}}]*model="seq_echo"[^}}]*\}} (\S+)$'
        return sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))

    return (
        stats["success"].get("count", 0),
        stats["fail"].get("count", 0),
        total("nv_inference_request_success"),
        total("nv_inference_request_failure"),
    )


def _send(client: grpcclient.InferenceServerClient, rows: int, **kw: object) -> str:
    t = grpcclient.InferInput("INPUT0", [rows, 1], "INT32")
    t.set_data_from_numpy(np.ones((rows, 1), np.int32))
    try:
        client.infer("seq_echo", [t], **kw)  # type: ignore[arg-type]
    except InferenceServerException as e:
        return f"{e.status()}: {e.message()}"
    return "served"


REFUSED = "StatusCode.INVALID_ARGUMENT: inference request "


def test_sequence_refusals_are_not_counted_as_failures(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    for name, server in shared_side_by_side.items():
        before = _counts(server)
        with grpcclient.InferenceServerClient(server.url) as client:
            assert _send(client, 1, sequence_id=5).startswith(REFUSED), name
            assert _send(client, 2, sequence_id=6, sequence_start=True).startswith(REFUSED)
            assert _send(client, 1).startswith(REFUSED), name
            assert _send(client, 1, sequence_id=7, sequence_start=True) == "served", name
            assert _send(client, 1, sequence_id=7, sequence_end=True) == "served", name
        after = _counts(server)
        got = tuple(a - b for a, b in zip(after, before, strict=True))
        assert got == (2, 0, 2.0, 0.0), name
