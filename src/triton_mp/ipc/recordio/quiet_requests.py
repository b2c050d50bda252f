"""Which requests a frontend may push to the scheduler without waking it: model buckets.

Imported by ``frontend.dispatch.wakes`` (the producer's side) and ``scheduler.request_wakeups``
(the consumer's). The quiet word of a frontend's ring to the scheduler (``ipc.memory.ring``,
offset 136) is a 64-bit mask: bit ``model_bucket(name)`` set means a REQUEST record for a
model in that bucket may wait in the ring unread, because every instance of every version of
every model in the bucket is busy and its ``BatchDone`` will wake the scheduler, whose drain
then reads the request (``scheduler.request_wakeups``). A bucket is ``crc32(name) % 64``, the
same in every process (Python's ``hash`` is salted per process); two models that share one
make its bit clear when either is not quiet, so a collision only costs a wake-up.

What always wakes (``request_bit`` returns 0): anything but a REQUEST record of this
version (msgpack messages: cancellations, queries, requests the record cannot carry), and
a request with its own queue timeout (REQUEST ``timeout_us``, Triton's ``timeout``
parameter): the scheduler times it out on its own deadline, which it cannot do unread.

The forming words (``ipc.memory.ring`` offsets 144-167, ``scheduler.forming``) use the same
buckets: a mask, an allowance word (``allowance_word``: an epoch and a count of rows) and a
floor on arrival stamps; ``request_rows_arrival`` reads what a producer counts against them.
"""

from __future__ import annotations

import struct
import zlib

from triton_mp.ipc.recordio.record_layout import KIND_REQUEST, MARKER, REQUEST_HEADER, VERSION

BUCKETS = 64
"""Bits in the quiet word."""
_HEAD = struct.Struct("<BBH")
"""marker, kind, version (REQUEST offsets 0, 1, 2)."""
_REQUEST = (MARKER, KIND_REQUEST, VERSION)
_TIMEOUT = struct.Struct("<I")
_TIMEOUT_OFF = 56
"""REQUEST ``timeout_us`` (u32, microseconds, 0 = none)."""
_ARRIVAL = struct.Struct("<Q")
_ARRIVAL_OFF = 16
"""REQUEST ``arrival_ns`` (u64, CLOCK_MONOTONIC)."""
_ROWS = struct.Struct("<I")
_ROWS_OFF = 52
"""REQUEST ``batch_size`` (u32: the rows the request adds to a batch)."""
EPOCH_SHIFT = 32
ROWS_MASK = 0xFFFFFFFF
"""The allowance word: epoch (u32) << 32 | rows (u32)."""
_MODEL = struct.Struct("<HI")
_MODEL_OFF = 70
"""REQUEST ``model_len`` (u16) then ``model_off`` (u32)."""


def model_bucket(model: str | bytes) -> int:
    """The bucket (0-63) of a model name: ``crc32`` of its UTF-8 bytes, mod 64."""
    data = model.encode() if isinstance(model, str) else model
    return zlib.crc32(data) % BUCKETS


def model_bit(model: str | bytes) -> int:
    """The quiet word's bit of a model name (``1 << model_bucket``)."""
    return 1 << model_bucket(model)


def request_bit(data: bytes | memoryview) -> int:
    """The quiet word's bit a pushed ring payload needs to go without a wake-up; 0 when it
    must always wake (module docstring)."""
    if len(data) < REQUEST_HEADER.size or _HEAD.unpack_from(data, 0) != _REQUEST:
        return 0
    if _TIMEOUT.unpack_from(data, _TIMEOUT_OFF)[0]:
        return 0
    n, at = _MODEL.unpack_from(data, _MODEL_OFF)
    return 1 << (zlib.crc32(data[at : at + n]) % BUCKETS)


def request_rows_arrival(data: bytes | memoryview) -> tuple[int, int]:
    """(batch size, arrival ns) of a REQUEST record (one whose ``request_bit`` is not 0)."""
    return _ROWS.unpack_from(data, _ROWS_OFF)[0], _ARRIVAL.unpack_from(data, _ARRIVAL_OFF)[0]


def allowance_word(epoch: int, rows: int) -> int:
    """The forming allowance word (ring offset 152): ``epoch`` (u32) in the high half,
    ``rows`` (u32, clamped) in the low."""
    return ((epoch & ROWS_MASK) << EPOCH_SHIFT) | min(rows, ROWS_MASK)
