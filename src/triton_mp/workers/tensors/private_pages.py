"""A client's input as the model's own: a copy-on-write mapping whose written pages are
dropped before the window is read again.

Imported by ``workers.tensors.tensor_io`` (``ClientRegions``). Triton 2.51's python backend
copies every input into the stub's shared memory, so a model may write its inputs in place
(``x += 1``) and the client's registered region stays as the client wrote it. Here an input in
a client's system shared memory is a view of a ``MAP_PRIVATE`` mapping with ``PROT_WRITE``
(``map_private``): reading it is the client's pages themselves (no copy; a page nobody wrote
shows what the client writes there later, as Linux maps a private file mapping's unwritten
pages from the page cache), and a model's write lands in a private copy of that one page
(the kernel's copy-on-write), never in the client's object.

Before a window is read again, a page a model wrote there (in its batch, or later through an
array it kept or from its thread) must go back to the client's contents, or the next request
reading it would see the write. ``ClientRegions.input_window`` does it in two steps, each
skipped when the one before says nothing was written:

1. The process's minor page faults (``minor_faults``, ``getrusage``, every thread's; read once
   per batch): a write to a page of a private mapping that is still the client's is a
   copy-on-write fault, so when the count is the one at the window's last give-back, none of
   its pages was written since (about 1.7 us per batch).
2. ``/proc/self/pagemap`` (``PrivatePages.drop_written``): which pages of the window are this
   process's own (an anonymous page: present without the file flag, or swapped); those are
   given back with ``madvise(MADV_DONTNEED)`` (the next read maps the client's pages again).
   Reading pagemap costs ~32 ns per page (8 us for a 1 MiB window, against ~20 us to copy it).

``MADV_DONTNEED`` on every batch would cost the next batch its page faults again (~150 us per
MiB measured). Where pagemap cannot be read, the window is given back whenever a fault was
counted (correct, slower).

NOTE: a write the kernel makes for the model through ``get_user_pages`` (an ``O_DIRECT`` read
into an input) counts no fault for the process; such a write would be read by the next
request on that window.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import resource
import weakref

PAGE_BYTES = mmap.PAGESIZE
"""The kernel's page size in bytes (pagemap has one 8-byte entry per page)."""

_OWN = bytes(1 if (b & 0xA0) == 0x80 or (b & 0x60) == 0x40 else 0 for b in range(256))
"""Top byte of a pagemap entry -> 1 where the page is this process's own copy: bit 63 (0x80,
present) without bit 61 (0x20, file page or shared anonymous), or bit 62 (0x40, swapped)
without bit 61 (Documentation/admin-guide/mm/pagemap.rst)."""


def map_private(fd: int, size: int) -> tuple[mmap.mmap, int]:
    """``(mapping, its start address)``: ``size`` bytes of the object open as ``fd`` (read-only
    is enough), mapped copy-on-write and writable.

    Raises:
        OSError, ValueError: as ``mmap.mmap``.
    """
    buf = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    # NOTE: the ctypes view is a temporary: its export of the buffer ends with this line, so
    # the mapping can still be closed.
    return buf, ctypes.addressof(ctypes.c_char.from_buffer(buf))


class PrivatePages:
    """Gives back the pages a model wrote in ``map_private`` mappings (module docstring)."""

    def __init__(self, pagemap: str | None = "/proc/self/pagemap") -> None:
        """``pagemap``: the file to ask which pages are private (None: ask nothing and give
        every window back, as where it cannot be opened). It is opened on the first question
        (most workers never see a write) and closed by ``close`` or with this object."""
        self._path = pagemap
        self._fd: int | None = None
        self._closer: weakref.finalize[[int], PrivatePages] | None = None

    def drop_written(self, buf: mmap.mmap, address: int, offset: int, nbytes: int) -> bool:
        """Give back the pages of ``buf`` under ``[offset, offset + nbytes)`` that the model
        wrote (each run of them, one ``madvise``; all of them where pagemap cannot tell);
        True when there was one. A closed mapping (evicted, with no view left) holds nothing
        to give back."""
        if not nbytes or buf.closed:
            return False
        start = offset - offset % PAGE_BYTES
        end = min(offset + nbytes, len(buf))
        own = self._own(address, start, end - start)
        if own is None:
            buf.madvise(mmap.MADV_DONTNEED, start, end - start)
            return True
        first = own.find(1)
        if first < 0:
            return False
        while first >= 0:
            after = own.find(0, first)
            if after < 0:
                after = len(own)
            run = start + first * PAGE_BYTES
            buf.madvise(mmap.MADV_DONTNEED, run, min(after * PAGE_BYTES + start, end) - run)
            first = own.find(1, after)
        return True

    def _own(self, address: int, offset: int, nbytes: int) -> bytes | None:
        """One byte per page under ``[address + offset, + nbytes)``: 1 where it is this
        process's own copy; None where pagemap cannot tell."""
        fd = self._fd if self._fd is not None else self._open()
        if fd is None:
            return None
        first = (address + offset) // PAGE_BYTES
        count = (address + offset + nbytes - 1) // PAGE_BYTES - first + 1
        try:
            entries = os.pread(fd, 8 * count, 8 * first)
        except OSError:
            return None
        return entries[7::8].translate(_OWN)

    def _open(self) -> int | None:
        """Open pagemap (once; None for good where it cannot be opened). An object dropped
        without ``close`` closes it when collected: tests make many."""
        path, self._path = self._path, None
        if path is None:
            return None
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        self._closer = weakref.finalize(self, os.close, self._fd)
        return self._fd

    def close(self) -> None:
        """Close pagemap (nothing is asked after this)."""
        self._path = None
        self._fd = None
        if self._closer is not None:
            self._closer()


def minor_faults() -> int:
    """Minor page faults of every thread of this process so far (``ru_minflt``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
