"""Triton's CUDA shared memory extension: the GPU regions clients register.

Imported by the frontend only (``ClientShmApi`` serves it beside system shared memory). A
client allocates device memory, exports it with ``cudaIpcGetMemHandle`` and registers the
64-byte handle (``raw_handle``), its ``device_id`` and ``byte_size`` under a name
(CudaSharedMemoryRegister); CudaSharedMemoryStatus lists the regions (name, device_id,
byte_size) and CudaSharedMemoryUnregister drops one or all. Messages and codes are Triton's
(server ``shared_memory_manager.cc``, ``grpc_server.cc``, ``http_server.cc``; checked against
the real Triton 2.51 on a CPU host).

The frontend never creates a CUDA context: it checks the handle's size and that
``device_id`` is one of the server's GPUs (``FrontendSpec.gpu_ids``). Where Triton would
fail to open the handle (``cudaIpcOpenMemHandle`` on a device that is not there, which is
every device on a CPU host) the answer is Triton's: INVALID_ARG "failed to register shared
memory region: invalid args". A handle that is well formed but stale is found when a worker
opens it (``ipc.memory.cuda_ipc``), not at registration as in Triton.

NOTE: naming a CUDA region in an inference request is refused (UNSUPPORTED, see
``refuse_in_request``) until the workers read and write device memory in place: the design
is in docs/architecture.md ("GPU tensors"); the worker side that opens a handle is
``ipc.memory.cuda_ipc``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from triton_mp.common.errors import ErrorCode, TritonMPError

__all__ = [
    "CUDA_IPC_HANDLE_BYTES",
    "CudaRegion",
    "CudaShmRegistry",
    "INVALID_ARGS",
    "already_in_manager",
]

CUDA_IPC_HANDLE_BYTES = 64
"""``sizeof(cudaIpcMemHandle_t)``."""

INVALID_ARGS = "failed to register shared memory region: invalid args"
"""Triton's answer when the handle cannot be opened on ``device_id``."""


def already_in_manager(name: str) -> TritonMPError:
    """Triton's ALREADY_EXISTS for a name registered already, of either kind (server
    ``shared_memory_manager.cc``)."""
    return TritonMPError(
        f"shared memory region '{name}' already in manager", ErrorCode.ALREADY_EXISTS
    )


@dataclass(frozen=True, slots=True)
class CudaRegion:
    """One registered CUDA shared-memory region.

    Attributes:
        name: the name clients use in tensor parameters.
        raw_handle: the client's ``cudaIpcMemHandle_t`` (64 bytes).
        device_id: the CUDA ordinal (as the server numbers GPUs) the memory lives on.
        byte_size: length of the region in bytes.
        region_id: the id of the registration (of the frontend that took it).
        registered_ns: as ``system.Region.registered_ns``.
    """

    name: str
    raw_handle: bytes
    device_id: int
    byte_size: int
    region_id: int
    registered_ns: int = 0


