#!/usr/bin/env python3
"""The scheduler's Python cost per request and per batch, in-process, without waits.

    python bench/sched_core_cost.py --batch 4 --batches 3000

Replays what the scheduler process does for add_sub_py-like traffic through its real code,
minus the waits: per request, one pass of the loop (decode the ring record, handle it, a
dispatch pass that finds nothing ready, the next deadline); per batch, the pass at the
deadline that forms it (``BatchAssign`` encoded as for the ring), and the pass that takes the
worker's ``BatchDone``. Each pass also asks what the process loop asks before it waits
(``next_deadline_ns``, ``quiet_requests``, ``quiet_done`` and, where the core has it,
``forming``: run a ``git archive`` of another commit's tree to compare). ``--per-pass`` 0
takes a whole batch's requests in one pass (a drain that found them all, handled as the loop
does: ``handle_all``). Prints CPU µs per request
(``time.process_time``), best of ``--repeat``. What this leaves out is the cost of waiting:
spins, polls, sleeps and wake-ups (measure those with pa_run.py's per-role CPU).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.scheduler_harness import Harness, model_spec  # noqa: E402
from triton_mp.ipc.protocol.messages import (  # noqa: E402
    BatchAssign,
    BatchDone,
    BlockRef,
    InferRequest,
    ReplyTo,
    Requester,
    TensorRef,
    ToScheduler,
)
from triton_mp.ipc.protocol.specs import BatchingSpec  # noqa: E402
from triton_mp.ipc.recordio.codec import Decoder, encode  # noqa: E402
from triton_mp.ipc.recordio.records import encode_request  # noqa: E402
from triton_mp.scheduler.core import deliver  # noqa: E402


def run(batch: int, batches: int, per_pass: bool) -> float:
    """CPU µs per request over ``batches`` batches of ``batch`` requests."""
    spec = model_spec(
        "add_sub_py",
        (0, 1),
        max_batch_size=64,
        batching=BatchingSpec(kind="dynamic", max_batch_size=64, max_queue_delay_us=500),
    )
    h = Harness(models=(spec,))
    h.ready(0, 1)
    core = h.core
    decode = Decoder(ToScheduler).decode_buffer
    seg = "/triton_mp_1_f0_a0"
    reply = ReplyTo(Requester.FRONTEND, 0)
    sent: list[object] = []

    def send(item: object) -> None:
        msg = getattr(item, "msg", None)
        if isinstance(msg, BatchAssign):
            sent.append(msg)
            encode(msg)

    records = []
    for i in range(batch):
        req = InferRequest(
            request_id=i,
            reply_to=reply,
            model="add_sub_py",
            version=1,
            batch_size=1,
            inputs=(
                TensorRef("INPUT0", "FP32", (1, 16), seg, 4096 * i + 64, 64),
                TensorRef("INPUT1", "FP32", (1, 16), seg, 4096 * i + 128, 64),
            ),
            outputs=("OUTPUT0", "OUTPUT1"),
            block=BlockRef(seg, 4096 * i),
            arrival_ns=0,
        )
        records.append(encode_request(req) or encode(req))

    forming = getattr(core, "forming", None)  # NOTE: absent before scheduler.forming
    pass_words = getattr(core, "pass_words", None)  # NOTE: absent before scheduler.pass_words

    def end_pass() -> None:
        """What ``scheduler.main._serve`` asks the core before each wait."""
        if pass_words is not None:
            pass_words(1)
            return
        core.next_deadline_ns()
        core.quiet_done(core.quiet_requests())
        if forming is not None:
            forming(1)

    t0 = time.process_time()
    for _ in range(batches):
        now = h.clock.advance_us(1)
        if per_pass:
            for rec in records:
                msg = decode(memoryview(rec))
                deliver(core, core.handle(msg, now), send, now)
                deliver(core, core.dispatch(now), send, now)
                end_pass()
        else:
            msgs = [decode(memoryview(rec)) for rec in records]
            deliver(core, core.handle_all(msgs, now), send, now)
            deliver(core, core.dispatch(now), send, now)
            end_pass()
        now = h.clock.advance_us(600)
        deliver(core, core.dispatch(now), send, now)
        end_pass()
        assign = sent.pop()
        assert isinstance(assign, BatchAssign)
        iid = 0 if core.lifecycle.instances.get(0).batch else 1  # type: ignore[union-attr]
        done = BatchDone(
            instance_id=iid,
            batch_id=assign.batch_id,
            start_ns=now,
            compute_input_ns=1,
            compute_infer_ns=1,
            compute_output_ns=1,
            end_ns=now,
        )
        msg = decode(memoryview(encode(done)))
        deliver(core, core.handle_all((msg,), now), send, now)
        deliver(core, core.dispatch(now), send, now)
        end_pass()
    return (time.process_time() - t0) / (batch * batches) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--batches", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--per-pass", type=int, default=1, help="1: a pass per request")
    args = ap.parse_args()
    best = min(run(args.batch, args.batches, bool(args.per_pass)) for _ in range(args.repeat))
    mode = "a pass per request" if args.per_pass else "one pass per batch"
    print(f"scheduler core: {best:.1f} CPU µs per request, batches of {args.batch}, {mode}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
