"""POSIX shared-memory segments and semaphores: create/attach/unlink, leak sweep.

Imported by every role (through ``triton_mp.ipc``). Every object a server creates is named
``/triton_mp_<server_id>_<purpose>`` (``ipc.memory.topology`` names each one) where ``server_id`` is
the supervisor's pid, so that:

- two servers on one machine never collide (pids are unique while both live);
- a leak check can glob ``/dev/shm/triton_mp_*`` and ``/dev/shm/sem.triton_mp_*``;
- the next start can remove what a ``kill -9``-ed server left (its pid is dead). A pid
  means something only in its pid namespace, and containers run with ``--ipc=host`` share
  ``/dev/shm`` across namespaces: each server marks its objects with its namespace
  (``claim_server_id``), and the sweep judges only its own namespace's.

Only the creator of a segment (the supervisor for rings, the allocating process for arenas)
unlinks it; attachers only unmap.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import sys
from collections.abc import Callable
from pathlib import Path

import posix_ipc

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.common.process.process_dirs import pid_alive, pid_namespace
from triton_mp.ipc.memory.topology import Kind, Topology, server_of

log = logging.getLogger(__name__)

DEV_SHM = Path("/dev/shm")


class Segment:
    """One mapped POSIX shared-memory segment.

    Attributes:
        name: POSIX name, with the leading slash.
        size_bytes: mapped length in bytes.
        buf: the ``mmap`` over the whole segment: read-write, or read-only for a segment
            attached with ``writable=False`` (``store_u32``, which writes through
            the segment's descriptor, is then the only way to change it).
    """

    __slots__ = ("name", "size_bytes", "buf", "_owner", "_fd", "_words")

    def __init__(
        self, name: str, buf: mmap.mmap, size_bytes: int, owner: bool, fd: int = -1
    ) -> None:
        self.name = name
        self.buf = buf
        self.size_bytes = size_bytes
        self._owner = owner
        self._fd = fd
        """Descriptor kept open by a read-only attachment (``store_u32``); -1 otherwise."""
        self._words: memoryview | None = None
        """``buf`` as native ``u32`` words (``store_u32``), made on first use."""

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
    def attach(cls, name: str, writable: bool = True) -> Segment:
        """Map an existing segment, read-write or (``writable=False``) read-only.

        A read-only attachment keeps the segment's descriptor open for ``store_u32``: a reader
        that may change only a word or two (``ipc.tensor_pool.free_block``) has no writable
        mapping, so a stray store of this process into it (a stale pointer, a view that
        outlived its block) faults at once instead of corrupting another process's data.

        Raises:
            posix_ipc.ExistentialError: no such segment.
        """
        shm = posix_ipc.SharedMemory(name)
        fd = shm.fd
        try:
            size = os.fstat(fd).st_size
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            buf = mmap.mmap(fd, size, access=access)
        except BaseException:
            shm.close_fd()
            raise
        if writable:
            shm.close_fd()
            fd = -1
        return cls(name, buf, size, owner=False, fd=fd)

    @property
    def writable(self) -> bool:
        """Whether ``buf`` is a writable mapping (created, or attached read-write)."""
        return self._fd < 0

    def store_u32(self, offset: int, value: int) -> None:
        """Store the native ``u32`` ``value`` at byte ``offset`` (a multiple of 4) as ONE
        aligned 4-byte write, the only store to those bytes (a word another process reads
        and takes over when it changes: ``ipc.tensor_pool``'s block state).

        NOTE: ``struct.pack_into`` is no such store: it zero-fills the field, then writes
        it byte by byte, so a word it sets reads as its final value early and is written
        again afterwards, over whatever the other process stored there in between.

        A writable mapping is written through a ``u32`` view of it (one ``mov``). A read-only
        attachment is written through its descriptor (``pwrite``, one system call, about
        1 us: the same shared pages). The kernel may copy those 4 bytes one by one, but
        writes each once, in order: for a word whose values differ only in their low byte
        (the block state: 0 or 1) that is the same as one store.
        """
        if self._fd < 0:
            words = self._words
            if words is None:
                view = memoryview(self.buf)
                words = self._words = view[: len(view) & ~3].cast("I")
                view.release()
            words[offset >> 2] = value
        else:
            data = value.to_bytes(4, sys.byteorder)
            if os.pwrite(self._fd, data, offset) != 4:
                raise OSError(errno.EIO, f"{self.name}: short write at byte {offset}")

    def close(self) -> None:
        """Unmap. Views still exported (numpy arrays over ``buf``) keep the mapping alive."""
        if self._words is not None:
            self._words.release()
            self._words = None
        # NOTE: numpy views over the mapping may still be alive; the OS unmaps at exit.
        with contextlib.suppress(BufferError):
            self.buf.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

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


def _namespaces(entries: list[str]) -> dict[str, set[int]]:
    """Server id -> the pid namespaces its markers (``Kind.PID_NAMESPACE``) record."""
    out: dict[str, set[int]] = {}
    for entry in entries:
        sid = server_of(entry)
        obj = None if sid is None else Topology(sid).parse(entry)
        if sid is not None and obj is not None and obj.kind is Kind.PID_NAMESPACE:
            out.setdefault(sid, set()).add(obj.fields["namespace"])
    return out


def stale_entries(
    entries: list[str],
    own_server_id: str | None,
    own_namespace: int | None,
    alive: Callable[[int], bool] = pid_alive,
) -> list[str]:
    """Which ``/dev/shm`` entries belong to servers proved dead (``sweep_stale``'s decision).

    A server's objects are stale when its marker records this pid namespace (or it has no
    marker: an older server, judged as before) and its pid (the server id) is not
    ``alive`` or equals ``own_server_id`` (a previous process that had our pid). A server
    whose marker records another namespace shares ``/dev/shm`` from another pid namespace
    (``--ipc=host``): its pid means nothing here, so its objects are never stale. Without
    ``own_namespace`` (no ``/proc``) only unmarked servers are judged.

    Args:
        entries: ``/dev/shm`` entry names (``sem.`` prefix for semaphores).
        own_server_id: the sweeping server's id, or None.
        own_namespace: ``pid_namespace()`` of the sweeping process.
        alive: whether a pid of this namespace runs.
    """
    namespaces = _namespaces(entries)
    out = []
    for entry in entries:
        sid = server_of(entry)
        if sid is None:
            continue
        marks = namespaces.get(sid)
        if marks is not None and marks != {own_namespace}:
            continue
        if sid == own_server_id or not alive(int(sid)):
            out.append(entry)
    return out


def sweep_stale(own_server_id: str | None = None, dev_shm: Path = DEV_SHM) -> list[str]:
    """Remove objects left by triton-mp servers of this pid namespace that no longer run
    (``stale_entries`` decides).

    Returns:
        The POSIX names removed.
    """
    try:
        entries = [e.name for e in dev_shm.iterdir()]
    except FileNotFoundError:
        return []
    removed = [
        "/" + name.removeprefix("sem.")
        for name in stale_entries(entries, own_server_id, pid_namespace())
        if remove_entry(name)
    ]
    if removed:
        log.info("removed %d shared-memory objects left by dead servers", len(removed))
    return removed


def claim_server_id(server_id: str, dev_shm: Path = DEV_SHM) -> None:
    """Mark ``server_id``'s objects as this pid namespace's: an empty segment
    ``Kind.PID_NAMESPACE`` that ``stale_entries`` reads. Called after ``sweep_stale`` and
    before the server creates anything else, so a live server's objects always carry it.

    Raises:
        TritonMPError: a server of another pid namespace that shares this ``/dev/shm``
            has the same id (its pid number); nothing is created, and this server's names
            would collide with its objects.
    """
    own = pid_namespace()
    if own is None:
        return
    marks = _namespaces(list_objects(server_id, dev_shm))
    others = marks.get(server_id, set()) - {own}
    if others:
        raise TritonMPError(
            f"shared-memory objects named for server id {server_id} belong to a server of "
            f"another pid namespace ({sorted(others)[0]}) that shares /dev/shm: run this "
            "server with its own /dev/shm (no --ipc=host)"
        )
    name = Topology(server_id).pid_namespace(own)
    posix_ipc.SharedMemory(name, posix_ipc.O_CREAT, mode=0o600, size=0).close_fd()


def list_objects(server_id: str | None = None, dev_shm: Path = DEV_SHM) -> list[str]:
    """Names of triton-mp entries in ``/dev/shm`` (of one server, or of all)."""
    out = []
    for entry in sorted(dev_shm.iterdir()):
        owner = server_of(entry.name)
        if owner is not None and (server_id is None or owner == server_id):
            out.append(entry.name)
    return out
