"""Triton's GPU metric families (frontend.metrics.gpu) over the test-only fake NVML."""

from __future__ import annotations

import dataclasses
import re

import pytest

from triton_mp.common.process.gpus import FakeNvml, Gpu, GpuSample
from triton_mp.frontend.metrics.gpu import GPU_FAMILIES, GpuGauges
from triton_mp.frontend.metrics.render import MetricsSnapshot, render

A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
GPUS = (Gpu(0, A, "H200", (9, 0), 1 << 30), Gpu(1, B, "H200", (9, 0), 1 << 30))


class Varying(FakeNvml):
    """A fake whose energy counter grows by 2500 mJ per read and whose B cannot be read."""

    def __init__(self) -> None:
        super().__init__(
            [
                {
                    "uuid": A,
                    "utilization": 0.5,
                    "memory_total_bytes": 100,
                    "memory_used_bytes": 40,
                    "power_usage_w": 250.5,
                    "power_limit_w": 700,
                    "energy_mj": 1_000_000,
                }
            ]
        )
        self.reads = 0

    def sample(self, uuid: str) -> GpuSample:
        s = super().sample(uuid)
        self.reads += 1
        return dataclasses.replace(s, energy_mj=s.energy_mj + 2500 * self.reads)


def _parse(text: bytes) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for m in re.finditer(r'^(nv_\w+)\{gpu_uuid="([^"]+)"\} (\S+)$', text.decode(), re.M):
        out.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
    return out


def test_families_have_tritons_names_types_and_labels(caplog: pytest.LogCaptureFixture) -> None:
    gauges = GpuGauges(GPUS, Varying())
    gauges.sample()
    gauges.sample()
    gauges.sample()
    text = render(MetricsSnapshot(stats=(), queues=(), gpus=gauges.readings))
    for name, (kind, doc) in GPU_FAMILIES.items():
        assert f"# HELP {name} {doc}\n# TYPE {name} {kind}\n".encode() in text
    values = _parse(text)
    assert values["nv_gpu_utilization"] == {A: 0.5, B: 0.0}
    assert values["nv_gpu_memory_used_bytes"][A] == 40
    assert values["nv_gpu_power_usage"][A] == 250.5
    assert values["nv_gpu_power_limit"][A] == 700
    # NOTE: joules since the first sample: two later reads, 2.5 J each; no _total suffix.
    assert values["nv_energy_consumption"] == {A: 5.0, B: 0.0}
    assert b"nv_energy_consumption_total" not in text
    # B cannot be read: zeros and one warning, not one per sample.
    assert caplog.text.count("Unable to get GPU metrics for GPU 1") == 1


def test_no_gpus_no_families() -> None:
    text = render(MetricsSnapshot(stats=(), queues=()))
    assert b"nv_gpu" not in text
    assert b"nv_energy" not in text
