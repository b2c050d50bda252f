"""Inputs whose client region overlaps an output's window are handed over as copies
(``workers.tensors.tensor_io.overlapping_inputs``). No processes; the end-to-end case, against
Triton 2.51 too, is in ``tests/e2e/test_triton_shm_messages.py``.
"""

from __future__ import annotations

import pytest

from triton_mp.ipc.protocol.messages import (
    BlockRef,
    InferRequest,
    OutputRegion,
    ReplyTo,
    Requester,
    TensorRef,
)
from triton_mp.workers.tensors.tensor_io import overlapping_inputs


def _request(
    inputs: tuple[TensorRef, ...], regions: tuple[OutputRegion | None, ...]
) -> InferRequest:
    return InferRequest(
        request_id=1,
        reply_to=ReplyTo(Requester.FRONTEND, 0),
        model="m",
        version=1,
        batch_size=1,
        inputs=inputs,
        outputs=tuple(f"O{i}" for i in range(len(regions))),
        block=BlockRef("unused", 0),
        arrival_ns=0,
        output_regions=regions,
    )


def _in(name: str, key: str, offset: int, nbytes: int, region_id: int = 5) -> TensorRef:
    return TensorRef(name, "FP32", (nbytes // 4,), key, offset, nbytes, region_id)


def _out(key: str, offset: int, byte_size: int) -> OutputRegion:
    return OutputRegion(key, 9, offset, byte_size, "o")


@pytest.mark.parametrize(
    ("inp", "out", "overlaps"),
    [
        ((64, 128), (80, 128), True),  # output starts inside the input
        ((64, 128), (16, 64), True),  # output ends inside the input
        ((64, 128), (0, 512), True),  # output covers the input
        ((64, 128), (192, 64), False),  # output right after the input
        ((64, 128), (0, 64), False),  # output right before the input
    ],
)
def test_only_intersecting_byte_ranges_of_one_object_overlap(
    inp: tuple[int, int], out: tuple[int, int], overlaps: bool
) -> None:
    req = _request((_in("A", "/k", *inp),), (_out("/k", *out),))
    assert overlapping_inputs(req) == (["A"] if overlaps else [])


def test_other_objects_arena_inputs_and_arena_outputs_never_overlap() -> None:
    req = _request(
        (
            _in("other", "/k2", 0, 64),
            _in("arena", "/k", 0, 64, region_id=0),  # an arena segment that shares the name
            _in("hit", "/k", 0, 64),
        ),
        (None, _out("/k", 32, 64)),
    )
    assert overlapping_inputs(req) == ["hit"]
