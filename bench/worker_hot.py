#!/usr/bin/env python3
"""The worker's own cost per request, hot, in this process: no server, no wake-ups.

    PYTHONPATH=src python bench/worker_hot.py --per-batch 3
    PYTHONPATH=/tmp/other/src python bench/worker_hot.py --per-batch 1   # another tree

A ``workers.worker.Worker`` over the python backend runs bench/model_repository's add_sub_py
(1x16 float32 inputs). Each batch: the ``BatchAssign`` bytes are decoded, ``run_batch`` views
the inputs in an arena of this process, runs the model and writes the answers (one
``AnswerBatch`` or ``InferResponse`` per frontend, and ``BatchDone``), all encoded as for a
ring; the answers are then decoded and their blocks freed, as a frontend would. Prints CPU µs
per request (process CPU time, the repeat with the least of 7), the part inside the model's
own ``execute`` (process CPU time around it, in that repeat) and the rest: what the goal of
"worker per inference outside execute" counts, less the cost of each batch paid cold in a
live server. The harness's own
encode, decode and free (~3 µs per request) are in every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from triton_mp.backends.python.backend import PythonBackend
from triton_mp.ipc import encode
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BatchAssign,
    BlockRef,
    InferRequest,
    InferResponse,
    ReplyTo,
    Requester,
    TensorRef,
    ToWorker,
)
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    ChannelSpec,
    InboxSpec,
    InstanceSpec,
    LogSpec,
    ModelVersionSpec,
    TensorSpec,
    WorkerSpec,
)
from triton_mp.ipc.recordio.codec import Decoder
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, ArenaAllocator, SegmentCache, free_block
from triton_mp.workers.worker import Worker

MODEL_FILE = Path(__file__).resolve().parent / "model_repository/add_sub_py/1/model.py"
PID = os.getpid()


def _spec() -> tuple[ModelVersionSpec, InstanceSpec, WorkerSpec]:
    def t(name: str) -> TensorSpec:
        return TensorSpec(name=name, datatype="FP32", dims=(16,))

    model = ModelVersionSpec(
        model="add_sub_py",
        version=1,
        backend="python",
        model_file=str(MODEL_FILE),
        max_batch_size=64,
        batching=BatchingSpec(kind="dynamic", max_batch_size=64, max_queue_delay_us=500),
        inputs=(t("INPUT0"), t("INPUT1")),
        outputs=(t("OUTPUT0"), t("OUTPUT1")),
        instance_ids=(0,),
        config_json=json.dumps({"name": "add_sub_py", "max_batch_size": 64}),
    )
    inst = InstanceSpec(instance_id=0, name="add_sub_py_0", model="add_sub_py", version=1)
    spec = WorkerSpec(
        instance=inst,
        model=model,
        # NOTE: Worker never opens its channels (run_worker does): these names stay unused.
        inbox=InboxSpec(f"/triton_mp_{PID}_hot_unused", ()),
        to_scheduler=ChannelSpec(f"/triton_mp_{PID}_hot_unused_ring", "unused"),
        to_frontends={},
        arena_prefix=f"/triton_mp_{PID}_hot_w",
        arena_bytes=1 << 22,
        arena_budget_bytes=1 << 26,
        log=LogSpec(),
    )
    return model, inst, spec


def free_answers(
    sent: list[bytes], answers: Decoder[AnswerBatch | InferResponse], cache: SegmentCache
) -> None:
    """Free the output blocks of the answers the worker ``sent`` (encoded ``AnswerBatch`` or
    ``InferResponse``), as a frontend would after replying, and empty ``sent``."""
    for data in sent:
        msg = answers.decode(data)
        blocks = (
            [h.block for h in msg.handoffs]
            if isinstance(msg, AnswerBatch)
            else [msg.block]
            if msg.block is not None
            else []
        )
        for b in blocks:
            free_block(cache.get(b.segment), b)
    sent.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-batch", type=int, default=3, help="requests per batch")
    ap.add_argument("--batches", type=int, default=2000, help="batches per repeat")
    args = ap.parse_args()
    model, inst, spec = _spec()
    inputs = ArenaAllocator(f"/triton_mp_{PID}_hot_f", 1 << 22, 1 << 26)
    outputs = ArenaAllocator(spec.arena_prefix, spec.arena_bytes, spec.arena_budget_bytes)
    cache = SegmentCache()
    backend = PythonBackend(model, inst)
    sent: list[bytes] = []
    worker = Worker(spec, backend, outputs, cache, lambda _to, m: sent.append(encode(m)), encode)
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(args.per_batch):
        seg, block = inputs.alloc(128)
        pos = block + BLOCK_HEADER_BYTES
        refs = []
        for name in ("INPUT0", "INPUT1"):
            seg.buf[pos : pos + 64] = rng.standard_normal(16).astype(np.float32).tobytes()
            refs.append(TensorRef(name, "FP32", (1, 16), seg.name, pos, 64))
            pos += 64
        reqs.append(
            InferRequest(
                request_id=i + 1,
                reply_to=ReplyTo(Requester.FRONTEND, 0),
                model="add_sub_py",
                version=1,
                batch_size=1,
                inputs=tuple(refs),
                outputs=("OUTPUT0", "OUTPUT1"),
                block=BlockRef(seg.name, block),
                arrival_ns=0,
            )
        )
    to_worker: Decoder[ToWorker] = Decoder(ToWorker)
    answers: Decoder[AnswerBatch | InferResponse] = Decoder(AnswerBatch | InferResponse)
    inside = [0]
    model_execute = backend._execute  # noqa: SLF001 - the model's own execute, timed

    def timed(requests: object) -> object:
        # NOTE: process CPU time, as the total: wall time counts other processes' turns on a
        # loaded machine (and then made "outside" negative).
        t0 = time.process_time_ns()
        try:
            return model_execute(requests)
        finally:
            inside[0] += time.process_time_ns() - t0

    backend._execute = timed  # noqa: SLF001
    best: tuple[float, float] | None = None
    try:
        for _ in range(7):
            inside[0] = 0
            c0 = time.process_time_ns()
            for k in range(args.batches):
                raw = encode(BatchAssign(batch_id=k, requests=tuple(reqs), dispatch_ns=0))
                worker.run_batch(to_worker.decode(raw))
                free_answers(sent, answers, cache)
            n = args.batches * args.per_batch
            total, model_us = (time.process_time_ns() - c0) / n / 1e3, inside[0] / n / 1e3
            if best is None or total < best[0]:
                best = (total, model_us)
    finally:
        worker.close()
        cache.close()
        inputs.close_and_unlink()
        outputs.close_and_unlink()
    assert best is not None
    print(
        f"{args.per_batch} per batch: {best[0]:.2f} µs per request, {best[1]:.2f} in the model's "
        f"execute, {best[0] - best[1]:.2f} outside it (best of 7 x {args.batches} batches)"
    )


if __name__ == "__main__":
    main()
