"""The layout of the binary ring records, version 2: constants, struct formats, the string
area builder. The table itself, and the rules every reader and writer keeps, are in
``ipc.recordio.records`` (the module the roles import); ``ipc/records.h`` is the C twin of this
module.

Imported by ``ipc.recordio.request_records`` and ``ipc.recordio.answer_records`` only.
"""

from __future__ import annotations

import struct

MARKER = 0xC1
VERSION = 2
KIND_REQUEST = 1
KIND_ANSWERS = 2
MAX_DIMS = 8

SEQ_START = 0x1
SEQ_END = 0x2
TRACE_MASK = 0x0C
"""``TRITONSERVER_InferenceTraceLevel`` bits of a sampled request (TIMESTAMPS 4, TENSORS 8)."""
SEQ_STRING = 0x10

FINAL = 0x1
ERROR = 0x2
NAMES_BLOCK = 0x4
EMPTY = 0x8

REQUEST_HEADER = struct.Struct("<BBHIQQQqQIIIIBBHHHIHHIIIIII")
TENSOR_ENTRY = struct.Struct("<QQQIHBBIHH8q")
OUTPUT_ENTRY = struct.Struct("<IHH")
ANSWERS_HEADER = struct.Struct("<BBHIQIHHIIIIII")
RESPONSE_ENTRY = struct.Struct("<QqHBBHHIIIIII")
assert REQUEST_HEADER.size == 104
assert TENSOR_ENTRY.size == 104
assert OUTPUT_ENTRY.size == 8
assert ANSWERS_HEADER.size == 48
assert RESPONSE_ENTRY.size == 48

NO_DIMS = (0,) * MAX_DIMS
WIRE = (
    "INVALID", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
    "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16",
)  # fmt: skip
"""dtype code (``TRITONSERVER_DataType``, ``common.datatypes.DataType``: not imported, as it
brings numpy into the scheduler) -> protocol string."""
CODE = {w: i for i, w in enumerate(WIRE) if i}
"""protocol string -> dtype code."""


class Strings:
    """The string area being built: ``add`` returns a string's (offset, length)."""

    __slots__ = ("base", "parts", "pos")

    def __init__(self, base: int) -> None:
        self.base = base
        self.parts: list[bytes] = []
        self.pos = base

    def add(self, text: str) -> tuple[int, int]:
        data = text.encode()
        at = self.pos
        self.parts.append(data)
        self.pos += len(data)
        return at, len(data)
