"""POSIX shared-memory segments and semaphores: create/attach/unlink, leak sweep.

Imported by every role (through ``triton_mp.ipc``). Every object a server creates is named
``/triton_mp_<server_id>_<purpose>`` (``ipc.topology`` names each one) where ``server_id`` is
the supervisor's pid, so that:

- two servers on one machine never collide (pids are unique while both live);
- a leak check can glob ``/dev/shm/triton_mp_*`` and ``/dev/shm/sem.triton_mp_*``;
- the next start can remove what a ``kill -9``-ed server left (its pid is dead).

Only the creator of a segment (the supervisor for rings, the allocating process for arenas)
unlinks it; attachers only unmap.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
from pathlib import Path

import posix_ipc

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc.topology import Topology, server_of

log = logging.getLogger(__name__)

DEV_SHM = Path("/dev/shm")


class Segment:
    """One mapped POSIX shared-memory segment.

    Attributes:
        name: POSIX name, with the leading slash.
        size_bytes: mapped length in bytes.
        buf: the ``mmap`` over the whole segment (read-write).
    """

    __slots__ = ("name", "size_bytes", "buf", "_owner")

    def __init__(self, name: str, buf: mmap.mmap, size_bytes: int, owner: bool) -> None:
        self.name = name
        self.buf = buf
        self.size_bytes = size_bytes
        self._owner = owner

    @classmethod
    def create(cls, name: str, size_bytes: int) -> Segment:
        """Create (exclusively) and map a zero-filled segment of ``size_bytes`` bytes.

        Raises:
            posix_ipc.ExistentialError: an object of that name exists already.
            ShmExhausted: ``/dev/shm`` has no room for it (nothing is left behind).
        """
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size_bytes)
        try:
            reserve(shm.fd, name, size_bytes)
            buf = mmap.mmap(shm.fd, size_bytes)
        except BaseException:
            unlink_quietly(name)
            raise
        finally:
            shm.close_fd()
        return cls(name, buf, size_bytes, owner=True)

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map an existing segment read-write.

        Raises:
            posix_ipc.ExistentialError: no such segment.
        """
        shm = posix_ipc.SharedMemory(name)
        try:
            size = os.fstat(shm.fd).st_size
            buf = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        return cls(name, buf, size, owner=False)

    def close(self) -> None:
        """Unmap. Views still exported (numpy arrays over ``buf``) keep the mapping alive."""
        # NOTE: numpy views over the mapping may still be alive; the OS unmaps at exit.
        with contextlib.suppress(BufferError):
            self.buf.close()

    def unlink(self) -> None:
        """Remove the name (owner only). Mappings stay valid until closed."""
        if not self._owner:
            raise PermissionError(f"{self.name}: only the creating process unlinks a segment")
        unlink_quietly(self.name)


class ShmExhausted(TritonMPError):
    """``/dev/shm`` cannot hold a new segment (RESOURCE_EXHAUSTED)."""

    code = ErrorCode.RESOURCE_EXHAUSTED


def reserve(fd: int, name: str, size_bytes: int) -> None:
    """Allocate every page of a new segment now (``posix_fallocate``).

    NOTE: tmpfs hands out pages on first touch; a segment bigger than what ``/dev/shm`` has
    left maps fine and then kills the first process that writes past the room with SIGBUS,
    which no Python code can catch. Reserving at creation turns that into an error here.

    Raises:
        ShmExhausted: no room (ENOSPC), with what ``/dev/shm`` has free.
    """
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise
        try:
            st = os.statvfs(DEV_SHM)
            free = f"{st.f_bavail * st.f_frsize} bytes free"
        except OSError:
            free = "free space unknown"
        raise ShmExhausted(
            f"no room in shared memory for the {size_bytes}-byte segment '{name}' "
            f"(/dev/shm: {free}); give the server a larger /dev/shm (docker: --shm-size) "
            "or lower --arena-budget-bytes"
        ) from None


def client_object_refusal(
    key: str, owner_uid: int, server_id: str, allowed_prefix: str = ""
) -> str | None:
    """Why a client's shared-memory object may not be mapped, or None when it may.

    The rules (the operator's, see ``--client-shm-prefix``): never one of this server's own
    objects (``/triton_mp_<server_id>_*``: a client could read other clients' tensors or
    corrupt the rings); only objects owned by the server's user; and, when
    ``allowed_prefix`` is set, only keys that start with it. ``key`` and ``allowed_prefix``
    may have a leading slash or not.
    """
    bare = key.lstrip("/")
    if bare.startswith(Topology(server_id).entry_prefix):
        return "it is one of this server's own objects"
    prefix = allowed_prefix.lstrip("/")
    if prefix and not bare.startswith(prefix):
        return f"its key does not start with the allowed prefix '/{prefix}' (--client-shm-prefix)"
    if owner_uid != os.geteuid():
        return f"it is owned by uid {owner_uid}, not by the server's user (uid {os.geteuid()})"
    return None


def create_semaphore(name: str, initial_value: int = 0) -> posix_ipc.Semaphore:
    """Create (exclusively) a semaphore with ``initial_value`` (default 0)."""
    return posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o600, initial_value=initial_value)


def unlink_quietly(name: str) -> None:
    """Unlink a shared-memory segment or semaphore by name, ignoring ones already gone."""
    for unlink in (posix_ipc.unlink_shared_memory, posix_ipc.unlink_semaphore):
        try:
            unlink(name)
        except posix_ipc.ExistentialError:
            continue


def remove_entry(entry: str) -> bool:
    """Unlink the object behind a ``/dev/shm`` entry name (``sem.x`` is semaphore ``/x``,
    anything else shared memory ``/entry``). False when it was already gone."""
    try:
        if entry.startswith("sem."):
            posix_ipc.unlink_semaphore("/" + entry.removeprefix("sem."))
        else:
            posix_ipc.unlink_shared_memory("/" + entry)
    except posix_ipc.ExistentialError:
        return False
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(own_server_id: str | None = None, dev_shm: Path = DEV_SHM) -> list[str]:
    """Remove objects left by triton-mp servers that no longer run.

    An object belongs to a dead server when the pid in its name is not alive, or equals
    ``own_server_id`` (a previous process that had our pid and died without cleaning up).

    Returns:
        The POSIX names removed.
    """
    removed: list[str] = []
    try:
        entries = list(dev_shm.iterdir())
    except FileNotFoundError:
        return removed
    for entry in entries:
        pid = server_of(entry.name)
        if pid is None:
            continue
        if pid != own_server_id and _pid_alive(int(pid)):
            continue
        if remove_entry(entry.name):
            removed.append("/" + entry.name.removeprefix("sem."))
    if removed:
        log.info("removed %d shared-memory objects left by dead servers", len(removed))
    return removed


def list_objects(server_id: str | None = None, dev_shm: Path = DEV_SHM) -> list[str]:
    """Names of triton-mp entries in ``/dev/shm`` (of one server, or of all)."""
    out = []
    for entry in sorted(dev_shm.iterdir()):
        owner = server_of(entry.name)
        if owner is not None and (server_id is None or owner == server_id):
            out.append(entry.name)
    return out
