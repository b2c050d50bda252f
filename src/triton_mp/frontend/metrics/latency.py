"""Triton's latency histograms (``--metrics-config histogram_latencies=true``): the
``nv_inference_first_response_histogram_ms`` family, per model version.

Imported by the frontend (``frontend.main`` makes one ``FirstResponseHistograms`` per frontend
process when the setting is on; ``frontend.inference`` wraps each request's sink with
``first_response_sink``). Upstream core (``metric_model_reporter.cc``, ``infer_response.cc``,
25.01 on; every model since core #464, 2025-12, ensembles included; Triton 2.51 has no such
family): the family is "Duration from request to first response in milliseconds", labels
``model`` and ``version``, buckets ``100, 500, 2000, 5000`` unless the model's config names
others (``model_metrics { metric_control [ { metric_identifier { family:
"nv_inference_first_response_histogram_ms" } histogram_options { buckets: [...] } } ] }``);
each request observes once, at its first response, the whole milliseconds since it entered
the server (core divides integer nanoseconds).

Every frontend process keeps its series on a board of its own in shared memory
(``ipc.memory.metric_board``, named ``frontend_metric_board`` by ``ipc.memory.topology``): the
frontend that serves ``/metrics`` reads them with the python models' boards
(``frontend.metrics.custom``), so N frontends report one histogram per model version. A dead
frontend's board stays until the server stops: its observations keep counting.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.frontend.metrics.custom import Family, Series
from triton_mp.ipc.memory.metric_board import BoardFamily, BoardMetric, BoardWriter, MetricCatalog

if TYPE_CHECKING:
    from triton_mp.frontend.dispatch.pending import Answer

FAMILY = "nv_inference_first_response_histogram_ms"
HELP = "Duration from request to first response in milliseconds"
DEFAULT_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)
"""Core's ``histogram_options_`` default for the first-response histogram (ms)."""


def buckets_of(config: mc.ModelConfig) -> tuple[float, ...]:
    """The bucket bounds of a model's first-response histogram: its config's
    ``model_metrics.metric_control`` for the family, else ``DEFAULT_BUCKETS``."""
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == FAMILY:
            return tuple(control.histogram_options.buckets)
    return DEFAULT_BUCKETS


class FirstResponseHistograms:
    """One frontend process's first-response histograms, on its board.

    Args:
        owner_prefix: the process's arena prefix (``topology.process_arena_prefix`` of
            ``Topology.frontend_arenas``); the board is named from it.
        clock_ns: CLOCK_MONOTONIC nanoseconds.
    """

    def __init__(self, owner_prefix: str, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._writer = BoardWriter(owner_prefix, slot_count=64, catalog_capacity=4096)
        self.clock_ns = clock_ns
        self._series: dict[tuple[str, int], tuple[int, tuple[float, ...]]] = {}
        """(model, version) -> (first slot, bucket bounds)."""
        self._metrics: list[BoardMetric] = []
        self._next_slot = 0

    def observe(self, model: mc.ModelConfig, version: int, start_ns: int) -> None:
        """One request's first response, now; it entered the server at ``start_ns``."""
        ms = float(max(0, self.clock_ns() - start_ns) // 1_000_000)
        series = self._series.get((model.name, version))
        if series is None:
            series = self._add(model, version)
        slot, bounds = series
        values = self._writer.values
        values[slot] += ms
        # NOTE: Prometheus buckets are upper bounds (le): a value on a bound is in it.
        values[slot + 1 + bisect.bisect_left(bounds, ms)] += 1.0

    def _add(self, model: mc.ModelConfig, version: int) -> tuple[int, tuple[float, ...]]:
        bounds = buckets_of(model)
        slot = self._next_slot
        self._next_slot += 2 + len(bounds)
        self._writer.ensure_slots(self._next_slot)
        labels = (("model", model.name), ("version", str(version)))
        self._metrics.append(BoardMetric(labels, slot, self.clock_ns(), bounds))
        family = BoardFamily(FAMILY, "histogram", HELP, 0, tuple(self._metrics))
        self._writer.publish(MetricCatalog("", 0, "frontend", (family,)))
        self._series[(model.name, version)] = (slot, bounds)
        return slot, bounds

    def close(self) -> None:
        """Unlink the board (the frontend is stopping)."""
        self._writer.close()


def loaded_series(
    families: list[Family],
    versions: Iterable[tuple[str, int]],
    config_of: Callable[[str], mc.ModelConfig | None],
) -> list[Family]:
    """``families`` (merged boards) with the first-response family as core reports it: a
    series for every loaded model version from its load on (zero counts until its first
    request; core creates it with the model's reporter), none for a version no longer
    loaded (core removes it with the reporter).

    Args:
        versions: the loaded (model, version) pairs (the scheduler's statistics).
        config_of: a model's config (its buckets); None when the frontend does not know it.
    """
    out = [f for f in families if f.name != FAMILY]
    have = next((f for f in families if f.name == FAMILY), None)
    family = Family(FAMILY, "histogram", HELP, 0)
    for model, version in versions:
        labels = (("model", model), ("version", str(version)))
        series = have.series.get(labels) if have is not None else None
        if series is None:
            config = config_of(model)
            if config is None:
                continue
            bounds = buckets_of(config)
            series = Series(labels, 0.0, bounds, [0.0] * (len(bounds) + 1))
        family.series[labels] = series
    return [family, *out] if family.series else out


def first_response_sink(
    sink: Callable[[Answer], None],
    histograms: FirstResponseHistograms,
    model: mc.ModelConfig,
    version: int,
) -> Callable[[Answer], None]:
    """``sink`` that observes the request's first answer (a response or an error, as core
    observes the first response it sends) in ``histograms``; the request enters now."""
    start_ns = histograms.clock_ns()
    first = True

    def observing(msg: Answer) -> None:
        nonlocal first
        if first:
            first = False
            histograms.observe(model, version, start_ns)
        sink(msg)

    return observing
