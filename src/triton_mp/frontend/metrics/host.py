"""The host's readings on ``/metrics``: Triton's ``nv_cpu_*`` gauges and each process's memory.

Imported by ``frontend.metrics.endpoint`` (the endpoint samples them) and
``frontend.metrics.render``
(which writes them); psutil reads ``/proc``. ``CpuSample`` is what Triton's CPU polling
thread keeps (core ``metrics.cc``), ``ProcessMemory`` one triton-mp process's resident memory
(``triton_mp_process_resident_memory_bytes``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import psutil
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from triton_mp.common.labels import unique_labels


class CpuSample(NamedTuple):
    """The machine's CPU and memory, as Triton's ``nv_cpu_*`` gauges report them."""

    utilization: float
    """Busy share of all CPUs since the previous sample, 0.0 to 1.0."""
    memory_total_bytes: int
    memory_used_bytes: int
    """Total minus available (``/proc/meminfo``), as Triton computes it."""


class ProcessMemory(NamedTuple):
    """Resident memory of one triton-mp process."""

    role: str
    """``supervisor``, ``scheduler``, ``frontend``, ``worker``, ``resource_tracker``
    (multiprocessing's helper) or ``other``."""
    instance: str
    """Frontend index, worker instance name (``add_sub_0_0``), pid (``other``) or empty."""
    rss_bytes: int


def cpu_families(cpu: CpuSample) -> Iterator[Metric]:
    """Triton's ``nv_cpu_*`` gauges of one sample (core ``metrics.cc``)."""
    yield GaugeMetricFamily(
        "nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=cpu.utilization
    )
    yield GaugeMetricFamily(
        "nv_cpu_memory_total_bytes",
        "CPU total memory (RAM), in bytes",
        value=cpu.memory_total_bytes,
    )
    yield GaugeMetricFamily(
        "nv_cpu_memory_used_bytes",
        "CPU used memory (RAM), in bytes",
        value=cpu.memory_used_bytes,
    )


def cpu_utilization(old: object, new: object) -> float:
    """Busy share of the CPUs between two ``psutil.cpu_times()`` samples (0.0 to 1.0).

    Triton's formula (core ``metrics.cc``): busy = user + nice + system + irq + softirq +
    steal, idle = idle + iowait; counters that went backwards count as 0.
    """

    def delta(field: str) -> float:
        return max(0.0, getattr(new, field, 0.0) - getattr(old, field, 0.0))

    busy = sum(delta(f) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
    idle = delta("idle") + delta("iowait")
    return busy / (busy + idle) if busy + idle > 0 else 0.0


def memory_bytes() -> tuple[int, int]:
    """The machine's total and used memory in bytes (``CpuSample``'s two fields)."""
    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.total - vm.available)


def process_memory(supervisor_pid: int) -> tuple[ProcessMemory, ...]:
    """Resident memory of the supervisor and every process it started.

    Roles and instances come from the process titles the supervisor sets
    (``triton-mp: worker add_sub_0_0``); multiprocessing's resource tracker is
    ``resource_tracker``, any other child ``other`` with its pid as instance. Processes that
    exit meanwhile are skipped. Children are listed in pid order, and two of one role and
    name (the versions of one model, or two instances 2.51 names alike) are told apart by
    ``common.labels.unique_labels``: ``add_sub_0_0`` and ``add_sub_0_0#2``.
    """
    try:
        supervisor = psutil.Process(supervisor_pid)
        head = ProcessMemory("supervisor", "", supervisor.memory_info().rss)
        children = sorted(supervisor.children(), key=lambda c: c.pid)
    except psutil.Error:
        return ()
    rows: list[ProcessMemory] = []
    for child in children:
        try:
            cmdline = child.cmdline()
            rss = child.memory_info().rss
        except psutil.Error:
            continue
        title = cmdline[0] if cmdline else ""
        if title.startswith("triton-mp: "):
            role, _, instance = title.removeprefix("triton-mp: ").partition(" ")
            rows.append(ProcessMemory(role, instance.strip(), rss))
        elif any("resource_tracker" in arg for arg in cmdline):
            rows.append(ProcessMemory("resource_tracker", "", rss))
        else:
            rows.append(ProcessMemory("other", str(child.pid), rss))
    return (head, *_labelled(rows))


def _labelled(rows: list[ProcessMemory]) -> list[ProcessMemory]:
    """``rows`` in order, each ``instance`` unique within its role (``unique_labels``)."""
    by_role: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_role.setdefault(row.role, []).append(i)
    out = list(rows)
    for at in by_role.values():
        for i, label in zip(at, unique_labels(rows[i].instance for i in at), strict=True):
            out[i] = out[i]._replace(instance=label)
    return out
