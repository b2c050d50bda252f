#!/usr/bin/env python3
"""A batch's answers to one frontend, encoded by the worker and decoded by the frontend: msgpack
``AnswerBatch`` (production) against the binary ANSWERS record (``ipc.recordio.answer_records``).

    PYTHONPATH=src python bench/answer_codec_cost.py --rounds 5

Builds, for 2, 4 and 8 requests per batch (the worker groups 2 or more), an ``AnswerBatch``
as ``workers.tensors.answer_batch`` writes it for add_sub_py (two FP32 [1, 16] outputs per
request, one shared block and its ``Handoff``), checks that both forms decode to the same
message (``codec.Decoder`` takes both, as the frontend's inbox does), then times encode and
decode of each form in process CPU time, the two forms alternating round by round; prints the
best round of each in µs per batch and the ratio record / msgpack of encode + decode. This is
why the workers send msgpack: in Python the record is dearer at both ends; a native reader
and writer would be another matter.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BlockRef,
    Handoff,
    InferResponse,
    TensorRef,
)
from triton_mp.ipc.recordio.answer_records import encode_answer
from triton_mp.ipc.recordio.codec import Decoder, encode

SEGMENT = "/triton_mp_12345_w3_0"


def answer_batch(n: int) -> AnswerBatch:
    """``n`` responses of add_sub_py in one block, as the worker groups them."""
    block = BlockRef(SEGMENT, 4096, 17)
    responses = []
    for i in range(n):
        at = 4096 + 64 + 128 * i
        outputs = (
            TensorRef("OUTPUT0", "FP32", (1, 16), SEGMENT, at, 64),
            TensorRef("OUTPUT1", "FP32", (1, 16), SEGMENT, at + 64, 64),
        )
        responses.append(
            InferResponse(request_id=1000 + i, version=1, outputs=outputs, shared_blocks=(block,))
        )
    return AnswerBatch(responses=tuple(responses), handoffs=(Handoff(block, n),))


def cpu_us(fn: Callable[[], object], loops: int) -> float:
    """Process CPU µs per call of ``fn`` over ``loops`` calls."""
    t0 = time.process_time_ns()
    for _ in range(loops):
        fn()
    return (time.process_time_ns() - t0) / loops / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loops", type=int, default=5000)
    args = ap.parse_args()
    decoder: Decoder[AnswerBatch | InferResponse] = Decoder(AnswerBatch | InferResponse)
    for n in (2, 4, 8):
        msg = answer_batch(n)
        packed, record = encode(msg), encode_answer(msg)
        assert record is not None
        assert decoder.decode(packed) == msg
        assert decoder.decode(record) == msg  # the same message from both forms
        forms: dict[str, tuple[Callable[[], object], bytes]] = {
            "msgpack": (partial(encode, msg), packed),
            "record": (partial(encode_answer, msg), record),
        }
        best: dict[str, list[float]] = {k: [1e9, 1e9] for k in forms}
        for _ in range(args.rounds):
            for name, (enc, data) in forms.items():
                e = cpu_us(enc, args.loops)
                d = cpu_us(partial(decoder.decode, data), args.loops)
                best[name] = [min(best[name][0], e), min(best[name][1], d)]
        mp, rec = best["msgpack"], best["record"]
        print(
            f"{n} per batch: msgpack encode {mp[0]:.2f} decode {mp[1]:.2f} ({len(packed)} B); "
            f"record encode {rec[0]:.2f} decode {rec[1]:.2f} ({len(record)} B) µs per batch; "
            f"record / msgpack {sum(rec) / sum(mp):.2f}x"
        )


if __name__ == "__main__":
    main()
