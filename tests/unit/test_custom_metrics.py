"""Custom metrics from python workers to ``GET /metrics``, without processes.

The board (``ipc.memory.metric_board``) is written by ``pb_utils`` through
``backends.python.metrics``
and read by ``frontend.metrics.custom`` in this one process; the merge over several
instances and the text Triton writes are checked on plain data.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import pytest

from triton_mp.backends.python import metrics as python_metrics
from triton_mp.backends.python import pb_utils
from triton_mp.frontend.metrics import custom as cm
from triton_mp.frontend.metrics.render import MetricsSnapshot, render
from triton_mp.ipc.memory.metric_board import (
    HEADER,
    BoardFamily,
    BoardMetric,
    BoardSnapshot,
    BoardWriter,
    MetricCatalog,
    read_board,
)
from triton_mp.ipc.memory.shm import list_objects
from triton_mp.ipc.memory.topology import Topology, process_arena_prefix
from triton_mp.ipc.protocol.specs import InstanceSpec

SID = str(os.getpid())
TOP = Topology(SID)
MF = pb_utils.MetricFamily


class _Model:
    model = "custom_py"
    version = 1


def _instance(i: int) -> InstanceSpec:
    return InstanceSpec(instance_id=i, name=f"custom_py_0_{i}", model="custom_py", version=1)


@pytest.fixture
def install() -> Iterator[Any]:
    """``install(i)``: this process's pb_utils metrics on a board of instance ``i``."""
    made: list[python_metrics.MetricsInstallation] = []

    def start(i: int = 0) -> python_metrics.MetricsInstallation:
        prefix = process_arena_prefix(TOP.worker_arenas(i), os.getpid())
        made.append(python_metrics.install(prefix, _Model, _instance(i)))  # type: ignore[arg-type]
        return made[-1]

    yield start
    for installation in made:
        installation.close()


def _scrape() -> str:
    reader = cm.BoardReader(SID)
    try:
        return cm.render(cm.merge(reader.read()))
    finally:
        reader.close()


def test_no_board_until_a_family_is_made_and_none_after_close(install: Any) -> None:
    installation = install(0)
    assert not [n for n in list_objects(SID) if "_cm" in n]
    family = MF("made", "made now", MF.COUNTER)
    metric = family.Metric()
    metric.increment(1)
    assert [n for n in list_objects(SID) if "_cm" in n] == [f"triton_mp_{SID}_w0p{os.getpid()}_cm0"]
    installation.close()
    assert not [n for n in list_objects(SID) if "_cm" in n]
    metric.increment(1)  # a model touching its metrics after that does not fail
    assert metric.value() == 2.0


