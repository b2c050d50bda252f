#!/usr/bin/env python3
"""The worker's batch path, hot, in one process per source tree: two trees in alternating rounds.

    python bench/worker_batch_ab.py --a src --b /tmp/base/src --per-batch 8 --rounds 20
    python bench/worker_batch_ab.py --a src --per-batch 4               # one tree alone

Each tree's ``src/`` is imported by a child process of its own (this file run with ``--child``
and that tree first on ``sys.path``), which builds a ``workers.worker.Worker`` over the python
backend running bench/model_repository's add_sub_py (1x16 float32 inputs), with each request as the
REQUEST record a frontend writes (``encode_request``, as the scheduler hands it on inside the
``BatchAssign``), so the decode is the live one. A round is
``--batches`` batches: the ``BatchAssign`` bytes decoded as from the inbox, ``run_batch``, the
answers decoded and their blocks freed as a frontend would. The parent asks the children for
rounds in turn (A B B A ...), so a busy second on this shared machine falls on both alike, and
prints per tree the CPU µs per request (process CPU time of the round, ``time.process_time_ns``
once per round) as the least and the median of its rounds, the part inside the model's own
``execute`` (process CPU time around each call) and the rest, which is what the goal of "worker
per inference outside execute" counts less the cost of each batch paid cold in a live server;
and the median of B / A per pair. The harness's own encode, decode and free (~3 µs per request)
are in every figure but ``execute``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODEL_FILE = Path(__file__).resolve().parent / "model_repository/add_sub_py/1/model.py"


def _spec() -> tuple[Any, Any, Any]:
    """add_sub_py's ``ModelVersionSpec``, ``InstanceSpec`` and ``WorkerSpec`` (one instance,
    dynamic batching up to 64), from the tree on ``sys.path``."""
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

    pid = os.getpid()

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
        inbox=InboxSpec(f"/triton_mp_{pid}_hot_unused", ()),
        to_scheduler=ChannelSpec(f"/triton_mp_{pid}_hot_unused_ring", "unused"),
        to_frontends={},
        arena_prefix=f"/triton_mp_{pid}_hot_w",
        arena_bytes=1 << 22,
        arena_budget_bytes=1 << 26,
        log=LogSpec(),
    )
    return model, inst, spec


def free_answers(sent: list[bytes], answers: Any, cache: Any) -> None:
    """Free the output blocks of the answers the worker ``sent`` (encoded ``AnswerBatch`` or
    ``InferResponse``; ``answers`` their ``Decoder``, ``cache`` a ``SegmentCache``), as a
    frontend would after replying, and empty ``sent``."""
    from triton_mp.ipc.protocol.messages import AnswerBatch
    from triton_mp.ipc.tensor_pool import free_block

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


def _time_execute(backend: Any) -> list[int]:
    """Wrap the python backend's call of the model's ``execute`` so that its process CPU time
    adds up in the returned one-item list (ns; the caller resets it)."""
    inside = [0]
    model_execute = backend._execute  # noqa: SLF001 - the model's own execute, timed

    def timed(requests: object) -> object:
        # NOTE: process CPU time, as the round's: wall time counts other processes' turns
        t0 = time.process_time_ns()
        try:
            return model_execute(requests)
        finally:
            inside[0] += time.process_time_ns() - t0

    backend._execute = timed  # noqa: SLF001
    return inside


def child(per_batch: int, batches: int) -> None:
    """Serve rounds on stdin ("round" -> CPU ns per request on stdout) until EOF."""
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
    from triton_mp.ipc.recordio.codec import Decoder
    from triton_mp.ipc.recordio.request_records import encode_request
    from triton_mp.ipc.tensor_pool import (
        BLOCK_HEADER_BYTES,
        ArenaAllocator,
        SegmentCache,
    )
    from triton_mp.workers.worker import Worker

    pid = os.getpid()
    model, inst, spec = _spec()
    inputs = ArenaAllocator(f"/triton_mp_{pid}_ab_f", 1 << 22, 1 << 26)
    outputs = ArenaAllocator(spec.arena_prefix, spec.arena_bytes, spec.arena_budget_bytes)
    cache = SegmentCache()
    backend = PythonBackend(model, inst)
    sent: list[bytes] = []
    worker = Worker(spec, backend, outputs, cache, lambda _to, m: sent.append(encode(m)), encode)
    rng = np.random.default_rng(0)
    records = []
    for i in range(per_batch):
        seg, block = inputs.alloc(128)
        pos = block + BLOCK_HEADER_BYTES
        refs = []
        for name in ("INPUT0", "INPUT1"):
            seg.buf[pos : pos + 64] = rng.standard_normal(16).astype(np.float32).tobytes()
            refs.append(TensorRef(name, "FP32", (1, 16), seg.name, pos, 64))
            pos += 64
        req = InferRequest(
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
        records.append(encode_request(req))
    to_worker: Decoder[ToWorker] = Decoder(ToWorker)
    answers: Decoder[AnswerBatch | InferResponse] = Decoder(AnswerBatch | InferResponse)
    raw = encode(BatchAssign(batch_id=0, requests=tuple(records), dispatch_ns=0))
    inside = _time_execute(backend)
    try:
        for line in sys.stdin:
            if line.strip() != "round":
                break
            inside[0] = 0
            c0 = time.process_time_ns()
            for _ in range(batches):
                worker.run_batch(to_worker.decode(raw))
                free_answers(sent, answers, cache)
            ns = time.process_time_ns() - c0
            print(ns / (batches * per_batch), inside[0] / (batches * per_batch), flush=True)
    finally:
        worker.close()
        cache.close()
        inputs.close_and_unlink()
        outputs.close_and_unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="a tree's src/")
    ap.add_argument("--b", type=Path, help="another tree's src/ (optional)")
    ap.add_argument("--per-batch", type=int, default=8, help="requests per batch")
    ap.add_argument("--batches", type=int, default=300, help="batches per round")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per tree")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.per_batch, args.batches)
        return 0
    trees = {"A": args.a} if args.b is None else {"A": args.a, "B": args.b}
    procs = {}
    for side, src in trees.items():
        env = {**os.environ, "PYTHONPATH": str(src.resolve())}
        cmd = [sys.executable, __file__, "--child", "--a", str(src)]
        cmd += ["--per-batch", str(args.per_batch), "--batches", str(args.batches)]
        procs[side] = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
    got: dict[str, list[float]] = {side: [] for side in trees}
    inside: dict[str, list[float]] = {side: [] for side in trees}
    try:
        for i in range(args.rounds + 1):  # NOTE: round 0 warms up and is dropped
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for side in order:
                p = procs[side]
                assert p.stdin is not None
                assert p.stdout is not None
                p.stdin.write("round\n")
                p.stdin.flush()
                ns, in_ns = map(float, p.stdout.readline().split())
                if i:
                    got[side].append(ns / 1e3)
                    inside[side].append(in_ns / 1e3)
    finally:
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.close()
            p.wait(timeout=30)
    for side, src in trees.items():
        v, med_in = got[side], statistics.median(inside[side])
        print(
            f"{side} {src}: {min(v):.2f} µs per request least, {statistics.median(v):.2f} "
            f"median of {len(v)} rounds ({args.per_batch} per batch); {med_in:.2f} in the "
            f"model's execute, {statistics.median(v) - med_in:.2f} outside it (medians)"
        )
    if "B" in got:
        ratios = [b / a for a, b in zip(got["A"], got["B"], strict=True)]
        print(f"B / A per round: median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
