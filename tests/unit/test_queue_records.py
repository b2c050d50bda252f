"""The scheduler's plain request lane (``scheduler.plain_requests``): which generations are
plain, and the C ``queue_records`` (``scheduler/native/queue_records.cc``) against its
Python twin over random drains (hypothesis), the way ``test_request_header_native`` fuzzes
the header reader: the same index returned, the same ``Queued`` items (field by field, the
same record as payload), the same queue counts and versions."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.scheduler_harness import US, Harness, fe, model_spec
from triton_mp.ipc.protocol.messages import (
    BatchDone,
    BlockRef,
    InferRequest,
    ReplyTo,
    Requester,
    Shutdown,
    TensorRef,
)
from triton_mp.ipc.protocol.specs import BatchingSpec, ModelVersionSpec, QueuePolicySpec
from triton_mp.ipc.recordio.records import RequestRecord, encode_request
from triton_mp.scheduler import plain_requests
from triton_mp.scheduler.instances import Generation
from triton_mp.scheduler.plain_requests import plain_queue, queue_records_py
from triton_mp.scheduler.policies.policy import Queued
from triton_mp.scheduler.registry import make_policy

native = plain_requests.native
needs_native = pytest.mark.skipif(native is None, reason="_queue_records not built")

DYNAMIC = model_spec("dyn", (0, 1))
DEFAULT = model_spec("solo", (2,), max_batch_size=0, batching=BatchingSpec())
LEVELS = model_spec(
    "levels",
    (3,),
    batching=BatchingSpec(kind="dynamic", max_batch_size=8, priority_levels=2),
)
TIMEOUT = model_spec(
    "timeout",
    (4,),
    batching=BatchingSpec(
        kind="dynamic",
        max_batch_size=8,
        default_queue_policy=QueuePolicySpec(default_timeout_us=100),
    ),
)
CAPPED = model_spec(
    "capped",
    (5,),
    batching=BatchingSpec(
        kind="dynamic", max_batch_size=8, default_queue_policy=QueuePolicySpec(max_queue_size=3)
    ),
)
RAGGED = model_spec("ragged", (6,), dims=(-1,))
SPECS = (DYNAMIC, DEFAULT, LEVELS, TIMEOUT, CAPPED, RAGGED)
PLAIN_MODELS = {"dyn", "solo"}
NOW = 5_000_000


def _generation(spec: ModelVersionSpec) -> Generation:
    gen = Generation(spec, make_policy(spec), spec.enforced_inputs, spec.has_optional_inputs)
    gen.plain = plain_queue(gen)
    return gen


def _world() -> dict[Any, Generation]:
    return {(s.model, s.version): _generation(s) for s in SPECS}


def test_plain_generations_are_the_ones_offer_only_appends_to() -> None:
    world = _world()
    assert {k[0] for k, g in world.items() if g.plain is not None} == PLAIN_MODELS
    ensemble = msgspec.structs.replace(DYNAMIC, batching=BatchingSpec(kind="ensemble"))
    assert plain_queue(Generation(ensemble, make_policy(ensemble))) is None


_RAW = encode_request(
    InferRequest(
        request_id=1,
        reply_to=fe(0),
        model="dyn",
        version=1,
        batch_size=1,
        inputs=(TensorRef("INPUT0", "FP32", (1, 16), "/triton_mp_0_f0_a0", 64, 64),),
        outputs=("OUTPUT0",),
        block=BlockRef("/triton_mp_0_f0_a0", 0),
        arrival_ns=1,
    )
)
"""A record's bytes (only its repr reads them here)."""
_U64 = st.integers(0, 2**64 - 1)
_records = st.builds(
    RequestRecord,
    st.just(_RAW),
    _U64,
    st.builds(ReplyTo, st.sampled_from(list(Requester)), st.integers(0, 3)),
    st.sampled_from(["dyn", "solo", "levels", "timeout", "capped", "ragged", "nope"]),
    st.sampled_from([1, 1, 1, 2]),
    st.one_of(st.integers(-3, 70), st.just(2**64 - 1)),
    st.one_of(st.integers(-1, NOW + 10), st.sampled_from([0, NOW, NOW + 1, 2**64 - 1])),
    st.integers(0, 3),
    st.integers(0, 1000),
    _U64,
    st.one_of(st.integers(0, 3), st.just(2**70)),
)
_messages = st.lists(st.one_of(_records, _records, _records, st.just("other")), max_size=30)


def _fields(item: Queued) -> tuple[Any, ...]:
    return (
        item.key, item.batch_size, item.shape_key, item.enqueue_ns, id(item.payload),
        item.priority, item.timeout_us, item.level, item.deadline_ns, item.delayed,
        item.corrid, item.starts, item.ends,
    )  # fmt: skip


def _state(world: dict[Any, Generation]) -> list[Any]:
    out = []
    for key, gen in sorted(world.items()):
        queue = gen.policy.queue  # type: ignore[attr-defined]
        out.append((key, len(queue), queue.version, [_fields(q) for q in queue]))
    return out


def _run(fn: Any, msgs: list[Any], world: dict[Any, Generation], now: int) -> list[int]:
    """Every stop of ``fn`` over ``msgs``, the stopping message skipped, as a core would."""
    stops, i = [], 0
    while i < len(msgs):
        i = fn(msgs, i, world, now)
        stops.append(i)
        i += 1
    return stops


