"""Triton's system shared memory extension: the regions clients register.

Imported by the frontend only. ``SystemShmRegistry`` holds one frontend's copy of the server's
regions (every frontend knows every region: ``frontend.shm.peers`` applies the other
frontends' changes before their calls return; ``frontend.shm.api`` serves Triton's calls). A
client creates a POSIX shared-memory object (``key``), registers a window of it (``offset``,
``byte_size``) under a ``name``, and then names that region in tensor parameters
(``shared_memory_region``, ``shared_memory_offset``, ``shared_memory_byte_size``) instead of
sending bytes. The frontend only checks names and bounds; the worker that runs the request maps
the client's object itself (copy-on-write for inputs, read-write for outputs), so registered
inputs reach the backend with no host copy and registered outputs are written once, into the
client's memory (see DESIGN.md "Copies").

Every registration gets a server-wide unique ``region_id``; descriptors carry it, so a worker
never confuses a region with a later one registered under the same key.
Messages follow Triton's (server ``shared_memory_manager.cc``, triton.md §1.6).

A region is *in use* from the moment a request naming it (input or output) is accepted until
that request's final answer reaches the frontend (``hold`` / ``release``, counted per
registration). As in Triton 2.51, unregistering a region in use fails (INTERNAL) and keeps it;
unregistering all removes the regions not in use and fails naming the others. The count here
is this frontend's; ``frontend.shm.api`` asks every other frontend for its own (``drop``), so
the rule holds server-wide. A native producer that submits requests naming regions itself
(``frontend.native.known_teach``) watches the registry (``RegionWatch``): it is told before
every registration change, and the requests it sent and still holds count as uses.
"""

from __future__ import annotations

import collections
import itertools
import mmap
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import posix_ipc

from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.shm.cuda import CudaShmRegistry, already_in_manager
from triton_mp.ipc.memory.shm import client_object_refusal

DISABLED_MESSAGE = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)


@dataclass(frozen=True, slots=True)
class Region:
    """One registered system shared-memory region.

    Attributes:
        name: the name clients use in tensor parameters.
        key: the POSIX shared-memory object's name as the client registered it (with or
            without the leading slash; SystemSharedMemoryStatus echoes it so, as Triton's
            shared-memory manager keeps ``shm_key``).
        offset: start of the region within the object, in bytes.
        byte_size: length of the region in bytes.
        region_id: server-wide unique id of this registration.
        registered_ns: CLOCK_MONOTONIC (which every process shares) when its frontend
            accepted the register; of two registers of one name in flight at once, the
            earlier wins everywhere (``gives_way``).
    """

    name: str
    key: str
    offset: int
    byte_size: int
    region_id: int
    registered_ns: int = 0

    @property
    def object_name(self) -> str:
        """``key`` as ``shm_open`` names the object: one leading slash (glibc strips any
        number of them, so ``x`` and ``/x`` are the same object)."""
        return "/" + self.key.lstrip("/")


class RegionWatch(Protocol):
    """A producer that sends requests naming regions without this registry's ``hold``
    (``frontend.native.known_teach.NativeKnown``)."""

    def changing(self) -> None:
        """A registration is about to change (register, unregister, a peer's): once this
        returns, the producer sends nothing it decided from the registrations before."""
        ...

    def uses(self, region_id: int) -> int:
        """Requests the producer sent naming ``region_id`` and not yet released."""
        ...


