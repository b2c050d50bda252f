"""CUDA IPC handles: device memory shared between processes (the GPU half of ``ipc``).

Imported by workers (and the GPU tests); importing it loads no CUDA library: NVIDIA's
``cuda-bindings`` (``cuda.bindings.runtime``, the ``gpu`` extra, the binding
``tritonclient.utils.cuda_shared_memory`` uses) is imported on first use. A process that
receives a ``cudaIpcMemHandle_t`` (64 bytes: a client's CUDA shared-memory region, or another
worker's output in a GPU ensemble) opens it once with ``cudaIpcOpenMemHandle`` on its own
device and keeps the mapping (``HandleCache``): CUDA maps a handle only once per process, and
opening costs far more than a copy of a small tensor. Offsets within the allocation travel
beside the handle (a handle names the whole allocation, as in Triton's CUDA shared memory).

Every worker of a KIND_GPU instance sees only its own GPU (``common.process.gpus.worker_env``), so
"its device" is always device 0 of the process; a handle made on another GPU opens there with
peer access (``cudaIpcMemLazyEnablePeerAccess``) where the hardware allows, else fails.
"""

from __future__ import annotations

import threading
from typing import Any

from triton_mp.common.errors import ErrorCode, TritonMPError

__all__ = ["CUDA_IPC_HANDLE_BYTES", "HandleCache", "available", "get_handle", "open_handle"]

CUDA_IPC_HANDLE_BYTES = 64
"""``sizeof(cudaIpcMemHandle_t)``."""


def _runtime() -> Any:
    """``cuda.bindings.runtime``.

    Raises:
        TritonMPError (UNAVAILABLE): cuda-bindings is not installed here.
    """
    try:
        from cuda.bindings import runtime
    except ImportError:
        raise TritonMPError(
            "CUDA IPC needs NVIDIA's cuda-bindings (pip install 'triton-mp[gpu]')",
            ErrorCode.UNAVAILABLE,
        ) from None
    return runtime


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda-bindings ``(err, *values)`` tuple.

    Raises:
        TritonMPError (INVALID_ARG): the call failed, with CUDA's name for the error.
    """
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise TritonMPError(f"{what}: {getattr(err, 'name', err)}", ErrorCode.INVALID_ARG)
    return values[0] if len(values) == 1 else tuple(values)


def available() -> bool:
    """Whether this process can use CUDA IPC (cuda-bindings present and a device visible)."""
    try:
        rt = _runtime()
        return int(_check(rt.cudaGetDeviceCount(), "cudaGetDeviceCount")) > 0
    except TritonMPError:
        return False


def get_handle(device_ptr: int) -> bytes:
    """The IPC handle of the allocation at ``device_ptr`` (``cudaIpcGetMemHandle``).

    Raises:
        TritonMPError: no CUDA here, or the pointer is not a device allocation.
    """
    rt = _runtime()
    handle = _check(rt.cudaIpcGetMemHandle(device_ptr), "failed to get CUDA IPC handle")
    return bytes(handle.reserved)


def open_handle(raw_handle: bytes, device: int = 0) -> int:
    """Map another process's allocation into this one; returns its device pointer.

    Raises:
        TritonMPError: a handle that is not 64 bytes, no CUDA here, or CUDA refused it
            (another device without peer access, a freed allocation: Triton's "failed to
            open CUDA IPC handle").
    """
    if len(raw_handle) != CUDA_IPC_HANDLE_BYTES:
        raise TritonMPError(
            f"a CUDA IPC handle is {CUDA_IPC_HANDLE_BYTES} bytes, got {len(raw_handle)}",
            ErrorCode.INVALID_ARG,
        )
    rt = _runtime()
    _check(rt.cudaSetDevice(device), "failed to select the CUDA device")
    handle = rt.cudaIpcMemHandle_t()
    handle.reserved = raw_handle
    ptr = _check(
        rt.cudaIpcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess),
        "failed to open CUDA IPC handle",
    )
    return int(ptr)


def close_handle(device_ptr: int) -> None:
    """Unmap what ``open_handle`` mapped (``cudaIpcCloseMemHandle``).

    Raises:
        TritonMPError: CUDA refused (Triton's "failed to close CUDA IPC handle").
    """
    _check(_runtime().cudaIpcCloseMemHandle(device_ptr), "failed to close CUDA IPC handle")


class HandleCache:
    """The handles this process has opened, by handle bytes: each is opened once and kept
    until ``forget`` (its region unregistered, its producer gone) or ``close``."""

    def __init__(self, device: int = 0) -> None:
        self._device = device
        self._open: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def pointer(self, raw_handle: bytes, offset: int = 0) -> int:
        """The device address ``offset`` bytes into the allocation ``raw_handle`` names.

        Raises:
            TritonMPError: as ``open_handle``.
        """
        with self._lock:
            base = self._open.get(raw_handle)
            if base is None:
                base = open_handle(raw_handle, self._device)
                self._open[raw_handle] = base
        return base + offset

    def forget(self, raw_handle: bytes) -> None:
        """Unmap one handle (no error if it was never opened)."""
        with self._lock:
            base = self._open.pop(raw_handle, None)
        if base is not None:
            close_handle(base)

    def close(self) -> None:
        """Unmap every handle."""
        with self._lock:
            bases, self._open = list(self._open.values()), {}
        for base in bases:
            close_handle(base)
