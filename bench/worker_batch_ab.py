#!/usr/bin/env python3
"""The worker's batch path, hot, in one process per source tree: two trees in alternating rounds.

    python bench/worker_batch_ab.py --a src --b /tmp/base/src --per-batch 8 --rounds 20
    python bench/worker_batch_ab.py --a src --per-batch 4               # one tree alone

Each tree's ``src/`` is imported by a child process of its own (this file run with ``--child``
and that tree first on ``sys.path``), which builds a ``workers.worker.Worker`` over the python
backend running bench/model_repository's add_sub_py (1x16 float32 inputs), as ``worker_hot.py``
does, but with each request as the REQUEST record a frontend writes (``encode_request``, as the
scheduler hands it on inside the ``BatchAssign``), so the decode is the live one. A round is
``--batches`` batches: the ``BatchAssign`` bytes decoded as from the inbox, ``run_batch``, the
answers decoded and their blocks freed as a frontend would. The parent asks the children for
rounds in turn (A B B A ...), so a busy second on this shared machine falls on both alike, and
prints per tree the CPU µs per request (process CPU time of the round, ``time.process_time_ns``
once per round) as the least and the median of its rounds, and the median of B / A per pair.
The harness's own encode, decode and free (~3 µs per request) are in both figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent


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

    sys.path.insert(0, str(BENCH))
    from worker_hot import _spec, free_answers

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
    try:
        for line in sys.stdin:
            if line.strip() != "round":
                break
            c0 = __import__("time").process_time_ns()
            for _ in range(batches):
                worker.run_batch(to_worker.decode(raw))
                free_answers(sent, answers, cache)
            ns = __import__("time").process_time_ns() - c0
            print(ns / (batches * per_batch), flush=True)
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
    try:
        for i in range(args.rounds + 1):  # NOTE: round 0 warms up and is dropped
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for side in order:
                p = procs[side]
                assert p.stdin is not None
                assert p.stdout is not None
                p.stdin.write("round\n")
                p.stdin.flush()
                ns = float(p.stdout.readline())
                if i:
                    got[side].append(ns / 1e3)
    finally:
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.close()
            p.wait(timeout=30)
    for side, src in trees.items():
        v = got[side]
        print(
            f"{side} {src}: {min(v):.2f} µs per request least, {statistics.median(v):.2f} "
            f"median of {len(v)} rounds ({args.per_batch} per batch)"
        )
    if "B" in got:
        ratios = [b / a for a, b in zip(got["A"], got["B"], strict=True)]
        print(f"B / A per round: median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
