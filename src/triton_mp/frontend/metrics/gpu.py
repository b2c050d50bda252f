"""Triton's GPU metrics: ``nv_gpu_*`` gauges and ``nv_energy_consumption``, one series per GPU.

Imported by ``frontend.metrics.endpoint`` (frontend 0) and ``frontend.metrics.render``. Triton reads
them through DCGM every ``--metrics-interval-ms``; triton-mp reads the same fields through
NVML (``common.process.gpus``, by UUID), for the GPUs the server sees (``MetricsSpec.gpus``: empty
with ``--allow-gpu-metrics=false`` or without GPUs, and then no family is reported, as in a
Triton without GPUs). Names, help strings, types and the ``gpu_uuid`` label are Triton's
(core ``metrics.cc``):

- ``nv_gpu_utilization`` in [0, 1) (NVML's percent / 100);
- ``nv_gpu_memory_total_bytes`` / ``nv_gpu_memory_used_bytes``;
- ``nv_gpu_power_usage`` / ``nv_gpu_power_limit`` in watts;
- ``nv_energy_consumption``, a counter of joules since the server started: each sample adds
  the device's energy counter's growth since the previous one (the first sample sets the
  base), as Triton does.

A device that cannot be read reports zeros and one warning, as Triton's failure counters do.
Pure except for the NVML it is given, so it is tested with ``common.process.gpus.FakeNvml``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from triton_mp.common.process.gpus import Gpu, GpuSample, Nvml, NvmlUnavailable

__all__ = ["GPU_COUNTERS", "GPU_FAMILIES", "GpuGauges", "GpuReading", "gpu_families"]

log = logging.getLogger(__name__)

GPU_FAMILIES = {
    "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0)"),
    "nv_gpu_memory_total_bytes": ("gauge", "GPU total memory, in bytes"),
    "nv_gpu_memory_used_bytes": ("gauge", "GPU used memory, in bytes"),
    "nv_gpu_power_usage": ("gauge", "GPU power usage in watts"),
    "nv_gpu_power_limit": ("gauge", "GPU power management limit in watts"),
    "nv_energy_consumption": (
        "counter",
        "GPU energy consumption in joules since the Triton Server started",
    ),
}
"""Triton's GPU families, in Triton's order: name -> (type, help)."""

GPU_COUNTERS = tuple(n for n, (kind, _) in GPU_FAMILIES.items() if kind == "counter")
"""The counters among them (``render`` gives their headers Triton's name, without _total)."""


@dataclass(frozen=True)
class GpuReading:
    """One GPU's values at one sample, in the units of the metrics."""

    uuid: str
    utilization: float = 0.0
    memory_total_bytes: int = 0
    memory_used_bytes: int = 0
    power_usage_w: float = 0.0
    power_limit_w: float = 0.0
    energy_j: float = 0.0
    """Joules since the server's first sample."""


class GpuGauges:
    """Samples the server's GPUs (call ``sample`` every ``--metrics-interval-ms``).

    Args:
        gpus: the GPUs to report (``MetricsSpec.gpus``).
        nvml: where to read them.
    """

    def __init__(self, gpus: Sequence[Gpu], nvml: Nvml) -> None:
        self._gpus = tuple(gpus)
        self._nvml = nvml
        self._base_mj: dict[str, int] = {}
        self._energy_j: dict[str, float] = {g.uuid: 0.0 for g in self._gpus}
        self._warned: set[str] = set()
        self.readings: tuple[GpuReading, ...] = tuple(GpuReading(g.uuid) for g in self._gpus)
        """The latest sample of every GPU (zeros before the first)."""

    def sample(self) -> tuple[GpuReading, ...]:
        """Read every GPU once; updates and returns ``readings``."""
        out = []
        for g in self._gpus:
            try:
                s = self._nvml.sample(g.uuid)
            except NvmlUnavailable as e:
                if g.uuid not in self._warned:
                    self._warned.add(g.uuid)
                    log.warning(
                        "Unable to get GPU metrics for GPU %d (%s): %s", g.cuda_id, g.uuid, e
                    )
                out.append(GpuReading(g.uuid, energy_j=self._energy_j[g.uuid]))
                continue
            self._warned.discard(g.uuid)
            out.append(self._reading(g.uuid, s))
        self.readings = tuple(out)
        return self.readings

    def _reading(self, uuid: str, s: GpuSample) -> GpuReading:
        base = self._base_mj.setdefault(uuid, s.energy_mj)
        if s.energy_mj >= base:
            self._energy_j[uuid] += (s.energy_mj - base) * 0.001
        # NOTE: a counter only grows: a driver reload that resets NVML's total starts a new base.
        self._base_mj[uuid] = s.energy_mj
        return GpuReading(
            uuid,
            s.utilization,
            s.memory_total_bytes,
            s.memory_used_bytes,
            s.power_usage_w,
            s.power_limit_w,
            self._energy_j[uuid],
        )


def gpu_families(readings: Sequence[GpuReading]) -> Iterator[Metric]:
    """Triton's GPU families over ``readings`` (none when there is no GPU)."""
    if not readings:
        return
    for name, (kind, doc) in GPU_FAMILIES.items():
        family = (
            GaugeMetricFamily(name, doc, labels=("gpu_uuid",))
            if kind == "gauge"
            else Metric(name, doc, "counter")
        )
        for r in readings:
            value = {
                "nv_gpu_utilization": r.utilization,
                "nv_gpu_memory_total_bytes": r.memory_total_bytes,
                "nv_gpu_memory_used_bytes": r.memory_used_bytes,
                "nv_gpu_power_usage": r.power_usage_w,
                "nv_gpu_power_limit": r.power_limit_w,
                "nv_energy_consumption": r.energy_j,
            }[name]
            if isinstance(family, GaugeMetricFamily):
                family.add_metric((r.uuid,), value)
            else:
                # NOTE: Triton's counters have no _total suffix; the sample keeps the name.
                family.add_sample(name, {"gpu_uuid": r.uuid}, value)
        yield family
