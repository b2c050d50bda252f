"""Custom-metric boards: the values of a python model's ``pb_utils`` metrics in shared memory.

Imported by python workers (``backends.python.metrics`` writes the board of its process) and
by the frontend that serves ``GET /metrics`` (``frontend.metrics.custom`` reads every board
of the server at scrape time).

Why shared memory: ``metric.increment(v)`` must stay cheap (Triton's own tests scrape
``/metrics`` from inside ``execute`` right after an increment and expect the new value), so
the model writes one float64 in place under its process's lock: no message, no syscall, and
the frontend reads the board whenever it is scraped, without the worker taking part.

One board per worker process that created a metric family, made on first use and named
by ``ipc.memory.topology`` (kind ``METRIC_BOARD``:
``/triton_mp_<sid>_w<iid>p<pid>_cm<generation>``),
so the removal of a dead worker's or an unloaded instance's objects removes it with its
arenas; the worker unlinks it when it stops. A board that runs out of room
is replaced by the next generation (values copied first, the old one unlinked after);
readers take each owner's highest generation.

Layout, little-endian::

    header, HEADER (64 bytes)
      0   8s   magic, MAGIC
      8   u32  writer pid
      12  u32  slot_count: float64 slots after the catalog area
      16  u64  catalog_seq: even while the catalog is stable, odd while it is rewritten
      24  u32  catalog_capacity: bytes of the catalog area, which starts at byte 64
      28  u32  catalog_bytes: length of the current catalog
      32  u32  catalog_crc: zlib.crc32 of those bytes
      36  28x  reserved (zero)
    catalog area: a msgpack ``MetricCatalog`` (every family, its metrics, their slots)
    slots: slot_count float64, from byte 64 + catalog_capacity (a multiple of 8)

Slots of one metric (``pb_utils.Metric`` writes them), by its family's kind:

    counter, gauge:  [value, set_ns]   set_ns: CLOCK_MONOTONIC ns of a gauge's last
                                       ``set`` as a float (0.0: never; counters: 0.0)
    histogram:       [sum, n_0, ..., n_k]  n_i: observations in bucket i (not cumulative),
                                       k = len(buckets): n_k is the +Inf bucket

Consistency: a slot is one aligned 8-byte store, so no read sees half a value; the slots of
one histogram may be an observation apart (as with any Prometheus client library). The
catalog is guarded by catalog_seq and catalog_crc: a reader retries while the sequence is
odd or moved or the checksum does not match.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from array import array
from typing import Literal, NamedTuple

import msgspec

from triton_mp.ipc.memory.shm import Segment
from triton_mp.ipc.memory.topology import metric_board_name

MAGIC = b"TMPCMET\x01"
"""First 8 bytes of a board (the last byte is the layout version)."""
HEADER = struct.Struct("<8sIIQIII28x")
"""The header's fields, in the order of the module docstring."""
_SEQ = struct.Struct("<Q")
_SEQ_OFFSET = 16
_COUNT_CRC = struct.Struct("<II")
_COUNT_CRC_OFFSET = 28
READ_ATTEMPTS = 1000
"""How often a reader retries a catalog that is being rewritten (a rewrite takes µs)."""

Kind = Literal["counter", "gauge", "histogram"]


class BoardMetric(msgspec.Struct, frozen=True, array_like=True):
    """One series of a family."""

    labels: tuple[tuple[str, str], ...]
    """(name, value) pairs, sorted by name."""
    slot: int
    """Its first slot."""
    created_ns: int
    """CLOCK_MONOTONIC ns when the worker created it (the earliest histogram's buckets win
    when instances disagree)."""
    buckets: tuple[float, ...] | None = None
    """A histogram's bucket upper bounds (+Inf implied); None for counters and gauges."""


class BoardFamily(msgspec.Struct, frozen=True, array_like=True):
    """One metric family of the worker (``pb_utils.MetricFamily``)."""

    name: str
    kind: Kind
    description: str
    created_ns: int
    """CLOCK_MONOTONIC ns when the worker created it (the earliest family of a name gives
    the kind and description shown)."""
    metrics: tuple[BoardMetric, ...]


class MetricCatalog(msgspec.Struct, frozen=True, array_like=True):
    """What a board's slots mean."""

    model: str
    version: int
    instance: str
    """Triton's instance name (``<group>_<index>``) of the writer."""
    families: tuple[BoardFamily, ...]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(MetricCatalog)


class BoardSnapshot(NamedTuple):
    """One board as a reader copied it."""

    catalog: MetricCatalog
    values: array[float]
    """Every slot (``array('d')``)."""


