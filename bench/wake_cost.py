"""The VM's cross-process wake-up cost: how long after a producer's post a sleeping consumer
runs, against a consumer that polls shared memory (issue 34's c=1 hops).

One producer process and one consumer process. Each sample, the producer waits a random
0.5-2 ms (so the consumer's vCPU goes idle, as at c=1), stores ``time.monotonic_ns()`` in a
shared page and then, for the sleeping consumer, writes one byte to a FIFO the consumer
blocks on in ``epoll`` (the frontend's wake-up: ``ipc.memory.notify``'s fifo kind). The
consumer stamps when it runs again; the latency is its stamp minus the producer's. For the
polling consumer, the producer only stores the stamp, and the consumer polls the page with
``sched_yield`` between polls (``frontend.dispatch.polling_loop``'s early poll,
``ipc.channel.Inbox.poll``). Prints p50 / p90 / p99 in µs for each and the consumer's CPU
per sample.

Third, the timed sleep that ends the scheduler's wait before a batching deadline
(``scheduler.policies.clock.WakeLead``): one process sleeps on a POSIX semaphore for a random
300-600 µs with the scheduler's timer slack (``SCHEDULER_TIMER_SLACK_NS``), between random
pauses, and prints how late the sleep ended (p50 / p90 / p99).

    python bench/wake_cost.py [--samples 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import random
import select
import struct
import time

_STAMP = struct.Struct("<qq")
"""The shared page: (sequence number, producer's CLOCK_MONOTONIC ns)."""


def _consumer(page: mmap.mmap, rfd: int, samples: int, polling: bool, out: int) -> None:
    ep = select.epoll()
    ep.register(rfd, select.EPOLLIN)
    lat: list[int] = []
    seen = 0
    cpu0 = time.process_time_ns()
    # NOTE: bytes written while the consumer is late are read together: count by sequence.
    while seen < samples:
        if polling:
            while True:
                seq, stamp = _STAMP.unpack_from(page, 0)
                if seq != seen:
                    break
                os.sched_yield()
        else:
            ep.poll()
            now = time.monotonic_ns()
            os.read(rfd, 64)
            seq, stamp = _STAMP.unpack_from(page, 0)
            lat.append(now - stamp)
            seen = seq
            continue
        lat.append(time.monotonic_ns() - stamp)
        seen = seq
    cpu = time.process_time_ns() - cpu0
    os.write(out, struct.pack(f"<qq{len(lat)}q", cpu, len(lat), *lat))


def _run(samples: int, polling: bool) -> tuple[list[int], int]:
    """One consumer kind; returns (latencies in ns, consumer CPU ns)."""
    page = mmap.mmap(-1, mmap.PAGESIZE)
    rfd, wfd = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _consumer(page, rfd, samples, polling, res_w)
        finally:
            os._exit(0)
    time.sleep(0.05)
    for seq in range(1, samples + 1):
        time.sleep(random.uniform(0.0005, 0.002))
        # NOTE: the stamp before the sequence number (x86 keeps the stores' order): a
        # consumer that sees the new number reads this stamp.
        struct.pack_into("<q", page, 8, time.monotonic_ns())
        struct.pack_into("<q", page, 0, seq)
        if not polling:
            os.write(wfd, b"\0")
    os.close(res_w)
    data = b""
    while chunk := os.read(res_r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    cpu, n = struct.unpack_from("<qq", data)
    lat = struct.unpack_from(f"<{n}q", data, 16)
    return sorted(lat), cpu


def _timed_sleep_lateness(samples: int) -> list[int]:
    """How late (ns) ``samples`` timed semaphore waits of 300-600 µs ended, sorted."""
    import sys
    from pathlib import Path

    import posix_ipc

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

    from triton_mp.common.process.platform import set_timer_slack_ns
    from triton_mp.scheduler.policies.clock import SCHEDULER_TIMER_SLACK_NS

    set_timer_slack_ns(SCHEDULER_TIMER_SLACK_NS)
    sem = posix_ipc.Semaphore(None, posix_ipc.O_CREX)
    late: list[int] = []
    try:
        for _ in range(samples):
            timeout_ns = random.randrange(300_000, 600_000)
            t0 = time.monotonic_ns()
            with contextlib.suppress(posix_ipc.BusyError):
                sem.acquire(timeout_ns / 1e9)
            late.append(time.monotonic_ns() - t0 - timeout_ns)
            time.sleep(random.uniform(0.0002, 0.001))
    finally:
        sem.unlink()
    return sorted(late)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2000)
    a = ap.parse_args()
    for name, polling in (("sleeping on a FIFO (epoll)", False), ("polling shared memory", True)):
        lat, cpu = _run(a.samples, polling)
        n = len(lat)
        p = [lat[int(n * q)] / 1e3 for q in (0.5, 0.9, 0.99)]
        print(
            f"{name:28s} wake-up latency p50 {p[0]:6.1f} µs  p90 {p[1]:6.1f}  p99 {p[2]:7.1f};"
            f" consumer CPU {cpu / a.samples / 1e3:7.1f} µs per sample ({n} wake-ups)"
        )
    late = _timed_sleep_lateness(a.samples)
    n = len(late)
    p = [late[int(n * q)] / 1e3 for q in (0.5, 0.9, 0.99)]
    print(
        f"{'timed semaphore sleep':28s} ends late by  p50 {p[0]:6.1f} µs  p90 {p[1]:6.1f}"
        f"  p99 {p[2]:7.1f} (the scheduler's timer slack; WakeLead's samples)"
    )


if __name__ == "__main__":
    main()
