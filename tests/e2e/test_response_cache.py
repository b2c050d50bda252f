"""End to end: the response cache, local and shared by two frontends, beside the real Triton.

One repository: ``cached_add`` (python, ``response_cache { enable: true }``) and
``plain_add`` (the same model without it). triton-mp runs it with two frontend processes
and ``--cache-config local,size=10000``; where the peers are installed the real Triton 2.51
runs the same repository with the same flag, and the same tests (the ``server`` fixture's
two parameters) check what a client sees on both: a repeated request is a hit on every new
connection (so on either frontend), counted in ``cache_hit`` and in success but not in
executions or inferences; the metrics count hits and misses per model; an entry is evicted
once newer ones fill the cache, and a model without ``response_cache`` always executes.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.repos import write_python_model
from tests.helpers.server import server_factory
from tests.helpers.triton_peer import start_triton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CACHE_BYTES = 10000
"""Room for two entries of 1000 FP32 values (4000 bytes each), not three."""

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
SOURCE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 1)]))
        return out
"""


ENSEMBLE = """
name: "ens_add"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "plain_add" model_version: -1
  input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }
response_cache { enable: true }
"""
"""An ensemble over the uncached model, cached at its top level."""


@dataclass
class Endpoint:
    """Where one server (ours or Triton) listens."""

    kind: str
    url: str
    http_url: str
    metrics_port: int


def _repository(root: Path) -> Path:
    repo = root / "repo"
    write_python_model(repo, "cached_add", CONFIG + "response_cache { enable: true }\n", SOURCE)
    write_python_model(repo, "plain_add", CONFIG, SOURCE)
    (repo / "ens_add" / "1").mkdir(parents=True)
    (repo / "ens_add" / "config.pbtxt").write_text(ENSEMBLE)
    return repo


