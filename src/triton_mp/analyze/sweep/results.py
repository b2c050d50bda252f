"""What one measured point yields (typed structs the checkpoint and the report store).

Pure data: built by ``measure``, judged by ``pareto`` and ``search``, written by
``checkpoint`` and ``report``. Latencies are in microseconds, memory in bytes, CPU in
milliseconds of CPU time per inference.
"""

from __future__ import annotations

import msgspec

from triton_mp.analyze.sweep.space import Point


class ServerBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """ModelStatistics deltas over the measurement, per successful inference request
    (``inference_stats.{queue,compute_input,compute_infer,compute_output}.ns / count``).

    Attributes:
        requests: ``inference_stats.success.count`` delta.
        inferences: ``inference_count`` delta (batch rows, Triton's count).
        executions: ``execution_count`` delta (batches run).
        queue_us: mean time a request waited in the scheduler's queue.
        compute_input_us / compute_infer_us / compute_output_us: mean compute phases.
    """

    requests: int
    inferences: int
    executions: int
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float

    @property
    def avg_batch(self) -> float:
        """Inferences per execution (the batch size the server formed on average)."""
        return self.inferences / self.executions if self.executions else 0.0


class ProcessMemory(msgspec.Struct, frozen=True, kw_only=True):
    """Resident memory of one server process (``VmRSS`` of ``/proc/<pid>/status``).

    Attributes:
        role: ``supervisor``, ``frontend``, ``scheduler``, ``worker`` or ``other``.
        name: the instance name for a worker (``ocr_cls_0_1``), the frontend's index, ...
        pid: the process id (0 when read from ``/metrics`` of a remote server).
        rss_bytes: resident set size in bytes.
    """

    role: str
    name: str
    pid: int
    rss_bytes: int


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU through NVML at the end of the measurement.

    Attributes:
        index: NVML device index. name: the device name.
        used_bytes: ``nvmlDeviceGetMemoryInfo().used``.
        utilization_percent: ``nvmlDeviceGetUtilizationRates().gpu`` (0-100).
    """

    index: int
    name: str
    used_bytes: int
    utilization_percent: int


class Measurement(msgspec.Struct, frozen=True, kw_only=True):
    """Everything measured at one point.

    Attributes:
        throughput_per_s: inferences per second (the load generator's figure).
        p50_us / p95_us / p99_us: client-side request latency percentiles.
        server: the ModelStatistics breakdown (None when statistics were unavailable).
        cpu_ms_per_inference: server CPU time (user + system, every process of the server's
            tree summed) per inference (None when the server's processes are not visible).
        cpu_ms_by_role: the same split by role (``frontend``, ``scheduler``, ``worker``, ...).
        instances: memory of each of the model's instance worker processes.
        processes: memory of every process of the server (instances included).
        gpus: NVML samples (empty where there is no GPU).
        load_generator: ``perf_analyzer`` or ``triton-mp builtin``.
        error: why the point could not be measured (the other fields are then zero).
    """

    throughput_per_s: float
    p50_us: float
    p95_us: float
    p99_us: float
    server: ServerBreakdown | None = None
    cpu_ms_per_inference: float | None = None
    cpu_ms_by_role: dict[str, float] = {}
    instances: tuple[ProcessMemory, ...] = ()
    processes: tuple[ProcessMemory, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    load_generator: str = ""
    error: str | None = None

    @property
    def instances_rss_bytes(self) -> int:
        """The model's instance processes together."""
        return sum(p.rss_bytes for p in self.instances)

    @property
    def total_rss_bytes(self) -> int:
        """The whole server (every process of its tree)."""
        return sum(p.rss_bytes for p in self.processes)

    @property
    def ok(self) -> bool:
        """Whether the point was measured."""
        return self.error is None


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """A point and what it measured."""

    point: Point
    measurement: Measurement
