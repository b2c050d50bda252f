#!/usr/bin/env python3
"""CPU µs per known request for its raw entries to reach the input block, in process, the
two ways the native frontend has had, alternated in one run:

- ``bytes``: the message copied out of gRPC's slices into a bytes (what ``take()`` gave
  before 098bf07), then each entry copied from it into the block (``write_known`` on
  memoryviews);
- ``in slices``: each entry copied straight from the slices into the block
  (``write_known`` on ``InBuffers``, ``_native.Received.copy_into``).

    python bench/copy_in_cost.py --mib 1 --slice-kib 16 --rounds 6

The message is a ModelInferRequest with one FP32 input of ``--mib`` MiB, handed to
``_native.call_request`` in slices of ``--slice-kib`` KiB (what gRPC's HTTP/2 frames give);
one message serves every request (its slices are only read). The block comes from a real
``ArenaAllocator`` in /dev/shm and is freed after each request, as the worker frees it.
Only the frontend's user-space work is measured (no socket, no kernel copy): CPU time of
this thread over ``--requests`` requests per round, the median over rounds, and its ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import numpy as np  # noqa: E402

from triton_mp._proto import grpc_service_pb2 as pb  # noqa: E402
from triton_mp.frontend.dispatch.known_requests import (  # noqa: E402
    InBuffers,
    KnownRequest,
    write_known,
)
from triton_mp.frontend.native import _NATIVE  # noqa: E402
from triton_mp.ipc.tensor_pool import ArenaAllocator, align, free_block  # noqa: E402


def message(nbytes: int) -> bytes:
    """A serialized identity_py request with ``nbytes`` of FP32 input."""
    req = pb.ModelInferRequest(model_name="identity_py", id="r")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[nbytes // 4])
    req.raw_input_contents.append(np.ones(nbytes // 4, np.float32).tobytes())
    return bytes(req.SerializeToString())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=1.0)
    ap.add_argument("--slice-kib", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=400)
    args = ap.parse_args()
    if _NATIVE is None:
        print("the native extension is not built", file=sys.stderr)
        return 1
    nbytes = int(args.mib * (1 << 20)) // 4 * 4
    data = message(nbytes)
    step = args.slice_kib * 1024
    parts = [data[i : i + step] for i in range(0, len(data), step)]
    known = KnownRequest(
        model=None,  # type: ignore[arg-type]
        valid=None,  # type: ignore[arg-type]
        inputs=(("INPUT0", "FP32", (nbytes // 4,), nbytes),),
        sizes=(nbytes,),
        block_bytes=align(nbytes),
    )
    arena = ArenaAllocator(f"/copy_in_cost_{os.getpid()}", 8 * align(nbytes), 64 * align(nbytes))
    # NOTE: one message for every request (its slices are only read)
    received, split = _NATIVE.call_request(parts)

    def by_bytes() -> None:
        whole = memoryview(received.tobytes())
        block, _ = write_known(arena, known, [whole[at : at + n] for at, n in split[3]])
        free_block(next(s for s in arena.segments() if s.name == block.segment), block)

    def in_slices() -> None:
        block, _ = write_known(arena, known, InBuffers(received, split[3]))
        free_block(next(s for s in arena.segments() if s.name == block.segment), block)

    ways = {"bytes": by_bytes, "in slices": in_slices}
    results: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for r in range(args.rounds):
            order = list(ways) if r % 2 == 0 else list(ways)[::-1]
            for name in order:
                for _ in range(20):
                    ways[name]()  # NOTE: warm the arena and the allocator
                t = time.thread_time()
                for _ in range(args.requests):
                    ways[name]()
                results[name].append((time.thread_time() - t) / args.requests * 1e6)
    finally:
        arena.close_and_unlink()
    print(f"{len(data)} bytes in {len(parts)} slices, {args.rounds} rounds x {args.requests}")
    for name, values in results.items():
        print(f"  {name:10s} µs/request: {[round(v, 1) for v in values]}")
    base = statistics.median(results["bytes"])
    new = statistics.median(results["in slices"])
    print(f"median: bytes {base:.1f}, in slices {new:.1f} µs/request; ratio {new / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