class SystemShmRegistry:
    """The regions registered with one frontend.

    Args:
        frontend_id: mixed into ``region_id`` so ids are unique across frontends.
        enabled: ``--allow-client-shm``; when False every call fails UNSUPPORTED.
        allowed_prefix: ``--client-shm-prefix``; empty allows any key (see
            ``ipc.memory.shm.client_object_refusal`` for every rule a registration must pass).
        first_id: where this process's registration count starts
            (``FrontendSpec.first_request_id``): a frontend restarted in a dead one's place
            never reuses a ``region_id`` whose mapping a worker may hold.
    """

    def __init__(
        self,
        frontend_id: int,
        enabled: bool = True,
        allowed_prefix: str = "",
        first_id: int = 1,
    ) -> None:
        self._allowed_prefix = allowed_prefix
        # NOTE: the supervisor is the parent, and its pid names this server's objects.
        self._server_id = str(os.getppid())
        self._regions: dict[str, Region] = {}
        self._uses: collections.Counter[int] = collections.Counter()
        """Requests accepted and not yet answered, per ``region_id`` they name."""
        self._ids = itertools.count(first_id)
        self._frontend_id = frontend_id
        self.enabled = enabled
        self.cuda: CudaShmRegistry | None = None
        """The CUDA regions of this frontend (their names are refused in tensors)."""
        self.generation = 0
        """Counts the changes to the registered regions: a request validated against its
        regions is valid again while this stays (``frontend.dispatch.known_requests``)."""
        self.watch: RegionWatch | None = None
        """Told before every change; its uses count in ``in_use`` (module docstring)."""

    def _changing(self) -> None:
        if self.watch is not None:
            self.watch.changing()

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise TritonMPError(DISABLED_MESSAGE, ErrorCode.UNSUPPORTED)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        """Register ``[offset, offset + byte_size)`` of the object ``key`` as ``name``.

        Raises:
            TritonMPError: ALREADY_EXISTS for a name in use; INVALID_ARG for a key Triton
                refuses (``check_shm_key``), a key that does not exist, an object the
                operator does not allow (another user's, triton-mp's own, outside
                ``--client-shm-prefix``), or a window beyond the object's size;
                UNSUPPORTED when client shared memory is disabled.
        """
        self._check_enabled()
        # NOTE: no check of an empty name: Triton's gRPC register has none (HTTP's route
        # refuses one in Triton's words).
        check_shm_key(name, key)
        if name in self._regions or (self.cuda is not None and self.cuda.has(name)):
            raise already_in_manager(name)
        try:
            obj = posix_ipc.SharedMemory("/" + key.lstrip("/"), read_only=True)
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError, ValueError):
            # NOTE: server shared_memory_manager.cc OpenSharedMemoryRegion: INTERNAL, the key.
            raise TritonMPError(
                f"Unable to open shared memory region: '{key}'", ErrorCode.INTERNAL
            ) from None
        try:
            st = os.fstat(obj.fd)
        finally:
            obj.close_fd()
        size = st.st_size
        refusal = client_object_refusal(key, st.st_uid, self._server_id, self._allowed_prefix)
        if refusal is not None:
            raise InvalidRequest(
                f"Unable to register shared memory region: '{name}' with key '{key}': {refusal}"
            )
        if offset < 0 or offset + byte_size > size:
            # NOTE: CheckSharedMemoryRegionSize's words.
            raise InvalidRequest(f"failed to register shared memory region '{name}': invalid args")
        if byte_size <= 0 or offset % mmap.PAGESIZE:
            # NOTE: then Triton's mmap of the window fails (EINVAL: an empty length, or an
            # offset that is not a multiple of the page size); MapSharedMemory's words.
            raise InvalidRequest(
                f"failed to register shared memory region '{name}': unable to process "
                "address spaceInvalid argument"
            )
        rid = next(self._ids) * 256 + self._frontend_id
        region = Region(name, key, offset, byte_size, rid, time.monotonic_ns())
        self._changing()
        self._regions[name] = region
        self.generation += 1
        return region

    def add(self, regions: Iterable[Region]) -> None:
        """Take registrations as they are (ones an unregister kept, a resend to a restarted
        frontend)."""
        self._changing()
        for r in regions:
            self._regions[r.name] = r
        self.generation += 1

    def adopt(self, regions: Iterable[Region]) -> list[str]:
        """Add another frontend's registrations (``frontend.shm.peers``), but a name held here
        under another registration (of either kind) stays, unless it ``gives_way``.
        Returns the names that stayed."""
        self._changing()
        taken = []
        for r in regions:
            mine = self._regions.get(r.name)
            held = mine is not None and mine != r and not self.gives_way(mine, r)
            if held or (self.cuda is not None and self.cuda.has(r.name)):
                taken.append(r.name)
            else:
                self._regions[r.name] = r
        self.generation += 1
        return taken

    def gives_way(self, mine: Region, other: Region) -> bool:
        """Whether the registration of ``mine`` held here gives its name up to another
        frontend's register of the same name, ``other``: ``other`` was accepted earlier
        (``registered_ns``, then ``region_id``) and no request of this frontend uses
        ``mine`` yet.

        Two registers of one name reach a frontend only while both calls are in flight: a
        register whose call returned is on every frontend, so a later one is refused where
        it is made. Every frontend then picks the earlier one, the one that kept its name
        answers ``taken`` to the other, and exactly one call succeeds, as in Triton's one
        process, however many frontends there are and in whatever order they hear of the
        two (the lower ``region_id`` alone could not be used so: a frontend restarted in a
        dead one's place counts its ids again from its first one).
        """
        return (other.registered_ns, other.region_id) < (
            mine.registered_ns,
            mine.region_id,
        ) and not self.in_use(mine.name)

    def take_back(self, names: Iterable[str], region_ids: Iterable[int]) -> None:
        """Forget each name while it is that registration, used or not (a register its
        frontend took back because ``adopt`` found the name taken somewhere: in Triton it
        never happened; requests in flight keep working, as after any unregister)."""
        self._changing()
        for n, rid in zip(names, region_ids, strict=True):
            r = self._regions.get(n)
            if r is not None and r.region_id == rid:
                del self._regions[n]
        self.generation += 1

    def hold(self, region_ids: Iterable[int]) -> None:
        """A request naming these regions (one id per tensor) was accepted."""
        self._uses.update(region_ids)

    def release(self, region_ids: Iterable[int]) -> None:
        """The request that ``hold`` counted got its final answer."""
        uses = self._uses
        for rid in region_ids:
            left = uses[rid] - 1
            if left > 0:
                uses[rid] = left
            else:
                del uses[rid]

    def in_use(self, name: str) -> bool:
        """Whether an accepted, unanswered request of this frontend names region ``name``."""
        region = self._regions.get(name)
        if region is None:
            return False
        if self._uses[region.region_id] > 0:
            return True
        return self.watch is not None and self.watch.uses(region.region_id) > 0

    def unregister(self, name: str) -> tuple[list[Region], list[str]]:
        """Forget ``name`` (or every region not in use when ``name`` is empty).

        Returns:
            The regions removed, and the names kept because a request of this frontend uses
            them (``unregister_refusal`` words Triton's answer; an unknown name is neither,
            as Triton answers success for it).

        Requests in flight keep working either way: they carry the region's key and id,
        and the worker keeps its own mapping.

        Raises:
            TritonMPError: UNSUPPORTED when client shared memory is disabled.
        """
        self._check_enabled()
        self._changing()  # NOTE: first: nothing is sent naming a region after the check
        names = list(self._regions) if not name else [name] if name in self._regions else []
        kept = [n for n in names if self.in_use(n)]
        removed = [self._regions.pop(n) for n in names if n not in kept]
        self.generation += 1
        return removed, kept

    def drop(self, names: Iterable[str]) -> list[str]:
        """Forget the regions another frontend unregistered, but those a request of this
        frontend uses. Returns the names kept (that frontend then keeps them everywhere)."""
        self._changing()
        names = list(names)
        kept = [n for n in names if self.in_use(n)]
        for n in names:
            if n not in kept:
                self._regions.pop(n, None)
        self.generation += 1
        return kept

    def regions(self) -> list[Region]:
        """Every region (also when client shared memory is disabled: none then)."""
        return list(self._regions.values())

    def status(self, name: str = "") -> list[Region]:
        """Every region, or the one called ``name``.

        Raises:
            TritonMPError: NOT_FOUND ("Unable to find system shared memory region: '<n>'").
        """
        self._check_enabled()
        if not name:
            return list(self._regions.values())
        region = self._regions.get(name)
        if region is None:
            if self.cuda is not None and self.cuda.has(name):
                raise TritonMPError(
                    f"The region named '{name}' is registered as CUDA shared memory, not "
                    "system shared memory",
                    ErrorCode.NOT_FOUND,
                )
            raise TritonMPError(
                f"Unable to find system shared memory region: '{name}'", ErrorCode.NOT_FOUND
            )
        return [region]

    def has(self, name: str) -> bool:
        """Whether ``name`` is a registered system region."""
        return name in self._regions

    def holds(self, region: Region) -> bool:
        """Whether ``region``'s name is still that registration (``gives_way`` may have given
        it up)."""
        return self._regions.get(region.name) == region

    def window(self, name: str, offset: int, byte_size: int) -> Region:
        """The region a tensor names, checked against ``offset`` + ``byte_size``.

        Raises:
            TritonMPError: NOT_FOUND for an unknown region (as Triton); InvalidRequest when
                the window does not fit the region.
        """
        if not self.enabled:
            raise TritonMPError(DISABLED_MESSAGE, ErrorCode.UNSUPPORTED)
        region = self._regions.get(name)
        if region is None:
            if self.cuda is not None:
                self.cuda.refuse_in_request(name, "a tensor")
            raise TritonMPError(
                f"Unable to find shared memory region: '{name}'", ErrorCode.NOT_FOUND
            )
        if offset < 0 or offset >= region.byte_size:
            raise InvalidRequest(f"Invalid offset for shared memory region: '{name}'")
        if byte_size > _SIZE_MAX - offset:
            raise InvalidRequest(
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) "
                f"exceeds maximum value ({_SIZE_MAX}) for region '{name}'"
            )
        # NOTE: upstream main's end check (PR #8335, 2025) takes an empty window at offset 0;
        # 2.51's (offset + byte_size - 1, unsigned) refused it.
        if byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidRequest(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region


_SIZE_MAX = 2**64 - 1
"""``SIZE_MAX`` of Triton's ``size_t`` (offsets and sizes are read as unsigned)."""

RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"
"""Keys Triton keeps for its own regions (server ``common.h``)."""


def unregister_refusal(name: str, kept: Iterable[str]) -> TritonMPError | None:
    """Triton's answer to an unregister that kept regions in use (INTERNAL; server
    ``shared_memory_manager.cc`` 2.51); None when none was kept.

    Args:
        name: the region the call named; empty: the call unregistered all.
        kept: the names kept, from every frontend.

    Returns:
        "Cannot unregister shared memory region '<n>', it is currently in use." for one
        name, "Failed to unregister the following system shared memory regions: <n> ,<m> ,"
        for all (names in Triton's map order: sorted).
    """
    names = sorted(set(kept))
    if not names:
        return None
    if name:
        return TritonMPError(
            f"Cannot unregister shared memory region '{name}', it is currently in use.",
            ErrorCode.INTERNAL,
        )
    listed = "".join(f"{n} ," for n in names)
    return TritonMPError(
        f"Failed to unregister the following system shared memory regions: {listed}",
        ErrorCode.INTERNAL,
    )


def check_shm_key(name: str, key: str) -> None:
    """A system shared-memory key as server ``common.cc`` ValidateSharedMemoryKey checks it
    (upstream main, 2025; 2.51 has no such check): not only slashes, not Triton's prefix.

    Raises:
        InvalidRequest: "cannot register shared memory region '<n>' - invalid shm key
            '<k>'" or "... with key '<k>' as the key contains the reserved prefix '<p>'".
    """
    rest = key.lstrip("/")
    if not rest:
        raise InvalidRequest(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )
    if rest.startswith(RESERVED_KEY_PREFIX):
        raise InvalidRequest(
            f"cannot register shared memory region '{name}' with key '{key}' as the key "
            f"contains the reserved prefix '{RESERVED_KEY_PREFIX}'"
        )
