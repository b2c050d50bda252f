"""The GPUs this server may use: discovery through NVML, as CUDA and Triton number them.

Imported by the supervisor (once, at start: which GPUs instance groups may name), frontend 0
(the ``nv_gpu_*`` metrics, sampled by UUID) and ``triton-mp analyze`` (GPU memory). It never
imports CUDA itself: NVML (``nvidia-ml-py``, the ``gpu`` extra) reads the driver, so a
supervisor that only plans GPU instances never creates a CUDA context.

Numbering, as Triton sees it: Triton asks the CUDA runtime (``cudaGetDeviceCount``), which
honours ``CUDA_VISIBLE_DEVICES``; a config's ``gpus: [0, 1]`` are those CUDA ordinals, the
positions in the visible list. ``visible_order`` reproduces CUDA's parsing of that variable:

- unset: every device, in NVML (PCI bus) order;
- set but empty, or a first entry that is invalid (``-1``): no device;
- comma-separated entries, each a device index or a ``GPU-<uuid>`` (a unique prefix is
  enough, as CUDA allows); the list ends at the first entry that is invalid, out of range,
  ambiguous or repeated, as in CUDA. MIG devices (``MIG-...``) end it too: triton-mp pins
  whole GPUs only.

Triton then keeps the GPUs whose compute capability is at least
``--min-supported-compute-capability`` (core ``GetSupportedGPUs``: ``major + minor / 10``,
with a 0.01 tolerance); the others keep their ordinal but cannot be named by a config.

NOTE: CUDA numbers devices fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; NVML
numbers them by PCI bus. On a machine whose GPUs differ, a bare ordinal may thus name
another device here than in a CUDA program. Instances are pinned by UUID
(``CUDA_VISIBLE_DEVICES=<uuid>`` per worker), so each lands on the GPU this module named.

Test-only: ``TRITON_MP_TEST_FAKE_GPUS`` (``FAKE_GPUS_ENV``) holds a JSON list of fake devices
that replaces NVML (``FakeNvml``), so instance expansion, per-worker pinning and the GPU
metrics are tested on machines without GPUs. It makes no GPU appear to CUDA: a backend that
needs CUDA (PyTorch, TensorRT, onnxruntime's CUDA provider) still fails to load on a fake
GPU, and the server logs a warning whenever the variable is read.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

__all__ = [
    "FAKE_GPUS_ENV",
    "MIN_COMPUTE_CAPABILITY",
    "Devices",
    "FakeNvml",
    "Gpu",
    "GpuSample",
    "Nvml",
    "NvmlUnavailable",
    "PhysicalGpu",
    "discover",
    "nvml_from_env",
    "supports",
    "visible_order",
    "worker_env",
]

log = logging.getLogger(__name__)

FAKE_GPUS_ENV = "TRITON_MP_TEST_FAKE_GPUS"
"""Test-only: JSON list of fake devices used instead of NVML (see the module docstring)."""

MIN_COMPUTE_CAPABILITY = 6.0
"""Triton's TRITON_MIN_COMPUTE_CAPABILITY, the default of ``--min-supported-compute-capability``."""


class NvmlUnavailable(Exception):
    """NVML cannot be used here (no ``nvidia-ml-py``, no driver): a CPU-only host."""


@dataclass(frozen=True)
class PhysicalGpu:
    """One device as NVML lists it (index = NVML's, PCI bus order)."""

    index: int
    uuid: str
    """``GPU-xxxxxxxx-xxxx-...``: NVML's and DCGM's form, Triton's ``gpu_uuid`` label."""
    name: str
    compute_capability: tuple[int, int]
    memory_total_bytes: int


@dataclass(frozen=True)
class GpuSample:
    """One reading of a device, in the units of Triton's ``nv_gpu_*`` metrics.

    ``utilization`` is in [0, 1] (NVML's percent / 100); power in watts (NVML's milliwatts /
    1000); ``energy_mj`` is NVML's total since the driver loaded, in millijoules (Triton's
    ``nv_energy_consumption`` counts the joules since the server started)."""

    utilization: float
    memory_total_bytes: int
    memory_used_bytes: int
    power_usage_w: float
    power_limit_w: float
    energy_mj: int


class Nvml(Protocol):
    """What triton-mp reads from NVML (the real one, or ``FakeNvml`` in tests)."""

    def devices(self) -> list[PhysicalGpu]:
        """Every device, in NVML index order."""
        ...

    def sample(self, uuid: str) -> GpuSample:
        """A reading of the device with ``uuid``.

        Raises:
            NvmlUnavailable: the device or a field cannot be read.
        """
        ...