class BoardWriter:
    """The writing side: one worker's board, across its generations.

    Not thread-safe: ``pb_utils``'s registry lock serialises every call and every write to
    ``values``.

    Args:
        owner_prefix: the worker process's arena prefix (``topology.process_arena_prefix``).
        slot_count: slots of the first generation.
        catalog_capacity: catalog bytes of the first generation (rounded up to 8).
    """

    def __init__(
        self, owner_prefix: str, slot_count: int = 512, catalog_capacity: int = 16384
    ) -> None:
        self._prefix = owner_prefix
        self._generation = -1
        self._segment: Segment | None = None
        self.values: memoryview[float] = memoryview(bytearray()).cast("d")
        """The slots of the current generation (replaced when it grows)."""
        self._catalog = b""
        self._seq = 0
        self._new_generation(slot_count, catalog_capacity)

    @property
    def name(self) -> str:
        """The current generation's POSIX name."""
        assert self._segment is not None
        return self._segment.name

    def _new_generation(self, slot_count: int, catalog_capacity: int) -> None:
        """Create the next board, copy the values and the catalog there, drop the old one."""
        catalog_capacity = -(-max(catalog_capacity, len(self._catalog)) // 8) * 8
        slot_count = max(slot_count, len(self.values))
        size = HEADER.size + catalog_capacity + 8 * slot_count
        self._generation += 1
        segment = Segment.create(metric_board_name(self._prefix, self._generation), size)
        HEADER.pack_into(segment.buf, 0, MAGIC, os.getpid(), slot_count, 0, catalog_capacity, 0, 0)
        start = HEADER.size + catalog_capacity
        values = memoryview(segment.buf)[start : start + 8 * slot_count].cast("d")
        values[: len(self.values)] = self.values
        old, self._segment = self._segment, segment
        self.values.release()
        self.values = values
        self._seq = 0
        if self._catalog:
            self._write_catalog(self._catalog)
        if old is not None:
            old.unlink()
            old.close()

    def ensure_slots(self, slot_count: int) -> None:
        """Make room for ``slot_count`` slots (a new generation when needed)."""
        if self._segment is None:
            if slot_count > len(self.values):
                grown = memoryview(bytearray(8 * slot_count)).cast("d")
                grown[: len(self.values)] = self.values
                self.values.release()
                self.values = grown
            return
        if slot_count > len(self.values):
            self._new_generation(max(slot_count, 2 * len(self.values)), self._capacity())

    def publish(self, catalog: MetricCatalog) -> None:
        """Replace the catalog (a new generation when it does not fit; nothing once
        closed)."""
        if self._segment is None:
            return
        data = _encoder.encode(catalog)
        if len(data) > self._capacity():
            self._catalog = data
            self._new_generation(len(self.values), 2 * len(data))
        else:
            self._write_catalog(data)

    def _capacity(self) -> int:
        assert self._segment is not None
        return int(HEADER.unpack_from(self._segment.buf, 0)[4])

    def _write_catalog(self, data: bytes) -> None:
        assert self._segment is not None
        buf = self._segment.buf
        self._seq += 1
        _SEQ.pack_into(buf, _SEQ_OFFSET, self._seq)  # odd: being rewritten
        buf[HEADER.size : HEADER.size + len(data)] = data
        _COUNT_CRC.pack_into(buf, _COUNT_CRC_OFFSET, len(data), zlib.crc32(data))
        self._seq += 1
        _SEQ.pack_into(buf, _SEQ_OFFSET, self._seq)
        self._catalog = data

    def close(self) -> None:
        """Unlink and unmap the board (the worker is stopping). The values stay usable in
        process memory (a model's metrics may still be touched by finalisers), unpublished."""
        if self._segment is None:
            return
        local = memoryview(bytearray(8 * len(self.values))).cast("d")
        local[:] = self.values
        self.values.release()
        self.values = local
        self._segment.unlink()
        self._segment.close()
        self._segment = None


def read_board(buf: mmap.mmap | bytes | bytearray) -> BoardSnapshot | None:
    """Copy a board's catalog and slots (the frontend, at scrape time).

    Returns:
        None when ``buf`` is not a board, or its catalog kept changing or did not decode
        (``READ_ATTEMPTS`` times): that board is left out of this scrape.
    """
    view = memoryview(buf)
    try:
        if len(view) < HEADER.size or bytes(view[:8]) != MAGIC:
            return None
        for _ in range(READ_ATTEMPTS):
            _, _, slot_count, seq, capacity, length, crc = HEADER.unpack_from(view, 0)
            if seq & 1 or length > capacity:
                continue
            data = bytes(view[HEADER.size : HEADER.size + length])
            if _SEQ.unpack_from(view, _SEQ_OFFSET)[0] != seq or zlib.crc32(data) != crc:
                continue
            if not data:
                return None
            try:
                catalog = _decoder.decode(data)
            except msgspec.DecodeError:
                return None
            start = HEADER.size + capacity
            values = array("d")
            values.frombytes(view[start : start + 8 * slot_count])
            return BoardSnapshot(catalog, values)
        return None
    finally:
        view.release()
