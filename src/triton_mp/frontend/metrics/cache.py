"""The response cache's Prometheus families (``frontend.metrics.render`` renders them).

Imported by ``frontend.metrics.render`` only; pure. Per model (core ``metrics.cc``, only for models
whose ``response_cache`` is enabled while the server has a cache, as Triton creates them):
``nv_cache_num_hits_per_model``, ``nv_cache_num_misses_per_model``,
``nv_cache_hit_duration_per_model`` and ``nv_cache_miss_duration_per_model`` (microseconds),
from the scheduler's ModelStatistics. For the local cache, the cache-wide gauges Triton's
local cache reports, read from the shared segment's header (``ipc.memory.response_cache``),
in 2.51's order and words: ``nv_cache_util`` (0..1), ``nv_cache_num_entries``,
``nv_cache_num_hits``, ``nv_cache_num_misses``, ``nv_cache_num_lookups``,
``nv_cache_num_evictions``, ``nv_cache_lookup_duration`` and ``nv_cache_insertion_duration``
(microseconds).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from triton_mp.ipc.memory.response_cache import CacheStats
from triton_mp.ipc.protocol.reports import ModelStats

MODEL_COUNTERS = {
    "nv_cache_num_hits_per_model": "Number of cache hits per model",
    "nv_cache_num_misses_per_model": "Number of cache misses per model",
    "nv_cache_hit_duration_per_model": "Total cache hit duration per model, in microseconds",
    "nv_cache_miss_duration_per_model": (
        "Total cache miss (insert+lookup) duration per model, in microseconds"
    ),
}
"""Triton's per-model cache counters (no ``_total``, as ``frontend.metrics.render`` writes
them)."""


def model_families(stats: Iterable[ModelStats], cached: frozenset[str]) -> Iterator[Metric]:
    """The per-model counters of the models in ``cached`` (none when it is empty)."""
    if not cached:
        return
    families = {name: Metric(name, doc, "counter") for name, doc in MODEL_COUNTERS.items()}
    for st in stats:
        if st.name not in cached:
            continue
        labels = {"model": st.name, "version": str(st.version)}
        values = (
            st.cache_hit.count,
            st.cache_miss.count,
            st.cache_hit.ns // 1000,
            st.cache_miss.ns // 1000,
        )
        for name, value in zip(MODEL_COUNTERS, values, strict=True):
            families[name].add_sample(name, labels, value)
    yield from families.values()


def cache_families(cache: CacheStats | None) -> Iterator[Metric]:
    """The local cache's gauges; nothing for Redis or without a cache."""
    if cache is None:
        return
    for name, doc, value in (
        ("nv_cache_util", "Cache utilization [0.0 - 1.0]", cache.utilization),
        ("nv_cache_num_entries", "Number of responses stored in response cache", cache.entries),
        ("nv_cache_num_hits", "Number of cache hits in response cache", cache.hits),
        ("nv_cache_num_misses", "Number of cache misses in response cache", cache.misses),
        ("nv_cache_num_lookups", "Number of cache lookups in response cache", cache.lookups),
        (
            "nv_cache_num_evictions",
            "Number of cache evictions in response cache",
            cache.evictions,
        ),
        (
            "nv_cache_lookup_duration",
            "Total cache lookup duration (hit and miss), in microseconds",
            cache.lookup_ns // 1000,
        ),
        (
            "nv_cache_insertion_duration",
            "Total cache insertion duration, in microseconds",
            cache.insert_ns // 1000,
        ),
    ):
        yield GaugeMetricFamily(name, doc, value=value)