@pytest.fixture(scope="module", params=["triton-mp", "triton"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Endpoint]:
    repo = _repository(tmp_path_factory.mktemp("cache"))
    flags = (f"--cache-config=local,size={CACHE_BYTES}",)
    if request.param == "triton":
        with start_triton(repo, tmp_path_factory.mktemp("triton") / "triton.log", *flags) as peer:
            yield Endpoint("triton", peer.url, peer.http_url, peer.metrics_port)
        return
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        s = start(repo, *flags, "--frontend-processes=2")
        yield Endpoint("triton-mp", s.url, s.http_url, s.metrics_port)


def _grpc_infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    """One request on a new connection (SO_REUSEPORT spreads them over the frontends)."""
    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput("IN", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        out = client.infer(model, [inp]).as_numpy("OUT")
        assert out is not None
        return out
    finally:
        client.close()


def _http_infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput("IN", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        out = client.infer(model, [inp]).as_numpy("OUT")
        assert out is not None
        return out
    finally:
        client.close()


def _stats(url: str, model: str) -> dict[str, int]:
    """The model's statistics once they settled: an execution is counted when the worker's
    BatchDone reaches the scheduler, which may come just after the client has its answer."""
    last = _stats_now(url, model)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = _stats_now(url, model)
        if now == last:
            return now
        last = now
    return last


def _stats_now(url: str, model: str) -> dict[str, int]:
    client = grpcclient.InferenceServerClient(url)
    try:
        st = client.get_inference_statistics(model, as_json=False).model_stats[0]
    finally:
        client.close()
    s = st.inference_stats
    return {
        "exec": st.execution_count,
        "inferences": st.inference_count,
        "success": s.success.count,
        "hit": s.cache_hit.count,
        "miss": s.cache_miss.count,
        "hit_ns": s.cache_hit.ns,
        "compute": s.compute_infer.count,
    }


def _metrics(port: int) -> dict[tuple[str, str], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # NOTE: the parser names counter samples <family>_total; key by the family.
            name = fam.name if fam.type == "counter" else s.name
            out[(name, s.labels.get("model", ""))] = s.value
    return out


def test_a_repeated_request_is_a_hit_on_every_connection(server: Endpoint) -> None:
    x = np.arange(1000, dtype=np.float32)
    before = _stats(server.url, "cached_add")
    np.testing.assert_array_equal(_grpc_infer(server.url, "cached_add", x), x + 1)
    after_miss = _stats(server.url, "cached_add")
    assert after_miss["exec"] == before["exec"] + 1
    assert after_miss["miss"] == before["miss"] + 1
    for i in range(12):
        infer = _grpc_infer if i % 2 else _http_infer
        url = server.url if i % 2 else server.http_url
        np.testing.assert_array_equal(infer(url, "cached_add", x), x + 1)
    st = _stats(server.url, "cached_add")
    assert st["exec"] == after_miss["exec"], "a hit must not execute"
    assert st["inferences"] == after_miss["inferences"]
    assert st["compute"] == after_miss["compute"]
    assert st["hit"] == after_miss["hit"] + 12
    assert st["success"] == after_miss["success"] + 12
    assert st["hit_ns"] > after_miss["hit_ns"]
    m = _metrics(server.metrics_port)
    assert m[("nv_cache_num_hits_per_model", "cached_add")] == st["hit"]
    assert m[("nv_cache_num_misses_per_model", "cached_add")] == st["miss"]
    assert m[("nv_inference_exec_count", "cached_add")] == st["exec"]
    assert m[("nv_inference_request_success", "cached_add")] == st["success"]
    assert ("nv_cache_num_hits_per_model", "plain_add") not in m


def test_a_model_without_response_cache_always_executes(server: Endpoint) -> None:
    x = np.full(8, 3, dtype=np.float32)
    before = _stats(server.url, "plain_add")
    for _ in range(3):
        np.testing.assert_array_equal(_grpc_infer(server.url, "plain_add", x), x + 1)
    st = _stats(server.url, "plain_add")
    assert st["exec"] == before["exec"] + 3
    assert (st["hit"], st["miss"]) == (0, 0)


def test_different_inputs_are_different_entries(server: Endpoint) -> None:
    a, b = np.full(4, 1, np.float32), np.full(4, 2, np.float32)
    before = _stats(server.url, "cached_add")
    np.testing.assert_array_equal(_grpc_infer(server.url, "cached_add", a), a + 1)
    np.testing.assert_array_equal(_grpc_infer(server.url, "cached_add", b), b + 1)
    np.testing.assert_array_equal(_grpc_infer(server.url, "cached_add", a), a + 1)
    st = _stats(server.url, "cached_add")
    assert st["exec"] == before["exec"] + 2
    assert st["hit"] == before["hit"] + 1


def test_the_least_recently_used_entry_is_evicted_when_the_cache_is_full(
    server: Endpoint,
) -> None:
    first, second, third = (np.full(1000, v, np.float32) for v in (10, 20, 30))
    for x in (first, second, third):
        _grpc_infer(server.url, "cached_add", x)
    before = _stats(server.url, "cached_add")
    np.testing.assert_array_equal(_grpc_infer(server.url, "cached_add", third), third + 1)
    assert _stats(server.url, "cached_add")["exec"] == before["exec"], "the newest is kept"
    np.testing.assert_array_equal(_grpc_infer(server.url, "cached_add", first), first + 1)
    assert _stats(server.url, "cached_add")["exec"] == before["exec"] + 1, "the oldest went"
    if server.kind == "triton-mp":
        m = _metrics(server.metrics_port)
        assert m[("nv_cache_num_evictions", "")] >= 2
        assert 0 < m[("nv_cache_util", "")] <= 1.0
        assert m[("nv_cache_num_entries", "")] <= 2
        assert m[("nv_cache_num_lookups", "")] == (
            m[("nv_cache_num_hits", "")] + m[("nv_cache_num_misses", "")]
        )


def test_an_ensemble_is_cached_at_its_top_level(server: Endpoint) -> None:
    x = np.full(6, 7, np.float32)
    before, step_before = _stats(server.url, "ens_add"), _stats(server.url, "plain_add")
    for _ in range(4):
        np.testing.assert_array_equal(_grpc_infer(server.url, "ens_add", x), x + 1)
    st, step = _stats(server.url, "ens_add"), _stats(server.url, "plain_add")
    assert step["exec"] == step_before["exec"] + 1, "the composing model ran once"
    assert st["hit"] == before["hit"] + 3
    assert st["miss"] == before["miss"] + 1
    assert st["success"] == before["success"] + 4