class CudaShmRegistry:
    """One frontend's copy of the server's CUDA regions (``frontend.shm.peers`` keeps the
    copies equal).

    Args:
        gpu_ids: the server's GPUs (CUDA ordinals); empty on a CPU host.
        enabled: ``--allow-client-shm`` (every call fails UNSUPPORTED when False).
        taken: whether a name is registered as system shared memory (Triton keeps one
            table of names for both kinds).
        disabled_message: the answer when disabled (the system registry's).
        frontend_id: mixed into ``region_id`` so ids are unique across frontends.
    """

    def __init__(
        self,
        gpu_ids: tuple[int, ...],
        *,
        enabled: bool,
        taken: Callable[[str], bool],
        disabled_message: str,
        frontend_id: int = 0,
    ) -> None:
        self._gpu_ids = frozenset(gpu_ids)
        self._enabled = enabled
        self._taken = taken
        self._disabled = disabled_message
        self._regions: dict[str, CudaRegion] = {}
        self._ids = itertools.count(1)
        self._frontend_id = frontend_id

    def has(self, name: str) -> bool:
        """Whether ``name`` is a registered CUDA region."""
        return name in self._regions

    def holds(self, region: CudaRegion) -> bool:
        """Whether ``region``'s name is still that registration (``adopt`` may have given
        it up)."""
        return self._regions.get(region.name) == region

    def _check_enabled(self) -> None:
        if not self._enabled:
            raise TritonMPError(self._disabled, ErrorCode.UNSUPPORTED)

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> CudaRegion:
        """CudaSharedMemoryRegister.

        Raises:
            TritonMPError: UNSUPPORTED (disabled), ALREADY_EXISTS (the name is taken by
                either kind), INVALID_ARG (a handle that is not 64 bytes, or a device that
                is not one of the server's GPUs: Triton's "invalid args").
        """
        self._check_enabled()
        if name in self._regions or self._taken(name):
            raise already_in_manager(name)
        if len(raw_handle) != CUDA_IPC_HANDLE_BYTES or device_id not in self._gpu_ids:
            raise TritonMPError(INVALID_ARGS, ErrorCode.INVALID_ARG)
        rid = next(self._ids) * 256 + self._frontend_id
        region = CudaRegion(name, bytes(raw_handle), device_id, byte_size, rid, time.monotonic_ns())
        self._regions[name] = region
        return region

    def status(self, name: str, is_system: Callable[[str], bool]) -> list[CudaRegion]:
        """CudaSharedMemoryStatus: every region, or the one named.

        Raises:
            TritonMPError: NOT_FOUND for an unknown name or one registered as system shared
                memory (Triton's two messages).
        """
        if not name:
            return list(self._regions.values())
        region = self._regions.get(name)
        if region is None:
            if is_system(name):
                raise TritonMPError(
                    f"The region named '{name}' is registered as system shared memory, not "
                    "CUDA shared memory",
                    ErrorCode.NOT_FOUND,
                )
            raise TritonMPError(
                f"Unable to find cuda shared memory region: '{name}'", ErrorCode.NOT_FOUND
            )
        return [region]

    def unregister(self, name: str) -> list[str]:
        """CudaSharedMemoryUnregister: one region (an unknown name is no error, as in
        Triton), or all when ``name`` is empty. Returns the names dropped.

        Raises:
            TritonMPError: UNSUPPORTED when client shared memory is disabled.
        """
        self._check_enabled()
        names = list(self._regions) if not name else [n for n in (name,) if n in self._regions]
        for n in names:
            del self._regions[n]
        return names

    def add(self, regions: Iterable[CudaRegion]) -> None:
        """Take registrations as they are (a resend to a restarted frontend)."""
        for r in regions:
            self._regions[r.name] = r

    def adopt(self, regions: Iterable[CudaRegion]) -> list[str]:
        """Add another frontend's registrations (``frontend.shm.peers``), but a name held here
        under another registration (of either kind) stays, unless the other was accepted
        earlier (``SystemShmRegistry.gives_way``; no request uses a CUDA region). Returns
        the names that stayed."""
        taken = []
        for r in regions:
            mine = self._regions.get(r.name)
            held = mine is not None and mine != r
            if held and mine is not None:
                held = (mine.registered_ns, mine.region_id) <= (r.registered_ns, r.region_id)
            if held or self._taken(r.name):
                taken.append(r.name)
            else:
                self._regions[r.name] = r
        return taken

    def take_back(self, names: Iterable[str], region_ids: Iterable[int]) -> None:
        """Forget each name while it is that registration (a register another frontend took
        back: ``adopt`` found its name taken somewhere)."""
        for n, rid in zip(names, region_ids, strict=True):
            r = self._regions.get(n)
            if r is not None and r.region_id == rid:
                del self._regions[n]

    def drop(self, names: Iterable[str]) -> None:
        """Forget regions another frontend unregistered (no request uses a CUDA region:
        ``refuse_in_request``)."""
        for n in names:
            self._regions.pop(n, None)

    def regions(self) -> list[CudaRegion]:
        """Every region."""
        return list(self._regions.values())

    def refuse_in_request(self, name: str, what: str) -> None:
        """An inference tensor names a CUDA region: refused until workers use device memory.

        Raises:
            TritonMPError: UNSUPPORTED naming the tensor and the region.
        """
        if name in self._regions:
            raise TritonMPError(
                f"{what} uses CUDA shared memory region '{name}': triton-mp's workers do not "
                "read or write device memory in place yet",
                ErrorCode.UNSUPPORTED,
            )
