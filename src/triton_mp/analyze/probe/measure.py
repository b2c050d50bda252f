"""Measure one point: the load generator's figures plus what the server spent on them.

Around each load run it reads the model's ModelStatistics and a ``procs.snapshot`` of the
server's process tree, before and after, and derives:

- the server-side breakdown: queue and compute phases per request (statistics deltas);
- server CPU per inference: every process's ``utime + stime`` delta summed (frontend,
  scheduler, workers, supervisor), divided by the ``inference_count`` delta, and the same
  split by role;
- resident memory of each of the model's instance processes and of every process of the
  server, read when the load stops (a remote server's from its ``/metrics``);
- GPU memory and utilisation per device through NVML (``common.process.gpus``); none on a host
  without GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from triton_mp.analyze.probe import procs
from triton_mp.analyze.probe.client import ServerClient, ServerError, fetch_metrics
from triton_mp.analyze.probe.loadgen import LoadError, LoadGenerator
from triton_mp.analyze.sweep.results import GpuSample, Measurement, ServerBreakdown
from triton_mp.common.process import gpus


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """The server under analysis.

    Attributes:
        http_url: its HTTP/REST endpoint. metrics_url: ``host:port`` of ``/metrics``.
        root_pid: its top process (triton-mp's supervisor) when it runs on this machine
            and can be seen; None otherwise (memory then comes from ``/metrics``, and CPU
            per inference is not measured).
    """

    http_url: str
    metrics_url: str | None = None
    root_pid: int | None = None


def breakdown(before: dict[str, Any], after: dict[str, Any]) -> ServerBreakdown:
    """ModelStatistics deltas as per-request means (``ServerClient.statistics`` dicts)."""

    def delta(name: str, field: str) -> int:
        return int(after.get(name, {}).get(field, 0)) - int(before.get(name, {}).get(field, 0))

    requests = delta("success", "count")

    def mean_us(name: str) -> float:
        count = delta(name, "count")
        return delta(name, "ns") / count / 1000 if count > 0 else 0.0

    return ServerBreakdown(
        requests=requests,
        inferences=int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)),
        executions=int(after.get("execution_count", 0)) - int(before.get("execution_count", 0)),
        queue_us=mean_us("queue"),
        compute_input_us=mean_us("compute_input"),
        compute_infer_us=mean_us("compute_infer"),
        compute_output_us=mean_us("compute_output"),
    )


class GpuReader:
    """NVML readings of this machine's GPUs (``common.process.gpus``); nothing where there are
    none."""

    def __init__(self) -> None:
        try:
            self._nvml: gpus.Nvml | None = gpus.nvml_from_env()
            self._devices = gpus.discover(nvml=self._nvml).gpus
        except gpus.NvmlUnavailable:
            self._nvml, self._devices = None, ()

    def samples(self) -> tuple[GpuSample, ...]:
        """One sample per visible GPU (devices that cannot be read are left out)."""
        out = []
        for g in self._devices:
            try:
                s = self._nvml.sample(g.uuid) if self._nvml else None
            except gpus.NvmlUnavailable:
                continue
            if s is not None:
                out.append(
                    GpuSample(
                        index=g.cuda_id,
                        name=g.name,
                        used_bytes=s.memory_used_bytes,
                        utilization_percent=round(s.utilization * 100),
                    )
                )
        return tuple(out)


def failed(error: str, generator: str) -> Measurement:
    """A point that could not be measured."""
    return Measurement(
        throughput_per_s=0.0,
        p50_us=0.0,
        p95_us=0.0,
        p99_us=0.0,
        load_generator=generator,
        error=error,
    )


def measure(
    target: Target,
    load: LoadGenerator,
    model: str,
    concurrency: int,
    group_names: Sequence[str],
    gpu: GpuReader | None = None,
) -> Measurement:
    """Run ``load`` at ``concurrency`` on ``model`` and measure the server around it.

    Args:
        group_names: the loaded config's ``instance_group`` names (whose workers are the
            model's instances).
    """
    client = ServerClient(target.http_url)
    try:
        stats0 = client.statistics(model)
        tree0 = procs.snapshot(target.root_pid) if target.root_pid else []
        figures = load.run(model, concurrency)
        tree1 = procs.snapshot(target.root_pid) if target.root_pid else []
        stats1 = client.statistics(model)
    except (LoadError, ServerError) as e:
        return failed(str(e), load.name)
    server = breakdown(stats0, stats1)
    cpu_per_inference = None
    by_role: dict[str, float] = {}
    if tree1 and server.inferences > 0:
        by_role = {
            role: ms / server.inferences for role, ms in procs.cpu_ms_by_role(tree0, tree1).items()
        }
        cpu_per_inference = sum(by_role.values())
    if tree1:
        processes = procs.memory(tree1)
    else:
        processes = procs.remote_memory(fetch_metrics(target.metrics_url or ""))
    return Measurement(
        throughput_per_s=figures.throughput_per_s,
        p50_us=figures.p50_us,
        p95_us=figures.p95_us,
        p99_us=figures.p99_us,
        server=server,
        cpu_ms_per_inference=cpu_per_inference,
        cpu_ms_by_role=by_role,
        instances=procs.instances_of(processes, group_names),
        processes=processes,
        gpus=gpu.samples() if gpu else (),
        load_generator=load.name,
    )
