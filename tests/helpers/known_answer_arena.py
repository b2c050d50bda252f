"""A worker-like output arena for ``_native.known_answer_build`` tests, and what the Python
path replies for an answer in it (not a test module). Used by tests/unit/test_known_answer.py
and test_known_answer_in_place.py."""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from triton_mp.frontend.grpc.messages import ResponseHeads
from triton_mp.frontend.grpc.wire import infer_response_parts
from triton_mp.ipc.memory.shm import Segment, unlink_quietly
from triton_mp.ipc.protocol.messages import BlockRef, InferResponse
from triton_mp.ipc.tensor_pool import LIVE

_names = itertools.count()
_HEADER = struct.Struct("<IIQ")
"""tensor_pool's block header: u32 state, u32 generation, u64 size."""


def native() -> Any:
    from triton_mp.frontend.native import _native  # type: ignore[attr-defined]

    return _native


@contextmanager
def output_arena(prefix: str, blocks: int, block_bytes: int) -> Iterator[Segment]:
    """A shared-memory segment of ``blocks`` x ``block_bytes`` (``/<prefix>_<pid>_<n>``);
    C++ forgets its known-answer mappings before and after."""
    name = f"/{prefix}_{os.getpid()}_{next(_names)}"
    seg = Segment.create(name, blocks * block_bytes)
    native().known_answer_forget()
    try:
        yield seg
    finally:
        native().known_answer_forget()
        seg.close()
        unlink_quietly(name)


def make_live(seg: Segment, i: int, generation: int, block_bytes: int) -> BlockRef:
    """Block ``i`` (of ``block_bytes``, its 64-byte header included) made LIVE with
    ``generation``."""
    _HEADER.pack_into(seg.buf, i * block_bytes, LIVE, generation, block_bytes)
    return BlockRef(seg.name, i * block_bytes, generation)


def state(seg: Segment, b: BlockRef) -> int:
    """The state word of block ``b``'s header (tensor_pool's LIVE, FREE, ...)."""
    return int(_HEADER.unpack_from(seg.buf, b.offset)[0])


def python_bytes(r: InferResponse, seg: Segment, client_id: str) -> bytes:
    """What ``KnownCalls`` replies with for ``r`` (the parts joined)."""
    head = ResponseHeads().head("m", r.version, client_id, r.parameters_json, r.outputs)
    views = [memoryview(seg.buf)[t.offset : t.offset + t.nbytes] for t in r.outputs]
    return b"".join(bytes(p) for p in infer_response_parts(head, views))


def teach(lesson: int, r: InferResponse, client_id: str) -> None:
    """Teach C++ the head of ``r``'s form for ``lesson``, as ``KnownCalls.on_head`` does."""
    head = ResponseHeads().head("m", r.version, client_id, r.parameters_json, r.outputs)
    forms = tuple((t.name, t.datatype, t.shape) for t in r.outputs)
    native().known_answer_teach(lesson, r.version, r.parameters_json, forms, head)