class Gpu(msgspec.Struct, frozen=True, array_like=True):
    """One GPU this server sees, numbered as Triton numbers it."""

    cuda_id: int
    """The CUDA ordinal: position in the visible list; what a config's ``gpus`` name."""
    uuid: str
    name: str
    compute_capability: tuple[int, int]
    memory_total_bytes: int

    @property
    def capability(self) -> float:
        """``major + minor / 10``, as Triton compares it."""
        return self.compute_capability[0] + self.compute_capability[1] / 10.0


class Devices(msgspec.Struct, frozen=True, array_like=True):
    """The GPUs of this server, discovered once at start (a runtime fact, not a flag)."""

    gpus: tuple[Gpu, ...] = ()
    """Every visible GPU, by CUDA ordinal."""
    min_compute_capability: float = MIN_COMPUTE_CAPABILITY
    fake: bool = False
    """Read from ``FAKE_GPUS_ENV`` (tests), not from NVML."""

    @property
    def supported_ids(self) -> tuple[int, ...]:
        """The CUDA ordinals a config may name (compute capability high enough)."""
        return tuple(g.cuda_id for g in self.gpus if supports(g, self.min_compute_capability))

    def uuid(self, cuda_id: int) -> str:
        """The UUID of ordinal ``cuda_id`` (KeyError when there is none)."""
        for g in self.gpus:
            if g.cuda_id == cuda_id:
                return g.uuid
        raise KeyError(cuda_id)


def worker_env(kind: str, gpu_id: int, devices: Devices) -> dict[str, str]:
    """The environment a worker process starts with, beyond the server's own.

    A ``KIND_GPU`` instance sees only its device: ``CUDA_VISIBLE_DEVICES`` is that GPU's
    UUID, so its backend always uses ``cuda:0`` and cannot touch another instance's GPU.
    ``KIND_CPU`` and ``KIND_MODEL`` instances see what the server sees, as in Triton, where
    every instance shares the server's process (a ``KIND_MODEL`` model places itself).

    Raises:
        KeyError: ``gpu_id`` is no GPU of ``devices`` (the loader refuses such configs).
    """
    if kind != "KIND_GPU":
        return {}
    return {"CUDA_VISIBLE_DEVICES": devices.uuid(gpu_id)}


def supports(gpu: Gpu, min_compute_capability: float) -> bool:
    """Core ``CheckGPUCompatibility``: capability above the minimum, or within 0.01 of it."""
    cc = gpu.capability
    return cc > min_compute_capability or abs(cc - min_compute_capability) < 0.01


def visible_order(value: str | None, devices: Sequence[PhysicalGpu]) -> list[PhysicalGpu]:
    """The devices ``CUDA_VISIBLE_DEVICES=value`` shows, in CUDA ordinal order.

    Args:
        value: the variable (None: unset).
        devices: NVML's devices, by index.
    """
    if value is None:
        return list(devices)
    out: list[PhysicalGpu] = []
    for raw in value.split(","):
        entry = raw.strip()
        found = _match(entry, devices)
        if found is None or found in out:
            break
        out.append(found)
    return out


