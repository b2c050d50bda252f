"""A python model's output asked into a client shared-memory region too small for it, side by
side with the real Triton 2.51 on the session's shared pair (docs/differences.md).

Both answer the request INTERNAL (HTTP 500) "shared memory size specified with the request for
output 'OUTPUT0' (8 bytes) should be at least 16 bytes to hold the results". 2.51 finds it
when its python backend copies the model's outputs out (the response allocator refuses the
buffer): the model ran, and python_be.cc counts every request of a batch that ran as a
success (``success``, ``inference_count``, ``nv_inference_request_success``). triton-mp counts
a request whose outputs could not be delivered as failed (``fail``, reason BACKEND).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIDE_BY_SIDE_MODELS = {
    "r26_shm_out": PythonModel(
        """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
    )
}
"""r26_shm_out: INPUT0 FP32 [4] answered as OUTPUT0 (tests/e2e/conftest.py's
``shared_side_by_side`` serves it, with client shared memory on in both)."""

REFUSAL = (
    "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be "
    "at least 16 bytes to hold the results"
)


@pytest.fixture
def region() -> Iterator[str]:
    """A POSIX shared-memory object of one page holding 0..3 (FP32); its key. Destroyed at
    the end."""
    key = f"/r26_shm_out_{os.getpid()}"
    handle = shm.create_shared_memory_region("r26_shm_out", key, 4096)
    try:
        shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.float32)])
        yield key
    finally:
        shm.destroy_shared_memory_region(handle)


def _counts(server: ServerProcess | RealTriton) -> dict[str, int]:
    """r26_shm_out's success, fail and inference counts (HTTP statistics)."""
    url = f"http://{server.http_url}/v2/models/r26_shm_out/stats"
    with urllib.request.urlopen(url, timeout=30) as r:
        stats = json.load(r)["model_stats"][0]
    return {
        "success": stats["inference_stats"]["success"]["count"],
        "fail": stats["inference_stats"]["fail"]["count"],
        "inference_count": stats["inference_count"],
    }


def _too_small(server: ServerProcess | RealTriton, key: str) -> tuple[str, dict[str, int]]:
    """One request reading INPUT0 from a registered region and asking OUTPUT0 into its
    first 8 bytes (of 16): its error, and what it changed in ``_counts`` (only what
    changed)."""
    before = _counts(server)
    with grpcclient.InferenceServerClient(server.url) as c:
        c.register_system_shared_memory("r26_out", key, 16)
        try:
            t = grpcclient.InferInput("INPUT0", [4], "FP32")
            t.set_shared_memory("r26_out", 16)
            out = grpcclient.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("r26_out", 8)
            try:
                c.infer("r26_shm_out", [t], outputs=[out])
                said = "served"
            except InferenceServerException as e:
                said = f"{e.status()}: {e.message()}"
        finally:
            c.unregister_system_shared_memory("r26_out")
    deadline = time.monotonic() + 10
    after = _counts(server)
    while after == before and time.monotonic() < deadline:
        time.sleep(0.1)
        after = _counts(server)
    return said, {k: after[k] - before[k] for k in after if after[k] != before[k]}


@pytest.mark.parametrize(
    ("which", "counted"),
    [("triton-mp", {"fail": 1}), ("triton", {"success": 1, "inference_count": 1})],
)
def test_an_output_region_too_small(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
    region: str,
    which: str,
    counted: dict[str, int],
) -> None:
    urls_of(shared_side_by_side, which)
    said, changed = _too_small(shared_side_by_side[which], region)
    assert said == f"StatusCode.INTERNAL: {REFUSAL}"
    assert changed == counted
