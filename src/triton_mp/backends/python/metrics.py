"""Custom metrics of python models: ``pb_utils``'s metric store on this worker's board.

Imported by worker processes of python models (``workers.main`` installs it before the
backend imports ``model.py``). ``pb_utils.MetricFamily`` and ``Metric`` keep Triton's rules
and write their values into slots; here those slots are a ``ipc.memory.metric_board`` board in
shared memory, created when the model makes its first family (most models make none), and
``frontend.metrics.custom`` reads it at every scrape of ``GET /metrics``.
"""

from __future__ import annotations

from collections.abc import Sequence

from triton_mp.backends.python import pb_utils
from triton_mp.ipc.memory.metric_board import (
    BoardFamily,
    BoardMetric,
    BoardWriter,
    Kind,
    MetricCatalog,
)
from triton_mp.ipc.protocol.specs import InstanceSpec, ModelVersionSpec

_KINDS: dict[pb_utils.MetricKind, Kind] = {
    pb_utils.MetricKind.COUNTER: "counter",
    pb_utils.MetricKind.GAUGE: "gauge",
    pb_utils.MetricKind.HISTOGRAM: "histogram",
}


class BoardStore:
    """A ``pb_utils.MetricStore`` over a ``BoardWriter`` (made by ``install``).

    Args:
        owner_prefix: the worker's arena prefix with its pid (``/triton_mp_<sid>_w<iid>p<pid>``).
        model: the model version the worker serves.
        instance: the worker's instance.
    """

    def __init__(self, owner_prefix: str, model: ModelVersionSpec, instance: InstanceSpec) -> None:
        self._writer = BoardWriter(owner_prefix)
        self._model = model.model
        self._version = model.version
        self._instance = instance.name

    @property
    def values(self) -> memoryview[float]:
        return self._writer.values

    def grow(self, slot_count: int) -> None:
        self._writer.ensure_slots(slot_count)

    def publish(self, families: Sequence[pb_utils.MetricFamilyRecord]) -> None:
        self._writer.publish(
            MetricCatalog(
                model=self._model,
                version=self._version,
                instance=self._instance,
                families=tuple(
                    BoardFamily(
                        name=f.name,
                        kind=_KINDS[f.kind],
                        description=f.description,
                        created_ns=f.created_ns,
                        metrics=tuple(
                            BoardMetric(m.labels, m.slot, m.created_ns, m.buckets)
                            for m in f.metrics
                        ),
                    )
                    for f in families
                ),
            )
        )

    def close(self) -> None:
        self._writer.close()


class MetricsInstallation:
    """What ``install`` set up: the board, once the model made a family."""

    def __init__(self, owner_prefix: str, model: ModelVersionSpec, instance: InstanceSpec):
        self._args = (owner_prefix, model, instance)
        self.store: BoardStore | None = None

    def make_store(self) -> BoardStore:
        """``pb_utils``'s store factory (called once, under its registry's lock)."""
        self.store = BoardStore(*self._args)
        return self.store

    def close(self) -> None:
        """Unlink the board (the worker is stopping); custom metrics go with the instance,
        as they do when Triton unloads a python model."""
        pb_utils.set_metric_store(None)
        if self.store is not None:
            self.store.close()
            self.store = None


def install(
    owner_prefix: str, model: ModelVersionSpec, instance: InstanceSpec
) -> MetricsInstallation:
    """Make this process's ``pb_utils`` metrics live on a board of ``owner_prefix``."""
    installation = MetricsInstallation(owner_prefix, model, instance)
    pb_utils.set_metric_store(installation.make_store, owner=instance.name)
    return installation
