"""``pb_utils.MetricFamily`` / ``Metric``: Triton's custom-metric rules, in one process.

No server and no shared memory: each test gets a fresh registry over process memory
(``set_metric_store(None)``). The calls are those Triton's custom_metrics example and its
documentation make.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from triton_mp.backends.python import pb_utils
from triton_mp.common.errors import ErrorCode

MF = pb_utils.MetricFamily


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    pb_utils.set_metric_store(None, owner="m_0")
    yield
    pb_utils.set_metric_store(None)


class RecordingStore:
    """A store that keeps what was published (and counts its growth)."""

    def __init__(self) -> None:
        self._buf = bytearray(8 * 4)
        self.values = memoryview(self._buf).cast("d")
        self.published: list[list[pb_utils.MetricFamilyRecord]] = []
        self.grown: list[int] = []

    def grow(self, slot_count: int) -> None:
        self.grown.append(slot_count)
        buf = bytearray(8 * slot_count)
        buf[: len(self._buf)] = self._buf
        self.values.release()
        self._buf = buf
        self.values = memoryview(buf).cast("d")

    def publish(self, families: Sequence[pb_utils.MetricFamilyRecord]) -> None:
        self.published.append(list(families))

    def series(self) -> dict[str, list[tuple[tuple[str, str], ...]]]:
        return {f.name: [m.labels for m in f.metrics] for f in self.published[-1]}


def test_the_documented_counter_example() -> None:
    """The README's example: a counter with labels, incremented by latencies, value()."""
    family = MF(
        name="preprocess_latency_ns",
        description="Cumulative time spent pre-processing requests",
        kind=MF.COUNTER,
    )
    metric = family.Metric(labels={"model": "model_name", "version": "1"})
    assert metric.value() == 0.0
    metric.increment(1500)
    metric.increment(2500.5)
    assert metric.value() == 4000.5


def test_counter_refuses_negative_increments_set_and_observe() -> None:
    family = MF("c", "a counter", MF.COUNTER)
    metric = family.Metric()
    metric.increment(2023.0)
    with pytest.raises(pb_utils.TritonModelException) as e:
        metric.increment(-23.5)
    assert e.value.message() == (
        "Failed to increment metric value: Failed to process the request for model 'm_0', "
        "message: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
        "non-negative values."
    )
    assert e.value.code() == ErrorCode.INVALID_ARG
    with pytest.raises(pb_utils.TritonModelException, match="COUNTER does not support Set"):
        metric.set(999.9)
    with pytest.raises(pb_utils.TritonModelException, match="COUNTER does not support Observe"):
        metric.observe(0.05)
    assert metric.value() == 2023.0


def test_gauge_increments_either_way_and_sets() -> None:
    family = MF("g", "a gauge", MF.GAUGE)
    metric = family.Metric(labels={"example1": "gauge_label1"})
    metric.increment(2023.0)
    metric.increment(-23.5)
    assert metric.value() == 1999.5
    metric.set(999.9)
    assert metric.value() == 999.9
    with pytest.raises(pb_utils.TritonModelException) as e:
        metric.observe(0.05)
    assert e.value.message().endswith("TRITONSERVER_METRIC_KIND_GAUGE does not support Observe")
    assert e.value.code() == ErrorCode.UNSUPPORTED


