#!/usr/bin/env python3
"""CPU µs per push into the frontend's ring to the scheduler, in process, the two ways,
alternated in one run:

- ``python``: ``Ring.push`` (``ipc.memory.ring``), the Python producer before ``SharedRing``;
- ``shared``: ``SharedRing.push`` (``frontend.native.shared_ring``), the push in C++ under the
  lock the gRPC thread shares (``ring_producer.h``).

    python bench/ring_push_cost.py --bytes 360 --rounds 8

A record of ``--bytes`` bytes (360: about an add_sub_py REQUEST record) is pushed ``--pushes``
times per round into a real ring in /dev/shm, the consumer's ``pop_each`` emptying it between
batches of 256 outside the timed region. CPU time of this thread per push, the median over
rounds, and the ratio shared / python.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from triton_mp.frontend.native import shared_ring_attach  # noqa: E402
from triton_mp.ipc.memory.ring import Ring  # noqa: E402
from triton_mp.ipc.memory.shm import unlink_quietly  # noqa: E402

BATCH = 256


def _round(ring: Ring, owner: Ring, record: bytes, pushes: int) -> float:
    """CPU µs per push over ``pushes`` pushes (the pops between batches not counted)."""
    spent = 0
    push = ring.push
    for _ in range(pushes // BATCH):
        start = time.thread_time_ns()
        for _ in range(BATCH):
            push(record)
        spent += time.thread_time_ns() - start
        owner.pop_each(len)
    return spent / (pushes // BATCH * BATCH) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=360)
    ap.add_argument("--pushes", type=int, default=51200)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    attach = shared_ring_attach()
    if attach is None:
        print("the native extension is not built: python setup.py build_ext --inplace")
        return 1
    name = f"/triton_mp_{os.getpid()}_bench_ring"
    owner = Ring.create(name, 1 << 20)
    sides = {"python": Ring.attach(name), "shared": attach(name)}
    record = bytes(range(256)) * (args.bytes // 256) + bytes(args.bytes % 256)
    got: dict[str, list[float]] = {k: [] for k in sides}
    try:
        for i in range(args.rounds):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for k in order:
                got[k].append(_round(sides[k], owner, record, args.pushes))
    finally:
        for ring in sides.values():
            ring.close()
        owner.close()
        unlink_quietly(name)
    med = {k: statistics.median(v) for k, v in got.items()}
    for k, v in got.items():
        print(f"{k:7s} µs/push median {med[k]:.3f}  rounds {' '.join(f'{x:.3f}' for x in v)}")
    print(f"shared / python: {med['shared'] / med['python']:.2f}x  (load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
