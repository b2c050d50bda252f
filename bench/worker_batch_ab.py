#!/usr/bin/env python3
"""The worker's batch path, hot, in one process per source tree: two trees in alternating rounds.

    python bench/worker_batch_ab.py --a src --b /tmp/base/src --per-batch 8 --rounds 20
    python bench/worker_batch_ab.py --a src --per-batch 4               # one tree alone
    python bench/worker_batch_ab.py --a src --b /tmp/base/src --workload id1m_shm

``--workload add_sub`` (the default) is described below. ``id1m`` is bench/model_repository's
identity_py with one 1 MiB FP32 input (262,144 elements) per request, one request per batch
(identity_py does not batch): the input in a frontend's arena, the output written into the
worker's arena, as at bench_vs_triton.py's ``id1m``. ``id1m_shm`` is the same with the input
and the output in two client system shared-memory objects (region ids 1 and 2), as
perf_analyzer's ``--shared-memory system`` sends them (``id1m_shm``): the input is a view of
the client's object and the output is copied into the other one.

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
are in every figure but ``execute``'s. Timing ``execute`` reads the process clock twice per
batch (a system call each, ~1-4 µs on this VM), which weighs on one-request batches:
``--untimed`` leaves it out (and reports 0 inside ``execute``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parent / "model_repository"
MODEL_FILE = REPOSITORY / "add_sub_py/1/model.py"
ID_ELEMENTS = 262_144
"""FP32 elements of an identity workload's tensor by default (1 MiB; ``--id-elements``)."""


def _spec(workload: str = "add_sub") -> tuple[Any, Any, Any]:
    """The workload's model ``ModelVersionSpec``, ``InstanceSpec`` and ``WorkerSpec`` (one
    instance): add_sub_py (dynamic batching up to 64) or identity_py (no batching), from the
    tree on ``sys.path``."""
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

    if workload == "add_sub":
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
    else:
        model = ModelVersionSpec(
            model="identity_py",
            version=1,
            backend="python",
            model_file=str(REPOSITORY / "identity_py/1/model.py"),
            max_batch_size=0,
            batching=BatchingSpec(),
            inputs=(TensorSpec(name="INPUT0", datatype="FP32", dims=(-1,)),),
            outputs=(TensorSpec(name="OUTPUT0", datatype="FP32", dims=(-1,)),),
            instance_ids=(0,),
            config_json=json.dumps({"name": "identity_py", "max_batch_size": 0}),
        )
    name = model.model
    inst = InstanceSpec(instance_id=0, name=f"{name}_0", model=name, version=1)
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


class _RingSender:
    """A frontend's sender as ``workers.answering`` reads it: the ring, a wake-up that posts
    nothing (no consumer here; a live wake-up costs both trees alike)."""

    def __init__(self, ring: Any) -> None:
        self.ring = ring

    def wake(self) -> None:
        pass


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


def _add_sub_requests(inputs: Any, per_batch: int) -> list[Any]:
    """``per_batch`` add_sub_py requests (two 1x16 FP32 inputs each in the ``inputs`` arena)."""
    import numpy as np

    from triton_mp.ipc.protocol.messages import (
        BlockRef,
        InferRequest,
        ReplyTo,
        Requester,
        TensorRef,
    )
    from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES

    rng = np.random.default_rng(0)
    reqs = []
    for i in range(per_batch):
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
    return reqs


IDENTITY_KEPT = 8
"""Distinct identity requests a round cycles through (their inputs and outputs lie in
different memory, as the live server's rotating arenas and perf_analyzer's regions do)."""


def _identity_requests(inputs: Any, shm: bool, keep: list[Any], elements: int) -> list[Any]:
    """``IDENTITY_KEPT`` identity_py requests of one FP32 input of ``elements`` each: in the
    ``inputs`` arena, or (``shm``) in a client object with the output asked into another (the
    objects are appended to ``keep``, to unlink at the end)."""
    import numpy as np

    from triton_mp.ipc.memory.shm import Segment
    from triton_mp.ipc.protocol.messages import (
        BlockRef,
        InferRequest,
        OutputRegion,
        ReplyTo,
        Requester,
        TensorRef,
    )
    from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES

    nbytes = elements * 4
    data = np.arange(elements, dtype=np.float32)
    reqs = []
    for i in range(IDENTITY_KEPT):
        regions: tuple[OutputRegion | None, ...] = ()
        if shm:
            # NOTE: no triton_mp_ prefix: the worker refuses to map a server's own objects.
            key_in, key_out = f"/wbab_{os.getpid()}_{i}_in", f"/wbab_{os.getpid()}_{i}_out"
            objs = [Segment.create(k, nbytes) for k in (key_in, key_out)]
            keep.extend(objs)
            np.frombuffer(objs[0].buf, np.float32)[:] = data
            seg, block = inputs.alloc(64)  # NOTE: the request's (empty) input block
            ref = TensorRef("INPUT0", "FP32", (elements,), key_in, 0, nbytes, 2 * i + 1)
            regions = (OutputRegion(key_out, 2 * i + 2, 0, nbytes, f"out{i}"),)
        else:
            seg, block = inputs.alloc(nbytes)
            pos = block + BLOCK_HEADER_BYTES
            np.ndarray((elements,), np.float32, seg.buf, pos)[:] = data
            ref = TensorRef("INPUT0", "FP32", (elements,), seg.name, pos, nbytes)
        reqs.append(
            InferRequest(
                request_id=i + 1,
                reply_to=ReplyTo(Requester.FRONTEND, 0),
                model="identity_py",
                version=1,
                batch_size=1,
                inputs=(ref,),
                outputs=("OUTPUT0",),
                block=BlockRef(seg.name, block),
                arrival_ns=0,
                output_regions=regions,
            )
        )
    return reqs