def _match(entry: str, devices: Sequence[PhysicalGpu]) -> PhysicalGpu | None:
    """The one device an entry names: an index, or a unique ``GPU-`` UUID prefix."""
    if entry.isdigit():
        index = int(entry)
        return devices[index] if index < len(devices) else None
    if not entry.startswith("GPU-") or len(entry) <= len("GPU-"):
        return None
    matches = [d for d in devices if d.uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None


def discover(
    min_compute_capability: float = MIN_COMPUTE_CAPABILITY,
    *,
    env: Mapping[str, str] | None = None,
    nvml: Nvml | None = None,
) -> Devices:
    """The GPUs of this server: NVML's devices, as ``CUDA_VISIBLE_DEVICES`` shows them.

    A host without NVML (no driver, no ``nvidia-ml-py``) has no GPU; that is not an error.

    Args:
        min_compute_capability: ``--min-supported-compute-capability``.
        env: the environment to read (default ``os.environ``).
        nvml: the NVML to read (default: ``nvml_from_env(env)``).
    """
    env = os.environ if env is None else env
    fake = FAKE_GPUS_ENV in env
    try:
        source = nvml if nvml is not None else nvml_from_env(env)
        physical = source.devices()
    except NvmlUnavailable as e:
        log.info("no GPU found (%s): instances run on CPU", e)
        return Devices((), min_compute_capability, fake)
    shown = visible_order(env.get("CUDA_VISIBLE_DEVICES"), physical)
    gpus = tuple(
        Gpu(i, d.uuid, d.name, d.compute_capability, d.memory_total_bytes)
        for i, d in enumerate(shown)
    )
    devices = Devices(gpus, min_compute_capability, fake)
    for g in gpus:
        ok = supports(g, min_compute_capability)
        log.info(
            "GPU %d: %s (%s), compute capability %d.%d, %d MiB%s",
            g.cuda_id,
            g.name,
            g.uuid,
            *g.compute_capability,
            g.memory_total_bytes >> 20,
            "" if ok else f": below the minimum {min_compute_capability}, not used",
        )
    return devices


def nvml_from_env(env: Mapping[str, str] | None = None) -> Nvml:
    """``FakeNvml`` when ``FAKE_GPUS_ENV`` is set (with a warning), else the real NVML.

    Raises:
        NvmlUnavailable: no fake devices and NVML cannot start.
    """
    env = os.environ if env is None else env
    text = env.get(FAKE_GPUS_ENV)
    if text is not None:
        log.warning(
            "%s is set: using FAKE GPUs (a test setting; CUDA sees none of them)", FAKE_GPUS_ENV
        )
        return FakeNvml.from_json(text)
    return RealNvml()


class FakeNvml:
    """Test-only NVML over fixed devices (``FAKE_GPUS_ENV``).

    Each device is a JSON object: ``uuid`` (required), ``name``, ``compute_capability``
    (``"9.0"``), ``memory_total_bytes``, and the readings ``utilization`` (0..1),
    ``memory_used_bytes``, ``power_usage_w``, ``power_limit_w``, ``energy_mj``.
    """

    def __init__(self, entries: Sequence[Mapping[str, Any]]) -> None:
        self._entries = list(entries)

    @classmethod
    def from_json(cls, text: str) -> FakeNvml:
        """Parse ``FAKE_GPUS_ENV``.

        Raises:
            NvmlUnavailable: not a JSON list of objects with a ``uuid``.
        """
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as e:
            raise NvmlUnavailable(f"{FAKE_GPUS_ENV} is not JSON: {e}") from None
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("uuid"), str) for e in entries
        ):
            raise NvmlUnavailable(f"{FAKE_GPUS_ENV} must be a list of objects with a 'uuid'")
        return cls(entries)

    def devices(self) -> list[PhysicalGpu]:
        """The fake devices, by index."""
        out = []
        for i, e in enumerate(self._entries):
            major, _, minor = str(e.get("compute_capability", "9.0")).partition(".")
            out.append(
                PhysicalGpu(
                    i,
                    e["uuid"],
                    str(e.get("name", "Fake GPU")),
                    (int(major), int(minor or 0)),
                    int(e.get("memory_total_bytes", 1 << 34)),
                )
            )
        return out

    def sample(self, uuid: str) -> GpuSample:
        """The fixed readings of the device with ``uuid``.

        Raises:
            NvmlUnavailable: no such device.
        """
        for e in self._entries:
            if e["uuid"] == uuid:
                return GpuSample(
                    float(e.get("utilization", 0.0)),
                    int(e.get("memory_total_bytes", 1 << 34)),
                    int(e.get("memory_used_bytes", 0)),
                    float(e.get("power_usage_w", 0.0)),
                    float(e.get("power_limit_w", 0.0)),
                    int(e.get("energy_mj", 0)),
                )
        raise NvmlUnavailable(f"no fake GPU {uuid}")


class RealNvml:
    """NVML through ``nvidia-ml-py`` (``pynvml``), initialised once per process.

    Raises (from the constructor):
        NvmlUnavailable: the package is missing or the driver cannot be reached.
    """

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise NvmlUnavailable("nvidia-ml-py is not installed") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML: {e}") from None
        self._nvml = pynvml

    def devices(self) -> list[PhysicalGpu]:
        """Every device NVML lists.

        Raises:
            NvmlUnavailable: a device cannot be read.
        """
        nv = self._nvml
        out = []
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                out.append(
                    PhysicalGpu(
                        i,
                        _text(nv.nvmlDeviceGetUUID(h)),
                        _text(nv.nvmlDeviceGetName(h)),
                        tuple(nv.nvmlDeviceGetCudaComputeCapability(h)),
                        int(nv.nvmlDeviceGetMemoryInfo(h).total),
                    )
                )
        except nv.NVMLError as e:
            raise NvmlUnavailable(f"NVML: {e}") from None
        return out

    def sample(self, uuid: str) -> GpuSample:
        """Utilisation, memory, power and energy of one device.

        Raises:
            NvmlUnavailable: the device or a field cannot be read.
        """
        nv = self._nvml
        try:
            h = nv.nvmlDeviceGetHandleByUUID(uuid)
            memory = nv.nvmlDeviceGetMemoryInfo(h)
            return GpuSample(
                nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
                int(memory.total),
                int(memory.used),
                nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
                int(nv.nvmlDeviceGetTotalEnergyConsumption(h)),
            )
        except nv.NVMLError as e:
            raise NvmlUnavailable(f"NVML: {e}") from None


def _text(value: str | bytes) -> str:
    """NVML strings: ``str`` in current nvidia-ml-py, ``bytes`` in old releases."""
    return value.decode() if isinstance(value, bytes) else value
