"""What frontends tell each other about client shared memory (Triton's shared-memory extension).

Imported by ``ipc.protocol.messages``, which puts ``ShmRegistered``, ``ShmUnregistered`` and
``ShmApplied`` in the ``ToFrontend`` union. Each frontend keeps every registration (system and
CUDA) so that any frontend can serve a request naming a region. The frontend that takes a
register or unregister call sends the change to every other frontend on its own ring to each
(the supervisor wires one between every pair) with an ``op`` number, and answers the client
only once each live peer has sent back ``ShmApplied`` for it (``frontend.shm.peers``): Triton
is one process, so once its call returns every connection sees the change. A peer's
``ShmApplied`` to an unregister names the regions a request it accepted still uses; the
origin then keeps them everywhere and answers Triton's "in use" error. Its ``ShmApplied`` to
a register names the names it holds under another registration (two frontends registered one
name at once); the origin then takes its registration back everywhere and answers Triton's
ALREADY_EXISTS.
"""

from __future__ import annotations

import msgspec


class ShmRegion(msgspec.Struct, frozen=True, array_like=True):
    """A client's system shared-memory registration, as frontends share it
    (``frontend.shm.system.Region``)."""

    name: str
    key: str
    offset: int
    byte_size: int
    region_id: int
    registered_ns: int = 0
    """CLOCK_MONOTONIC when its frontend accepted the register (the earlier of two
    registers of one name wins: ``frontend.shm.system.Region.registered_ns``)."""


class CudaShmRegion(msgspec.Struct, frozen=True, array_like=True):
    """A client's CUDA shared-memory registration, as frontends share it
    (``frontend.shm.cuda.CudaRegion``)."""

    name: str
    raw_handle: bytes
    """The client's ``cudaIpcMemHandle_t`` (64 bytes)."""
    device_id: int
    byte_size: int
    region_id: int
    registered_ns: int = 0
    """As ``ShmRegion.registered_ns``."""


class ShmRegistered(msgspec.Struct, frozen=True, kw_only=True, tag="shm_reg", array_like=True):
    """A frontend registered client regions (or restores ones an unregister kept, or resends
    all it knows to a frontend restarted in a dead one's place): the receiver adds them."""

    frontend_id: int
    """The sender."""
    regions: tuple[ShmRegion, ...]
    cuda: tuple[CudaShmRegion, ...] = ()
    op: int = 0
    """Nonzero: the sender awaits ``ShmApplied(op)`` (0: a resend, no answer)."""


class ShmUnregistered(msgspec.Struct, frozen=True, kw_only=True, tag="shm_unreg", array_like=True):
    """A frontend unregistered client regions: the receiver drops the named ones no request
    of its own uses and answers, in ``ShmApplied.in_use``, the ones it kept."""

    frontend_id: int
    """The sender."""
    names: tuple[str, ...]
    """System regions."""
    cuda_names: tuple[str, ...] = ()
    op: int = 0
    """Nonzero: the sender awaits ``ShmApplied(op)``."""
    region_ids: tuple[int, ...] = ()
    """Given (one per name of ``names`` and then of ``cuda_names``): a register taken back;
    each name is dropped only while it is that registration, used or not."""


class ShmApplied(msgspec.Struct, frozen=True, kw_only=True, tag="shm_applied", array_like=True):
    """A frontend applied another's ``ShmRegistered`` / ``ShmUnregistered`` numbered ``op``
    (sent on its ring to that frontend)."""

    frontend_id: int
    """The frontend that applied it."""
    op: int
    in_use: tuple[str, ...] = ()
    """Of an unregister's system regions: those a request this frontend accepted still uses
    (kept here)."""
    taken: tuple[str, ...] = ()
    """Of a register's regions: the names this frontend holds under another registration
    (kept here)."""
