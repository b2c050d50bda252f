"""The local response cache's server-wide ``/metrics`` gauges, side by side with the real
Triton 2.51 on the session's shared pair (``--cache-config=local,...``).

2.51 (core ``metrics.cc`` with the local cache) writes eight gauges without labels:
``nv_cache_util``, ``nv_cache_num_entries``, ``nv_cache_num_hits``, ``nv_cache_num_misses``,
``nv_cache_num_lookups``, ``nv_cache_num_evictions``, and the two durations in microseconds
``nv_cache_lookup_duration`` and ``nv_cache_insertion_duration``. A dashboard or alert keyed on
those names must find the same ones on triton-mp.
"""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIDE_BY_SIDE_MODELS = {
    "r26_cached": PythonModel(
        """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
response_cache { enable: true }
"""
    )
}
"""r26_cached: INPUT0 FP32 [-1] answered as OUTPUT0, its responses cached
(tests/e2e/conftest.py's ``shared_side_by_side`` serves it with a 1 MiB local cache)."""

GAUGES = {
    "nv_cache_util": "Cache utilization [0.0 - 1.0]",
    "nv_cache_num_entries": "Number of responses stored in response cache",
    "nv_cache_num_hits": "Number of cache hits in response cache",
    "nv_cache_num_misses": "Number of cache misses in response cache",
    "nv_cache_num_lookups": "Number of cache lookups in response cache",
    "nv_cache_num_evictions": "Number of cache evictions in response cache",
    "nv_cache_lookup_duration": "Total cache lookup duration (hit and miss), in microseconds",
    "nv_cache_insertion_duration": "Total cache insertion duration, in microseconds",
}
"""2.51's cache-wide families, each a gauge without labels, with its HELP text."""


def _gauges(port: int) -> dict[str, tuple[str, str, list[float]]]:
    """The ``nv_cache_*`` families without labels at ``port``'s ``/metrics``: type, HELP
    text and sample values by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {
        f.name: (f.type, f.documentation, [s.value for s in f.samples])
        for f in text_string_to_metric_families(text)
        if f.name.startswith("nv_cache_") and not any(s.labels for s in f.samples)
    }


@pytest.mark.parametrize("which", ["triton-mp", "triton"])
def test_the_cache_gauges_have_the_names_of_251(
    shared_side_by_side: dict[str, ServerProcess | RealTriton], which: str
) -> None:
    """After a miss and a hit, the unlabelled ``nv_cache_*`` families are 2.51's eight, each a
    gauge with 2.51's HELP text, and the hit and lookup gauges count at least these two."""
    grpc_url, _ = urls_of(shared_side_by_side, which)
    server = shared_side_by_side[which]
    with grpcclient.InferenceServerClient(grpc_url) as c:
        for _ in range(2):
            t = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
            t.set_data_from_numpy(np.array([[2.5, 2.6, 26.0]], np.float32))
            c.infer("r26_cached", [t])
    found = _gauges(server.metrics_port)
    deadline = time.monotonic() + 15
    # NOTE: 2.51 refreshes the cache gauges every --metrics-interval-ms (2 s by default)
    while found.get("nv_cache_num_hits", ("", "", [0]))[2][0] < 1 and time.monotonic() < deadline:
        time.sleep(0.25)
        found = _gauges(server.metrics_port)
    assert {name: (kind, doc) for name, (kind, doc, _) in found.items()} == {
        name: ("gauge", doc) for name, doc in GAUGES.items()
    }
    assert all(len(values) == 1 for _, _, values in found.values()), found
    assert found["nv_cache_num_hits"][2][0] >= 1
    assert found["nv_cache_num_lookups"][2][0] >= 2
