"""Triton's system and CUDA shared-memory calls of one frontend, answered server-wide.

Imported by ``frontend.api`` (the transport-free core both transports call). Each call checks
and applies the change on this frontend's registries (``frontend.shm.system``,
``frontend.shm.cuda``), then awaits every other frontend's (``frontend.shm.peers``), so that
once it returns every connection sees the change, as in Triton's one process.

Unregister follows Triton 2.51's in-use rule across frontends: a region stays when a request
accepted by *any* frontend still uses it. This frontend removes the regions it does not use
and asks its peers to do the same; the regions a peer kept are taken back here and restored
on every peer before the call answers Triton's INTERNAL error (``unregister_refusal``). While
the call waits for its peers, the regions it removes are already gone here, so a request
naming one fails NOT_FOUND even when a peer's use then keeps it.

Frontends that register one name at the same moment: Triton, serializing the calls, lets
one succeed and answers the others ALREADY_EXISTS. Here the register accepted first wins
(``Region.registered_ns``, CLOCK_MONOTONIC, which every process shares): every frontend that
holds the name under a later register gives it up to the earlier one (``adopt``:
``SystemShmRegistry.gives_way``), and one that holds it under the earlier one keeps it and
answers ``taken``. So every frontend, in whatever order the registers reach it, picks the
same winner, whose call succeeds; each loser takes its registration back everywhere (by id:
where the winner's holds the name it stays) and answers ALREADY_EXISTS. A register whose call
returned is on every frontend, so a later one is refused where it is made and never meets it
elsewhere. Only a request already using the later registration on some frontend keeps it
there (that frontend answers the earlier one ``taken``): then every call may fail, never two
succeed.
"""

from __future__ import annotations

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.shm.cuda import CudaRegion, CudaShmRegistry, already_in_manager
from triton_mp.frontend.shm.peers import ShmPeers, shared, shared_cuda
from triton_mp.frontend.shm.system import (
    DISABLED_MESSAGE,
    Region,
    SystemShmRegistry,
    unregister_refusal,
)
from triton_mp.ipc.protocol.shm_messages import ShmRegistered, ShmUnregistered


class ClientShmApi:
    """Triton's system (and CUDA) shared memory calls of one frontend.

    Args:
        peers: this frontend's regions (``registry``, its ``cuda`` beside them) and the other
            frontends, which every change awaits (``frontend.shm.peers``).
    """

    def __init__(self, peers: ShmPeers) -> None:
        self.registry: SystemShmRegistry = peers.registry
        self._peers = peers
        self._fid = peers.frontend_id

    async def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Triton SystemSharedMemoryRegister: name a window of a client's POSIX shm object;
        returns once every live frontend has it.

        Raises:
            TritonMPError: as ``SystemShmRegistry.register``; ALREADY_EXISTS also when another
                frontend registered the name at the same moment (module docstring).
        """
        r = self.registry.register(name, key, offset, byte_size)
        out = await self._peers.change(
            lambda op: ShmRegistered(frontend_id=self._fid, regions=(shared(r),), op=op)
        )
        # NOTE: a register given up here (yields) lost even if the winner's answer did not
        # come in time.
        if out.taken or not self.registry.holds(r):
            self.registry.take_back([name], [r.region_id])
            await self._take_back((name,), (), r.region_id)
            raise already_in_manager(name)

    def status(self, name: str) -> list[Region]:
        """Triton SystemSharedMemoryStatus: every region, or the one named.

        Raises:
            TritonMPError: as ``SystemShmRegistry.status``.
        """
        return self.registry.status(name)

    async def unregister(self, name: str) -> None:
        """Triton SystemSharedMemoryUnregister: one region, or all when ``name`` is empty;
        returns once every live frontend has dropped them.

        Raises:
            TritonMPError: UNSUPPORTED when client shared memory is disabled; INTERNAL when a
                request accepted by any frontend uses a region named (``unregister_refusal``:
                the others named are unregistered everywhere first).
        """
        removed, kept = self.registry.unregister(name)
        if removed:
            names = tuple(r.name for r in removed)
            out = await self._peers.change(
                lambda op: ShmUnregistered(frontend_id=self._fid, names=names, op=op)
            )
            back = [r for r in removed if r.name in out.in_use]
            if back:
                await self._restore(back)
                kept += [r.name for r in back]
        refusal = unregister_refusal(name, kept)
        if refusal is not None:
            raise refusal

    async def _restore(self, regions: list[Region]) -> None:
        """Take back, here and on every peer, regions an unregister removed that a peer's
        request uses (those not registered again meanwhile)."""
        cuda = self.registry.cuda
        back = [
            r
            for r in regions
            if not self.registry.has(r.name) and (cuda is None or not cuda.has(r.name))
        ]
        self.registry.add(back)
        kept = tuple(shared(r) for r in back)
        await self._peers.change(
            lambda op: ShmRegistered(frontend_id=self._fid, regions=kept, op=op)
        )

    async def _take_back(self, names: tuple[str, ...], cuda: tuple[str, ...], rid: int) -> None:
        """Take a register back on every peer: another frontend registered the name at the
        same moment (``ShmApplied.taken``); in Triton one of the two calls found it taken."""
        await self._peers.change(
            lambda op: ShmUnregistered(
                frontend_id=self._fid, names=names, cuda_names=cuda, op=op, region_ids=(rid,)
            )
        )

    def require_enabled(self) -> None:
        """Raises Triton's UNSUPPORTED answer when client shared memory is disabled."""
        if not self.registry.enabled:
            raise TritonMPError(DISABLED_MESSAGE, ErrorCode.UNSUPPORTED)

    def _cuda_registry(self) -> CudaShmRegistry:
        cuda = self.registry.cuda
        if cuda is None:
            raise TritonMPError(DISABLED_MESSAGE, ErrorCode.UNSUPPORTED)
        return cuda

    async def cuda_register(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        """Triton CudaSharedMemoryRegister (``frontend.shm.cuda``); returns once every live
        frontend has it.

        Raises:
            TritonMPError: as ``CudaShmRegistry.register``; ALREADY_EXISTS also when another
                frontend registered the name at the same moment (module docstring).
        """
        cuda = self._cuda_registry()
        r = cuda.register(name, raw_handle, device_id, byte_size)
        out = await self._peers.change(
            lambda op: ShmRegistered(
                frontend_id=self._fid, regions=(), cuda=(shared_cuda(r),), op=op
            )
        )
        if out.taken or not cuda.holds(r):
            cuda.take_back([name], [r.region_id])
            await self._take_back((), (name,), r.region_id)
            raise already_in_manager(name)

    def cuda_status(self, name: str) -> list[CudaRegion]:
        """Triton CudaSharedMemoryStatus: every CUDA region, or the one named.

        Raises:
            TritonMPError: as ``CudaShmRegistry.status``.
        """
        return self._cuda_registry().status(name, self.registry.has)

    async def cuda_unregister(self, name: str) -> None:
        """Triton CudaSharedMemoryUnregister: one region, or all when ``name`` is empty;
        returns once every live frontend has dropped them.

        Raises:
            TritonMPError: UNSUPPORTED when client shared memory is disabled.
        """
        names = tuple(self._cuda_registry().unregister(name))
        if names:
            await self._peers.change(
                lambda op: ShmUnregistered(frontend_id=self._fid, names=(), cuda_names=names, op=op)
            )