def test_values_reach_the_reader_without_the_worker_doing_anything(install: Any) -> None:
    install(0)
    counter = MF("test_counter_e2e", "test metric counter kind end to end", MF.COUNTER)
    gauge = MF("test_gauge_e2e", "gauge", MF.GAUGE)
    hist = MF("test_histogram_e2e", "histogram", MF.HISTOGRAM)
    c = counter.Metric(labels={"example2": "counter_label2", "example1": "counter_label1"})
    g = gauge.Metric(labels={"example1": "gauge_label1"})
    h = hist.Metric(labels={"example1": "histogram_label1"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
    c.increment(2023)
    g.increment(2023)
    g.increment(-23.5)
    text = _scrape()
    assert 'test_counter_e2e{example1="counter_label1",example2="counter_label2"} 2023\n' in text
    assert 'test_gauge_e2e{example1="gauge_label1"} 1999.5\n' in text
    assert 'test_histogram_e2e_count{example1="histogram_label1"} 0\n' in text
    assert 'test_histogram_e2e_bucket{example1="histogram_label1",le="+Inf"} 0\n' in text
    for value in (0.05, 1.5, 6.0):
        h.observe(value)
    text = _scrape()
    lines = [line for line in text.splitlines() if line.startswith("test_histogram_e2e")]
    labels = 'example1="histogram_label1"'
    assert lines == [
        f"test_histogram_e2e_count{{{labels}}} 3",
        f"test_histogram_e2e_sum{{{labels}}} {0.05 + 1.5 + 6.0}",
        f'test_histogram_e2e_bucket{{{labels},le="0.1"}} 1',
        f'test_histogram_e2e_bucket{{{labels},le="1"}} 1',
        f'test_histogram_e2e_bucket{{{labels},le="2.5"}} 2',
        f'test_histogram_e2e_bucket{{{labels},le="5"}} 2',
        f'test_histogram_e2e_bucket{{{labels},le="10"}} 3',
        f'test_histogram_e2e_bucket{{{labels},le="+Inf"}} 3',
    ]
    assert "# HELP test_counter_e2e test metric counter kind end to end\n" in text
    assert "# TYPE test_histogram_e2e histogram\n" in text


def test_the_board_grows_into_new_generations_and_keeps_values(install: Any) -> None:
    install(0)
    families = [MF(f"family_{i}", "x" * 200, MF.COUNTER) for i in range(200)]
    metrics = [f.Metric(labels={"i": str(i)}) for i, f in enumerate(families)]
    for i, m in enumerate(metrics):
        m.increment(i)
    boards = [n for n in list_objects(SID) if "_cm" in n]
    assert len(boards) == 1, "the old generation is unlinked"
    assert not boards[0].endswith("_cm0"), "it grew"
    text = _scrape()
    for i in range(200):
        assert f'family_{i}{{i="{i}"}} {i}\n' in text


def test_a_family_deleted_in_the_model_leaves_the_endpoint(install: Any) -> None:
    install(0)
    kept = MF("kept", "", MF.GAUGE)
    gone = MF("gone", "", MF.GAUGE)
    kept.Metric().set(1)  # the handle goes, the family keeps its metric
    gone_metric = gone.Metric()
    gone_metric.set(2)
    assert "\ngone 2\n" in _scrape()
    del gone
    text = _scrape()
    assert "kept 1\n" in text
    assert "gone" not in text
    del gone_metric


def _board(
    instance: str, families: list[BoardFamily], values: list[float], model: str = "m"
) -> BoardSnapshot:
    from array import array

    return BoardSnapshot(MetricCatalog(model, 1, instance, tuple(families)), array("d", values))


def _fam(name: str, kind: Any, created: int, *metrics: BoardMetric, doc: str = "") -> BoardFamily:
    return BoardFamily(name, kind, doc or name, created, tuple(metrics))


L = (("model", "m"),)


def test_counters_of_every_instance_add_up() -> None:
    a = _board("m_0", [_fam("c", "counter", 5, BoardMetric(L, 0, 5))], [3.0, 0.0])
    b = _board("m_1", [_fam("c", "counter", 2, BoardMetric(L, 0, 2), doc="first")], [4.0, 0.0])
    (family,) = cm.merge([a, b])
    assert (family.description, family.series[L].value) == ("first", 7.0)


def test_gauges_add_increments_and_the_last_set_wins() -> None:
    assert cm.merge_gauge([(2.0, 0.0), (3.0, 0.0)]) == 5.0, "only increments: they add up"
    assert cm.merge_gauge([(7.0, 100.0), (5.0, 200.0)]) == 5.0, "the later set wins"
    assert cm.merge_gauge([(7.0, 100.0), (1.0, 0.0)]) == 8.0, "plus pure incrementers"


def test_histograms_merge_bucket_by_bucket_when_their_buckets_agree(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bounds = (1.0, 2.0)
    a = _board("m_0", [_fam("h", "histogram", 1, BoardMetric(L, 0, 1, bounds))], [1.5, 0, 1, 0])
    b = _board("m_1", [_fam("h", "histogram", 2, BoardMetric(L, 0, 2, bounds))], [3.5, 1, 0, 1])
    c = _board("m_2", [_fam("h", "histogram", 3, BoardMetric(L, 0, 3, (9.0,)))], [9.0, 1, 0])
    (family,) = cm.merge([a, b, c])
    series = family.series[L]
    assert (series.value, series.counts, series.buckets) == (5.0, [1.0, 1.0, 1.0], bounds)
    assert "buckets [9.0]" in caplog.text


def test_a_name_made_with_another_kind_first_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    a = _board("m_0", [_fam("dup_kind", "counter", 1, BoardMetric(L, 0, 1))], [1.0, 0.0])
    b = _board("n_0", [_fam("dup_kind", "gauge", 2, BoardMetric(L, 0, 2))], [9.0, 0.0], "n")
    (family,) = cm.merge([a, b])
    assert (family.kind, family.series[L].value) == ("counter", 1.0)
    assert "instance n_0 is a gauge, but it was created as a counter first" in caplog.text


def test_empty_families_are_not_shown() -> None:
    assert cm.merge([_board("m_0", [_fam("empty", "counter", 1)], [])]) == []


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (2023.0, "2023"),
        (1999.5, "1999.5"),
        (0.05, "0.05"),
        (1e-05, "1e-05"),
        (10000.0, "10000"),
        (100000.0, "100000"),
        (123456.0, "123456"),
        (1e22, "1e+22"),
        (-2.5, "-2.5"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "Nan"),
        (0.1 + 0.2, "0.3"),
    ],
)
def test_numbers_are_written_as_prometheus_cpp_writes_them(value: float, text: str) -> None:
    assert cm.format_value(value) == text


def test_text_escapes_help_and_label_values() -> None:
    family = cm.Family("esc", "gauge", 'line one\nback\\slash "q"', 0)
    family.series[(("a", 'x"y\n\\'),)] = cm.Series((("a", 'x"y\n\\'),), 1.0)
    family.series[()] = cm.Series((), 2.0)
    assert cm.render([family]) == (
        '# HELP esc line one\\nback\\\\slash "q"\n'
        "# TYPE esc gauge\n"
        "esc 2\n"
        'esc{a="x\\"y\\n\\\\"} 1\n'
    )


def test_the_endpoint_appends_custom_families_and_skips_taken_names(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from triton_mp.ipc.protocol.messages import ModelStats

    stats = ModelStats(name="m", version=1)
    own = cm.Family("my_counter", "counter", "mine", 0, {L: cm.Series(L, 5.0)})
    clash = cm.Family("nv_inference_count", "counter", "clash", 1, {L: cm.Series(L, 9.0)})
    text = render(MetricsSnapshot(stats=(stats,), queues=(), custom=(own, clash))).decode()
    assert text.endswith(
        '# HELP my_counter mine\n# TYPE my_counter counter\nmy_counter{model="m"} 5\n'
    )
    assert text.count("# TYPE nv_inference_count counter") == 1
    assert "server's own metrics use that name" in caplog.text


def test_a_catalog_being_rewritten_is_retried_then_given_up() -> None:
    prefix = process_arena_prefix(TOP.worker_arenas(99), 1)
    writer = BoardWriter(prefix)
    try:
        writer.publish(MetricCatalog("m", 1, "m_0", ()))
        buf = bytearray(HEADER.size + 16384 + 8 * 512)
        buf[:] = memoryview(writer._segment.buf)[: len(buf)]  # noqa: SLF001
        assert read_board(buf) is not None
        buf[16] |= 1  # catalog_seq odd: a rewrite in progress
        assert read_board(buf) is None
        buf[16] &= ~1
        buf[HEADER.size] ^= 0xFF  # torn bytes: the checksum does not match
        assert read_board(buf) is None
        assert read_board(b"not a board at all, not a board at all, not a board, not!") is None
    finally:
        writer.close()