def child(workload: str, per_batch: int, batches: int, elements: int, timed: bool) -> None:
    """Serve rounds on stdin ("round" -> CPU ns per request on stdout) until EOF."""
    from triton_mp.backends.python.backend import PythonBackend
    from triton_mp.ipc import encode
    from triton_mp.ipc.memory.ring import Ring
    from triton_mp.ipc.protocol.messages import AnswerBatch, BatchAssign, InferResponse, ToWorker
    from triton_mp.ipc.recordio.codec import Decoder
    from triton_mp.ipc.recordio.request_records import encode_request
    from triton_mp.ipc.tensor_pool import ArenaAllocator, SegmentCache
    from triton_mp.workers.worker import Worker

    pid = os.getpid()
    model, inst, spec = _spec(workload)
    inputs = ArenaAllocator(f"/triton_mp_{pid}_ab_f", 16 << 20, 1 << 26)
    try:  # NOTE: the worker's own output allocator (workers.main), where the tree has it
        from triton_mp.ipc.output_holds import OutputArenas as outputs_type
    except ImportError:
        outputs_type = ArenaAllocator  # type: ignore[assignment,misc,unused-ignore]
    outputs = outputs_type(spec.arena_prefix, spec.arena_bytes, spec.arena_budget_bytes)
    cache = SegmentCache()
    backend = PythonBackend(model, inst)
    sent: list[bytes] = []
    extra: dict[str, Any] = {}
    ring = Ring.create(f"/triton_mp_{pid}_ab_r", 1 << 20)
    if "send_answer" in inspect.signature(Worker).parameters:
        # NOTE: a tree whose worker sends encoded answers (the C answer writer), as
        # workers.main wires it; an older tree's takes every answer as a message. Encoded
        # answers go through a ring (as Sender.send_bytes pushes them, less the wake-up),
        # read back before the blocks are freed.
        extra["send_answer"] = lambda _frontend_id, data: ring.push(data)
    if "frontends" in inspect.signature(Worker).parameters:
        # NOTE: a tree that pushes one frontend's batch from C (workers.answering).
        extra["frontends"] = {0: _RingSender(ring)}
    # NOTE: every message answer goes through the ring too (as Sender.send pushes it, less
    # the wake-up), so a tree answering a single request from C (an AnswerBatch pushed into
    # the ring) and one answering it in Python (an InferResponse) pay the same push and pop.
    worker = Worker(
        spec, backend, outputs, cache, lambda _to, m: ring.push(encode(m)), encode, **extra
    )
    objects: list[Any] = []
    if workload == "add_sub":
        batch_reqs = [_add_sub_requests(inputs, per_batch)]
    else:
        per_batch = 1
        batch_reqs = [
            [r] for r in _identity_requests(inputs, workload == "id1m_shm", objects, elements)
        ]
    raws = [
        encode(BatchAssign(batch_id=0, requests=tuple(map(encode_request, b)), dispatch_ns=0))
        for b in batch_reqs
    ]
    to_worker: Decoder[ToWorker] = Decoder(ToWorker)
    answers: Decoder[AnswerBatch | InferResponse] = Decoder(AnswerBatch | InferResponse)
    inside = _time_execute(backend) if timed else [0]
    try:
        for line in sys.stdin:
            if line.strip() != "round":
                break
            inside[0] = 0
            c0 = time.process_time_ns()
            for i in range(batches):
                worker.run_batch(to_worker.decode(raws[i % len(raws)]))
                sent += ring.pop_all()
                free_answers(sent, answers, cache)
            ns = time.process_time_ns() - c0
            print(ns / (batches * per_batch), inside[0] / (batches * per_batch), flush=True)
    finally:
        worker.close()
        cache.close()
        inputs.close_and_unlink()
        outputs.close_and_unlink()
        for obj in objects:
            obj.unlink()
            obj.close()
        seg = ring.segment
        ring.close()
        seg.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="a tree's src/")
    ap.add_argument("--b", type=Path, help="another tree's src/ (optional)")
    ap.add_argument(
        "--workload", choices=("add_sub", "id1m", "id1m_shm"), default="add_sub", help="see above"
    )
    ap.add_argument(
        "--per-batch", type=int, default=8, help="requests per batch (add_sub; identity: 1)"
    )
    ap.add_argument("--batches", type=int, default=300, help="batches per round")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per tree")
    ap.add_argument(
        "--id-elements", type=int, default=ID_ELEMENTS, help="FP32 elements per identity tensor"
    )
    ap.add_argument("--untimed", action="store_true", help="do not time the model's execute")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.workload, args.per_batch, args.batches, args.id_elements, not args.untimed)
        return 0
    trees = {"A": args.a} if args.b is None else {"A": args.a, "B": args.b}
    procs = {}
    for side, src in trees.items():
        env = {**os.environ, "PYTHONPATH": str(src.resolve())}
        cmd = [sys.executable, __file__, "--child", "--a", str(src)]
        cmd += ["--per-batch", str(args.per_batch), "--batches", str(args.batches)]
        cmd += ["--workload", args.workload, "--id-elements", str(args.id_elements)]
        cmd += ["--untimed"] if args.untimed else []
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
    per_batch = args.per_batch if args.workload == "add_sub" else 1
    for side, src in trees.items():
        v, med_in = got[side], statistics.median(inside[side])
        print(
            f"{side} {src}: {min(v):.2f} µs per request least, {statistics.median(v):.2f} "
            f"median of {len(v)} rounds ({per_batch} per batch); {med_in:.2f} in the "
            f"model's execute, {statistics.median(v) - med_in:.2f} outside it (medians)"
        )
    if "B" in got:
        ratios = [b / a for a, b in zip(got["A"], got["B"], strict=True)]
        print(f"B / A per round: median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
