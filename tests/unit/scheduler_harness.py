"""A recording harness around ``SchedulerCore`` for process-free scheduler tests.

Imported by tests only: the core's outbound items are routed per destination as the process
shell (``scheduler.main.Router``) routes them, time comes from a ``FakeClock``, and requests
carry dummy TensorRefs that nothing ever maps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count

from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BatchDone,
    BlockRef,
    InferRequest,
    ReplyTo,
    Requester,
    RequestFailed,
    TensorRef,
    WorkerReady,
)
from triton_mp.ipc.protocol.reports import ModelStats
from triton_mp.ipc.protocol.specs import BatchingSpec, ModelVersionSpec, TensorSpec
from triton_mp.scheduler.core import SchedulerCore, deliver
from triton_mp.scheduler.outbox import (
    Attach,
    Broadcast,
    Detach,
    Free,
    Outbound,
    Reply,
    ToInstance,
    Unmap,
)
from triton_mp.scheduler.policies.clock import FakeClock

US = 1000


def fe(frontend_id: int) -> ReplyTo:
    """The reply address of frontend ``frontend_id``."""
    return ReplyTo(Requester.FRONTEND, frontend_id)


def tensor(name: str, dims: tuple[int, ...]) -> TensorSpec:
    """An FP32 input or output."""
    return TensorSpec(name=name, datatype="FP32", dims=dims)


def model_spec(
    name: str,
    instance_ids: tuple[int, ...],
    *,
    max_batch_size: int = 8,
    batching: BatchingSpec | None = None,
    dims: tuple[int, ...] = (16,),
) -> ModelVersionSpec:
    """Version 1 of an ONNX model with two inputs; dynamic batching (preferred 4, 100 µs)
    unless ``batching`` is given."""
    if batching is None:
        batching = BatchingSpec(
            kind="dynamic",
            max_batch_size=max_batch_size,
            preferred_batch_sizes=(4,),
            max_queue_delay_us=100,
        )
    return ModelVersionSpec(
        model=name,
        version=1,
        backend="onnxruntime",
        model_file=f"/models/{name}/1/model.onnx",
        max_batch_size=max_batch_size,
        batching=batching,
        inputs=(tensor("INPUT0", dims), tensor("INPUT1", dims)),
        outputs=(tensor("OUTPUT0", dims),),
        instance_ids=instance_ids,
    )


DYNAMIC = model_spec("add_sub", (0, 1))
PLAIN = model_spec("plain", (2,), max_batch_size=0, batching=BatchingSpec())
RAGGED = model_spec("ragged", (3,), dims=(-1,))


@dataclass
class Harness:
    """A SchedulerCore whose outbound items are recorded per destination, and a fake clock.

    ``send_worker`` may be replaced to refuse messages as a full-size ring would."""

    models: Sequence[ModelVersionSpec] = (DYNAMIC, PLAIN, RAGGED)
    frontend_ids: tuple[int, ...] = (0,)
    clock: FakeClock = field(default_factory=FakeClock)
    to_workers: list[tuple[int, object]] = field(default_factory=list)
    to_frontends: list[tuple[int, object]] = field(default_factory=list)
    to_bls: list[tuple[int, object]] = field(default_factory=list)
    wiring: list[object] = field(default_factory=list)
    freed: list[object] = field(default_factory=list)
    """Blocks the scheduler freed (``outbox.Free``: an ensemble step's outputs)."""
    ids: count[int] = field(default_factory=lambda: count(1))

    def __post_init__(self) -> None:
        self.core = SchedulerCore(tuple(self.models))
        self.send_worker: Callable[[int, object], None] = lambda i, m: self.to_workers.append(
            (i, m)
        )

    def send(self, item: Outbound) -> None:
        if isinstance(item, ToInstance):
            self.send_worker(item.instance_id, item.msg)
        elif isinstance(item, Reply):
            to = self.to_frontends if item.to.kind is Requester.FRONTEND else self.to_bls
            to.append((item.to.id, item.msg))
        elif isinstance(item, Broadcast):
            self.to_frontends.extend((f, item.msg) for f in self.frontend_ids)
        elif isinstance(item, Free):
            self.freed.append(item.block)
        else:
            assert isinstance(item, Attach | Detach | Unmap)
            self.wiring.append(item)

    def deliver(self, items: list[Outbound]) -> None:
        deliver(self.core, items, self.send, self.now)

    @property
    def now(self) -> int:
        return self.clock.now_ns()

    def request(
        self,
        model: str = "add_sub",
        batch_size: int = 1,
        *,
        frontend_id: int = 0,
        width: int = 16,
        version: int = 1,
        priority: int = 0,
        timeout_us: int = 0,
        client_id: str = "",
        sequence_id: int | str = 0,
        sequence_flags: int = 0,
        reply_to: ReplyTo | None = None,
    ) -> InferRequest:
        rid = next(self.ids)
        shape = (batch_size, width)
        seg = f"/triton_mp_0_f{frontend_id}_a0"
        nbytes = 4 * batch_size * width
        req = InferRequest(
            request_id=rid,
            reply_to=reply_to or fe(frontend_id),
            model=model,
            version=version,
            batch_size=batch_size,
            inputs=(
                TensorRef("INPUT0", "FP32", shape, seg, 64 * rid, nbytes),
                TensorRef("INPUT1", "FP32", shape, seg, 64 * rid + nbytes, nbytes),
            ),
            outputs=("OUTPUT0",),
            block=BlockRef(seg, 64 * rid - 64),
            arrival_ns=self.now - 10 * US,
            priority=priority,
            timeout_us=timeout_us,
            client_id=client_id,
            sequence_id=sequence_id,
            sequence_flags=sequence_flags,
        )
        self.deliver(self.core.handle(req, self.now))
        return req

    def handle(self, msg: object) -> None:
        self.deliver(self.core.handle(msg, self.now))  # type: ignore[arg-type]

    def dispatch(self) -> list[tuple[int, BatchAssign]]:
        before = len(self.to_workers)
        self.deliver(self.core.dispatch(self.now))
        # NOTE: a pass may also tell retired instances to stop (Shutdown).
        return [(i, m) for i, m in self.to_workers[before:] if isinstance(m, BatchAssign)]

    def ready(self, *instance_ids: int) -> None:
        for i in instance_ids:
            self.handle(WorkerReady(instance_id=i, pid=1000 + i))

    def done(self, instance_id: int, batch: BatchAssign, failed: tuple[int, ...] = ()) -> None:
        self.handle(
            BatchDone(
                instance_id=instance_id,
                batch_id=batch.batch_id,
                start_ns=self.now,
                compute_input_ns=1 * US,
                compute_infer_ns=5 * US,
                compute_output_ns=2 * US,
                end_ns=self.now + 8 * US,
                failed=failed,
            )
        )

    def failures(self) -> list[tuple[int, RequestFailed]]:
        return [(f, m) for f, m in self.to_frontends if isinstance(m, RequestFailed)]

    def stats(self, model: str) -> ModelStats:
        (st,) = self.core.stats.snapshot(model, 1)
        return st