def test_histogram_observes_into_buckets_and_refuses_the_rest() -> None:
    store = RecordingStore()
    pb_utils.set_metric_store(lambda: store, owner="m_0")
    family = MF("h", "a histogram", MF.HISTOGRAM)
    metric = family.Metric(labels={"a": "b"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
    for value in (0.05, 1.5, 6.0, 1.0, 11.0, math.nan):
        metric.observe(value)
    slot = store.published[-1][0].metrics[0].slot
    sum_, *counts = store.values[slot : slot + 7]
    assert math.isnan(sum_)
    # bucket i counts values <= bound i (1.0 is in the "1" bucket); NaN and 11 go to +Inf
    assert counts == [1.0, 1.0, 1.0, 0.0, 1.0, 2.0]
    for call, verb in ((metric.value, "Value"), (lambda: metric.increment(1), "Increment")):
        with pytest.raises(
            pb_utils.TritonModelException, match=f"HISTOGRAM does not support {verb}"
        ):
            call()
    with pytest.raises(pb_utils.TritonModelException, match="HISTOGRAM does not support Set"):
        metric.set(1)


def test_histogram_buckets_rules() -> None:
    family = MF("test_histogram_args", "histogram args", MF.HISTOGRAM)
    for kwargs, message in (
        ({"labels": {}}, "Failed to create metric. Missing required buckets."),
        ({"labels": {}, "buckets": None}, "Failed to create metric. Missing required buckets."),
        ({"buckets": (1.0, 2.0)}, "Failed to create metric. Buckets must be a list."),
        ({"buckets": [2.5, 0.1, 1.0]}, "Bucket Boundaries must be strictly sorted"),
        ({"buckets": [1, 1, 2, 5, 5]}, "Bucket Boundaries must be strictly sorted"),
        ({"labels": {"le": "x"}, "buckets": [1.0]}, "Invalid label name"),
    ):
        with pytest.raises(pb_utils.TritonModelException) as e:
            family.Metric(**kwargs)  # type: ignore[arg-type]
        assert e.value.message().endswith(message), (kwargs, e.value.message())
    family.Metric(labels={}, buckets=[])  # only +Inf: allowed, as in Triton
    for kind in (MF.COUNTER, MF.GAUGE):
        with pytest.raises(pb_utils.TritonModelException, match="Unexpected buckets found"):
            MF(f"k{int(kind)}", "", kind).Metric(buckets=[1.0])


def test_labels_rules() -> None:
    family = MF("labelled", "", MF.COUNTER)
    with pytest.raises(pb_utils.TritonModelException, match="Labels must be a dictionary"):
        family.Metric(labels=[("a", "b")])  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException, match="label values are strings"):
        family.Metric(labels={"a": 1})  # type: ignore[dict-item]
    for name in ("__reserved", "1abc", "a-b", ""):
        with pytest.raises(pb_utils.TritonModelException, match="Invalid label name"):
            family.Metric(labels={name: "v"})
    family.Metric(labels={"le": "fine for a counter"})


def test_family_name_rules_and_kinds() -> None:
    for name in ("", "1abc", "has-dash", "__reserved", "sp ace"):
        with pytest.raises(pb_utils.TritonModelException) as e:
            MF(name, "", MF.COUNTER)
        assert e.value.message() == (
            "Error when creating MetricFamily: Failed to process the request for model "
            "'m_0', message: Invalid metric name"
        )
    MF("ns:sub_name_1", "", MF.GAUGE)
    MF(b"bytes_name", b"bytes description", MF.GAUGE)
    with pytest.raises(TypeError):
        MF("bad_kind", "", "COUNTER")  # type: ignore[arg-type]
    assert MF("int_kind", "", 2)._state.kind is MF.HISTOGRAM  # noqa: SLF001
    assert (MF.COUNTER, MF.GAUGE, MF.HISTOGRAM) == (0, 1, 2)


def test_same_name_and_kind_is_the_same_family_with_the_first_description() -> None:
    store = RecordingStore()
    pb_utils.set_metric_store(lambda: store)
    first = MF("test_dup_metric_family", "first description", MF.COUNTER)
    second = MF("test_dup_metric_family", "second description", MF.COUNTER)
    a = first.Metric(labels={"custom_metric_key": "label1"})
    b = second.Metric(labels={"custom_metric_key": "label2"})
    assert (a.value(), b.value()) == (0.0, 0.0)
    (family,) = store.published[-1]
    assert family.description == "first description"
    assert [m.labels for m in family.metrics] == [
        (("custom_metric_key", "label1"),),
        (("custom_metric_key", "label2"),),
    ]


def test_same_name_with_another_kind_is_refused() -> None:
    MF("test_dup_metric_family_diff_kind", "", MF.COUNTER)
    with pytest.raises(pb_utils.TritonModelException) as e:
        MF("test_dup_metric_family_diff_kind", "", MF.GAUGE)
    assert e.value.message().endswith("Family name already exists with different type")


def test_same_labels_are_one_shared_metric() -> None:
    family = MF("test_dup_metric", "dup metric", MF.COUNTER)
    one = family.Metric(labels={"example1": "label1", "example2": "label2"})
    two = family.Metric(labels={"example2": "label2", "example1": "label1"})
    one.increment(7.5)
    assert one.value() == two.value() == 7.5
    empty_a, empty_b = family.Metric(), family.Metric(labels={})
    empty_a.increment(1)
    assert empty_b.value() == 1.0


def test_a_histogram_series_keeps_its_first_buckets() -> None:
    store = RecordingStore()
    pb_utils.set_metric_store(lambda: store)
    family = MF("h_first", "", MF.HISTOGRAM)
    a = family.Metric(buckets=[1.0, 2.0])
    b = family.Metric(buckets=[5.0])
    b.observe(1.5)  # in the [1, 2] bucket of the shared series
    (metric,) = store.published[-1][0].metrics
    assert metric.buckets == (1.0, 2.0)
    assert list(store.values[metric.slot : metric.slot + 4]) == [1.5, 0.0, 1.0, 0.0]
    del a, b


def test_a_metric_of_a_family_used_in_one_expression_goes_with_that_family() -> None:
    """``MetricFamily(...).Metric()`` keeps no family: as in Triton, the family object is
    deleted at once and takes its metric with it (models keep the family, as Triton's
    example does in ``self.metric_family``)."""
    metric = MF("temporary", "", MF.COUNTER).Metric()
    with pytest.raises(pb_utils.TritonModelException, match="has been deleted"):
        metric.increment(1)


def test_deleting_the_family_deletes_its_metrics() -> None:
    """Triton's lifetime: the family keeps the metrics it made (deleting a Metric alone
    changes nothing); deleting the family clears them, and a Metric used after that raises
    Triton's error; another family handle of the same name keeps its own metrics."""
    store = RecordingStore()
    pb_utils.set_metric_store(lambda: store)
    family = MF("test_metric_lifetime", "lifetime", MF.GAUGE)
    other = MF("test_metric_lifetime", "lifetime", MF.GAUGE)
    metric = family.Metric(labels={"example1": "counter_label1"})
    dropped = family.Metric(labels={"dropped": "yes"})
    kept = other.Metric(labels={"kept": "yes"})
    del dropped
    gc.collect()
    assert len(store.series()["test_metric_lifetime"]) == 3
    del family
    assert store.series()["test_metric_lifetime"] == [(("kept", "yes"),)]
    message = (
        "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
        "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects "
        "have been deleted."
    )
    for call, operation in (
        (lambda: metric.set(10), "Failed to set metric value"),
        (lambda: metric.increment(10), "Failed to increment metric value"),
        (metric.value, "Failed to get metric value"),
    ):
        with pytest.raises(pb_utils.TritonModelException) as e:
            call()
        assert e.value.message() == f"{operation}: {message}"
    kept.set(3)
    assert kept.value() == 3.0


def test_a_series_shared_by_two_families_lives_until_both_are_gone() -> None:
    store = RecordingStore()
    pb_utils.set_metric_store(lambda: store)
    one = MF("shared", "", MF.COUNTER)
    two = MF("shared", "", MF.COUNTER)
    a = one.Metric(labels={"k": "v"})
    b = two.Metric(labels={"k": "v"})
    a.increment(2)
    del one
    assert store.series()["shared"] == [(("k", "v"),)]
    assert b.value() == 2.0
    del two
    assert store.series()["shared"] == []


def test_released_slots_are_reused_and_start_at_zero() -> None:
    store = RecordingStore()
    pb_utils.set_metric_store(lambda: store)
    family = MF("reuse", "", MF.COUNTER)
    metric = family.Metric(labels={"n": "1"})
    metric.increment(5)
    slot = store.published[-1][0].metrics[0].slot
    del family, metric
    family = MF("reuse", "", MF.COUNTER)
    again = family.Metric(labels={"n": "2"})
    assert store.published[-1][0].metrics[0].slot == slot
    assert again.value() == 0.0


def test_the_store_grows_and_keeps_values() -> None:
    store = RecordingStore()
    pb_utils.set_metric_store(lambda: store)
    family = MF("many", "", MF.COUNTER)
    metrics = [family.Metric(labels={"i": str(i)}) for i in range(100)]
    for i, m in enumerate(metrics):
        m.increment(i)
    assert store.grown, "it had 4 slots"
    assert [m.value() for m in metrics] == [float(i) for i in range(100)]


def test_a_family_finalised_inside_a_locked_section_waits_for_the_lock() -> None:
    """A garbage collection can finalise a MetricFamily while this same thread holds the
    registry's lock (in the middle of an operation): its release must wait, not deadlock,
    and happen when the lock is free."""
    store = RecordingStore()
    pb_utils.set_metric_store(lambda: store)
    family = MF("finalised", "", MF.COUNTER)
    family.Metric(labels={"a": "b"})
    registry = pb_utils._metrics  # noqa: SLF001
    with registry.lock:
        del family  # the finaliser runs now, inside the locked section
        assert registry.pending, "the release waits"
    registry.drain()
    assert store.series()["finalised"] == []


def test_metric_values_must_be_numbers() -> None:
    family = MF("numbers", "", MF.GAUGE)
    metric = family.Metric()

    metric.set(np.float32(1.5))
    metric.increment(np.int64(2))
    assert metric.value() == 3.5
    for bad in ("1", b"1", None, [1]):
        with pytest.raises(TypeError):
            metric.set(bad)  # type: ignore[arg-type]
