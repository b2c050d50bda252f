"""``--metrics-config histogram_latencies=true``: the first-response histograms a frontend
writes on its board and the metrics frontend reads (``frontend.metrics.latency``), without a
server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from google.protobuf import text_format

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.frontend.metrics import custom as cm
from triton_mp.frontend.metrics.latency import (
    DEFAULT_BUCKETS,
    FirstResponseHistograms,
    buckets_of,
    first_response_sink,
    loaded_series,
)
from triton_mp.ipc.memory.topology import Topology, process_arena_prefix

SID = str(900_000 + os.getpid() % 90_000)
TOP = Topology(SID)
MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.ns = 10**12

    def __call__(self) -> int:
        return self.ns


_BUCKETS_1_10 = (
    "model_metrics { metric_control [ { metric_identifier { family: "
    '"nv_inference_first_response_histogram_ms" } histogram_options { buckets: [ 1, 10 ] '
    "} } ] }"
)


def _config(name: str, extra: str = "") -> mc.ModelConfig:
    return text_format.Parse(f'name: "{name}" {extra}', mc.ModelConfig())


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def frontends(clock: Clock) -> Iterator[list[FirstResponseHistograms]]:
    """Two frontend processes' histograms (frontends 0 and 1)."""
    made = [
        FirstResponseHistograms(process_arena_prefix(TOP.frontend_arenas(f), 4242), clock)
        for f in (0, 1)
    ]
    yield made
    for h in made:
        h.close()


def _scrape() -> str:
    reader = cm.BoardReader(SID)
    try:
        return cm.render(cm.merge(reader.read()))
    finally:
        reader.close()


def test_buckets_are_core_s_default_unless_the_config_names_others() -> None:
    assert buckets_of(_config("m")) == DEFAULT_BUCKETS == (100.0, 500.0, 2000.0, 5000.0)
    custom = _config(
        "m",
        "model_metrics { metric_control [ { metric_identifier { family: "
        '"nv_inference_first_response_histogram_ms" } histogram_options { buckets: [ 1, 10 ] '
        "} } ] }",
    )
    assert buckets_of(custom) == (1.0, 10.0)


def test_every_frontend_s_observations_make_one_histogram_per_model_version(
    clock: Clock, frontends: list[FirstResponseHistograms]
) -> None:
    m, e = _config("m"), _config("ens")
    first, second = frontends
    start = clock.ns
    clock.ns = start + 100 * MS  # on a bound: in its bucket (le)
    first.observe(m, 1, start)
    clock.ns = start + 100 * MS + 999_999  # whole milliseconds, as core divides
    second.observe(m, 1, start)
    clock.ns = start + 7_000 * MS
    second.observe(m, 1, start)
    clock.ns = start + 3 * MS
    first.observe(e, 1, start)
    text = _scrape()
    assert (
        "# HELP nv_inference_first_response_histogram_ms Duration from request to first "
        "response in milliseconds\n# TYPE nv_inference_first_response_histogram_ms histogram\n"
    ) in text
    m_lines = [line for line in text.splitlines() if 'model="m"' in line]
    assert m_lines == [
        'nv_inference_first_response_histogram_ms_count{model="m",version="1"} 3',
        'nv_inference_first_response_histogram_ms_sum{model="m",version="1"} 7200',
        'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="100"} 2',
        'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="500"} 2',
        'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="2000"} 2',
        'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="5000"} 2',
        'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="+Inf"} 3',
    ]
    assert 'nv_inference_first_response_histogram_ms_count{model="ens",version="1"} 1' in text


def test_a_request_observes_its_first_answer_only(
    clock: Clock, frontends: list[FirstResponseHistograms]
) -> None:
    got: list[object] = []
    sink = first_response_sink(got.append, frontends[0], _config("dec"), 2)
    clock.ns += 600 * MS
    for answer in ("a", "b", "final"):
        sink(answer)  # type: ignore[arg-type]
        clock.ns += 5_000 * MS
    assert got == ["a", "b", "final"]
    text = _scrape()
    assert 'nv_inference_first_response_histogram_ms_count{model="dec",version="2"} 1' in text
    assert 'nv_inference_first_response_histogram_ms_sum{model="dec",version="2"} 600' in text


def test_every_loaded_version_has_a_series_from_its_load_and_an_unloaded_one_none(
    clock: Clock, frontends: list[FirstResponseHistograms]
) -> None:
    """Core creates the series with the model's reporter (at load) and removes it with it."""
    clock.ns += 5 * MS
    frontends[0].observe(_config("m"), 1, clock.ns - 5 * MS)
    frontends[0].observe(_config("gone"), 1, clock.ns)
    reader = cm.BoardReader(SID)
    try:
        merged = cm.merge(reader.read())
    finally:
        reader.close()
    configs = {"m": _config("m"), "idle": _config("idle", _BUCKETS_1_10)}
    families = loaded_series(merged, [("m", 1), ("idle", 3), ("unknown", 1)], configs.get)
    text = cm.render(families)
    assert 'nv_inference_first_response_histogram_ms_count{model="m",version="1"} 1' in text
    assert 'nv_inference_first_response_histogram_ms_sum{model="m",version="1"} 5' in text
    idle = [line for line in text.splitlines() if '"idle"' in line]
    assert idle == [
        'nv_inference_first_response_histogram_ms_count{model="idle",version="3"} 0',
        'nv_inference_first_response_histogram_ms_sum{model="idle",version="3"} 0',
        'nv_inference_first_response_histogram_ms_bucket{model="idle",version="3",le="1"} 0',
        'nv_inference_first_response_histogram_ms_bucket{model="idle",version="3",le="10"} 0',
        'nv_inference_first_response_histogram_ms_bucket{model="idle",version="3",le="+Inf"} 0',
    ]
    assert '"gone"' not in text
    assert '"unknown"' not in text
    assert loaded_series([], [], configs.get) == []