@needs_native
@settings(max_examples=300, deadline=None)
@given(msgs=_messages, now=st.sampled_from([NOW, 0, 2**64 - 1]))
def test_native_queue_records_equals_its_python_twin(msgs: list[Any], now: int) -> None:
    ours, twins = _world(), _world()
    assert _run(native.queue_records, msgs, ours, now) == _run(queue_records_py, msgs, twins, now)
    assert _state(ours) == _state(twins)


@needs_native
def test_native_queue_records_refuses_what_it_cannot_take() -> None:
    with pytest.raises(TypeError):
        native.queue_records((), 0, {}, NOW)
    with pytest.raises(ValueError, match="start"):
        native.queue_records([], -1, {}, NOW)


def test_the_core_queues_plain_records_as_its_handlers_do() -> None:
    """Through ``SchedulerCore.handle_all`` (the lane in use): a plain model's records
    queue and batch as before, with a request of a non-plain model and a control message
    between them."""
    h = Harness()
    h.ready(0, 1, 2, 3)
    rec = RequestRecord(_RAW, 7, fe(0), "add_sub", 1, 1, h.now, 0, 0, 0, 0)
    assert h.core.lifecycle.active[("add_sub", 1)].plain is not None
    h.deliver(list(h.core.handle_all([rec], h.now)))
    assert h.core.lifecycle.active[("add_sub", 1)].policy.queue_depth() == 1
    h.clock.advance_us(100 * US // 1000)
    batches = h.dispatch()
    assert [[r for r in b.requests] for _, b in batches] == [[_RAW]]


_STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("drain"),
            st.lists(
                st.tuples(
                    st.sampled_from(["add_sub", "add_sub", "plain", "ragged", "nope"]),
                    st.sampled_from([1, 1, 2]),
                    st.integers(0, 2),
                    st.integers(0, 3),
                    st.booleans(),
                ),
                max_size=8,
            ),
        ),
        st.tuples(st.just("advance"), st.integers(1, 150)),
        st.tuples(st.just("dispatch"), st.just(0)),
        st.tuples(st.just("done"), st.integers(0, 3)),
        st.tuples(st.just("stop"), st.just(0)),
    ),
    max_size=25,
)


def _lane_off(msgs: list[Any], start: int, active: Any, now_ns: int) -> int:
    return start


@settings(max_examples=150, deadline=None)
@given(steps=_STEPS)
def test_the_core_sends_the_same_with_the_lane_as_without_it(steps: list[Any]) -> None:
    """Random drains of request records (plain and not, unknown versions, a ``BatchDone``
    or a ``Shutdown`` among them), clock steps and dispatch passes through two cores, one
    queueing plain records through ``queue_records`` (C where built), one through
    ``_on_request`` only: every message either sends is the same, in the same order."""
    import triton_mp.scheduler.core as core_module  # noqa: PLC0415 (the lane's global)

    lane = core_module.queue_records
    sides = [Harness(), Harness()]
    for h in sides:
        h.ready(0, 1, 2, 3)
    ids = iter(range(1, 10_000))
    for kind, arg in steps:
        if kind == "drain":
            msgs: list[Any] = []
            for model, size, age, flags, done_first in arg:
                now = sides[0].now
                if done_first:
                    msgs.append("done")
                msgs.append((model, size, now - age * 50 * US, flags, next(ids)))
        for i, h in enumerate(sides):
            core_module.queue_records = lane if i == 0 else _lane_off
            try:
                _step(h, kind, arg, msgs if kind == "drain" else [])
            finally:
                core_module.queue_records = lane
    assert sides[0].to_workers == sides[1].to_workers
    assert sides[0].to_frontends == sides[1].to_frontends


def _step(h: Harness, kind: str, arg: Any, msgs: list[Any]) -> None:
    if kind == "advance":
        h.clock.advance_us(arg)
    elif kind == "dispatch":
        h.dispatch()
    elif kind == "done":
        running = h.core.lifecycle.instances.get(arg)
        if running is not None and running.batch is not None:
            h.handle(_done(h, arg, running.batch.batch_id))
    elif kind == "stop":
        h.handle(Shutdown())
    else:
        drained: list[Any] = []
        for m in msgs:
            if m == "done":
                busy = [i for i in h.core.lifecycle.instances if i.batch is not None]
                if busy:
                    inst = min(busy, key=lambda i: i.instance_id)
                    drained.append(_done(h, inst.instance_id, inst.batch.batch_id))
                continue
            model, size, arrival, flags, rid = m
            drained.append(RequestRecord(_RAW, rid, fe(0), model, 1, size, arrival, 0, 0, 0, flags))
        h.deliver(list(h.core.handle_all(drained, h.now)))


def _done(h: Harness, instance_id: int, batch_id: int) -> BatchDone:
    return BatchDone(
        instance_id=instance_id,
        batch_id=batch_id,
        start_ns=h.now,
        compute_input_ns=US,
        compute_infer_ns=US,
        compute_output_ns=US,
        end_ns=h.now + 3 * US,
    )
