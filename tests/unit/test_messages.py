"""Every cross-process message round-trips through ``ipc.recordio.codec`` typed to its channel
union, and a decoder typed to another channel refuses it."""

from __future__ import annotations

import inspect
import typing

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.protocol import control_messages as cm
from triton_mp.ipc.protocol import messages as m
from triton_mp.ipc.protocol import reports as r
from triton_mp.ipc.recordio.codec import Decoder, encode

TENSOR = m.TensorRef("INPUT0", "FP32", (2, 16), "/triton_mp_1_f0_a0", 128, 128)
BLOCK = m.BlockRef("/triton_mp_1_f0_a0", 64)
FRONTEND_1 = m.ReplyTo(m.Requester.FRONTEND, 1)
REQUEST = m.InferRequest(
    request_id=7,
    reply_to=FRONTEND_1,
    model="add_sub",
    version=1,
    batch_size=2,
    inputs=(TENSOR, m.TensorRef("INPUT1", "BYTES", (2,), "/triton_mp_1_f0_a0", 256, 14)),
    outputs=("OUTPUT0", "OUTPUT1"),
    block=BLOCK,
    arrival_ns=123_456_789,
    priority=2,
    timeout_us=5000,
    client_id="req-1",
)


SHM_REGISTERED = m.ShmRegistered(
    frontend_id=1, regions=(m.ShmRegion("in0", "/client_in", 64, 1024, 257, 123456789),)
)
SHM_UNREGISTERED = m.ShmUnregistered(frontend_id=1, names=("in0", "out0"))
SHM_REGISTERED_AWAITED = m.ShmRegistered(
    frontend_id=0,
    regions=(),
    cuda=(m.CudaShmRegion("g", b"\1" * 64, 0, 1024, 3, 987654321),),
    op=7,
)
SHM_UNREGISTERED_AWAITED = m.ShmUnregistered(
    frontend_id=2, names=("in0",), cuda_names=("g",), op=8, region_ids=(513, 258)
)
SHM_APPLIED = m.ShmApplied(frontend_id=1, op=8, in_use=("in0",), taken=("g",))
REQUEST_WITH_SHM = m.InferRequest(
    request_id=9,
    reply_to=m.ReplyTo(m.Requester.FRONTEND, 0),
    model="add_sub",
    version=1,
    batch_size=1,
    inputs=(m.TensorRef("INPUT0", "FP32", (1, 16), "/client_in", 64, 64, region_id=257),),
    outputs=("OUTPUT0", "OUTPUT1"),
    block=BLOCK,
    arrival_ns=1,
    output_regions=(m.OutputRegion("/client_out", 513, 0, 64, "out0"), None),
)


def _stats() -> r.ModelStats:
    st_ = r.ModelStats(name="add_sub", version=1, inference_count=5, execution_count=2)
    st_.success.add(1000, 5)
    st_.batch_stats[4] = r.BatchStats(batch_size=4)
    st_.batch_stats[4].compute_infer.add(300)
    return st_


# one example of every message, with every optional field set somewhere
WIRING = m.InstanceWiring(
    instance_id=3,
    name="add_sub_0_0",
    model="add_sub",
    version=2,
    to_worker_ring="/triton_mp_1_r_s_w3",
    to_worker_wakeup=Wakeup("semaphore", "/triton_mp_1_w3_sem"),
    from_worker_ring="/triton_mp_1_r_w3_s",
)
ENTRY = cm.ModelEntry(
    name="add_sub",
    config=b"\x0a\x07add_sub",
    ready_versions=(1,),
    failed_versions=(2,),
    reason="version 2: broken",
    transition="LOADING",
    version_reasons={2: "broken"},
)

BLS_WORKER = m.BlsWorkerUpdate(
    instance_id=4,
    add_clients=(
        m.BlsClientWiring(
            instance_id=2,
            ring="/triton_mp_1_r_w4_c2",
            wakeup=Wakeup("semaphore", "/triton_mp_1_w2_bls"),
        ),
    ),
    remove_clients=(1,),
    seq=3,
    models={
        "add_sub": m.BlsModel(
            versions=(1, 2), max_batch_size=8, outputs=("OUTPUT0",), decoupled=True
        )
    },
)
BLS_INBOX = m.BlsInboxUpdate(
    add_rings=("/triton_mp_1_r_w5_c2",),
    remove_rings=("/triton_mp_1_r_w1_c2",),
)

EXAMPLES: dict[str, list[object]] = {
    "ToSupervisor": [
        m.LogSettingsUpdate(
            frontend_id=1, info=False, warning=True, error=True, verbose=2, format="ISO8601"
        ),
        cm.ModelLoadCall(
            call_id=1, model="add_sub", config_json='{"max_batch_size": 4}', files={"1/x": b"\0"}
        ),
        cm.ModelUnloadCall(call_id=2, model="add_sub", unload_dependents=True),
        cm.TableAck(seq=3),
    ],
    "FromSupervisor": [
        cm.ControlReply(call_id=1),
        cm.ControlReply(call_id=2, error=m.ErrorInfo(ErrorCode.INTERNAL, "failed", "supervisor")),
        cm.ModelTableUpdate(
            seq=4,
            models=(ENTRY,),
            add_rings=("/triton_mp_1_r_w3_f0",),
            remove_rings=("/triton_mp_1_r_w1_f0",),
            drop_segments=("/triton_mp_1_w1p",),
        ),
    ],
    "ToScheduler": [
        m.LogSettingsUpdate(
            frontend_id=1, info=False, warning=True, error=True, verbose=2, format="ISO8601"
        ),
        m.ReadyQuery(query_id=1, frontend_id=0, model="py", version=1),
        m.WorkerReady(instance_id=1, pid=2, ready_check=True),
        m.InstancesAdded(instances=(WIRING,)),
        m.VersionsActivated(specs=(b"\x91\x01",)),
        m.InstancesRetired(instance_ids=(1, 2)),
        m.InstancesRegrouped(spec=b"\x90"),
        m.InstancesRemoved(instance_ids=(1,)),
        REQUEST,
        REQUEST_WITH_SHM,
        m.DirectSent(
            instance_id=3, batch_id=m.direct_batch_id(1, 7), dispatch_ns=11, request=REQUEST
        ),
        m.InferRequest(
            request_id=0,
            reply_to=m.ReplyTo(m.Requester.BLS, 0),
            model="m",
            version=1,
            batch_size=1,
            inputs=(),
            outputs=(),
            block=BLOCK,
            arrival_ns=0,
        ),
        m.CancelRequest(request_id=7, reply_to=FRONTEND_1, model="add_sub", version=1),
        m.CacheOutcome(
            model="add_sub", version=1, hit=True, cache_ns=900, request_ns=2000, queue_ns=100
        ),
        m.CacheOutcome(model="add_sub", version=1, hit=False, cache_ns=1500),
        m.RequestRefused(model="bytes_py", version=1, request_ns=1200),
        m.StatsQuery(query_id=3, frontend_id=1),
        m.StatsQuery(query_id=4, frontend_id=0, model="add_sub", version=1, since_load=True),
        m.QueueQuery(query_id=5, frontend_id=1),
        m.QueueQuery(query_id=6, frontend_id=0, model="ocr_cls"),
        m.WorkerReady(instance_id=2, pid=4242),
        m.BatchDone(
            instance_id=2,
            batch_id=9,
            start_ns=1,
            compute_input_ns=2,
            compute_infer_ns=3,
            compute_output_ns=4,
            end_ns=5,
            failed=(0, 2),
        ),
        m.BatchDone(
            instance_id=0,
            batch_id=1,
            start_ns=0,
            compute_input_ns=0,
            compute_infer_ns=0,
            compute_output_ns=0,
            end_ns=0,
        ),
        m.DecoupledDone(instance_id=2, reply_to=m.ReplyTo(m.Requester.BLS, 5), request_id=7),
        m.WorkerDied(instance_id=2, exitcode=-9),
        m.Shutdown(),
    ],
    "ToWorker": [
        m.LogSettingsUpdate(
            frontend_id=1, info=False, warning=True, error=True, verbose=2, format="ISO8601"
        ),
        m.ReadyCheck(query_id=1, frontend_id=0),
        BLS_WORKER,
        m.BlsWorkerUpdate(instance_id=0),
        m.BatchAssign(batch_id=9, requests=(REQUEST, REQUEST), dispatch_ns=99),
        m.BatchAssign(batch_id=10, requests=(), dispatch_ns=0),
        m.BatchDue(at_ns=123_456_789),
        m.DropSegments(prefixes=("/triton_mp_1_f0p77_",)),
        m.DropSegments(
            prefixes=("/triton_mp_1_f1p78_",), holder=78, frontend_id=1, requests_below=2**41 + 1
        ),
        m.CancelRequest(
            request_id=7, reply_to=m.ReplyTo(m.Requester.BLS, 3), model="repeat_int32", version=1
        ),
        m.Shutdown(),
    ],
    "ToFrontend": [
        m.LogSettingsUpdate(
            frontend_id=1, info=False, warning=True, error=True, verbose=2, format="ISO8601"
        ),
        m.ReadyFanout(query_id=1, instance_ids=(3, 4)),
        m.InstanceReadiness(query_id=1, instance_id=3, ready=False, message="no"),
        m.InferResponse(
            request_id=7,
            version=1,
            outputs=(m.TensorRef("OUTPUT0", "BYTES", (1,), "/triton_mp_1_w0_a0", 64, 9),),
            block=m.BlockRef("/triton_mp_1_w0_a0", 0),
        ),
        m.InferResponse(
            request_id=8,
            version=1,
            error=m.ErrorInfo(ErrorCode.INTERNAL, "onnxruntime.Fail: boom", "worker add_sub_0"),
        ),
        m.InferResponse(request_id=9, version=1, final=False),
        m.InferResponse(request_id=9, version=1, final=True, empty=True),
        m.AnswerBatch(
            responses=(
                m.InferResponse(
                    request_id=10,
                    version=1,
                    outputs=(m.TensorRef("OUTPUT0", "FP32", (1, 2), "/triton_mp_1_w0_a0", 128, 8),),
                    shared_blocks=(m.BlockRef("/triton_mp_1_w0_a0", 64),),
                ),
                m.InferResponse(
                    request_id=11,
                    version=1,
                    error=m.ErrorInfo(ErrorCode.INTERNAL, "no result", "worker add_sub_0"),
                ),
            ),
            handoffs=(m.Handoff(m.BlockRef("/triton_mp_1_w0_a0", 64), 1),),
        ),
        m.RequestFailed(
            request_id=8, error=m.ErrorInfo(ErrorCode.UNAVAILABLE, "Server is stopping")
        ),
        m.StatsReply(query_id=3, stats=(_stats(), r.ModelStats(name="other", version=2))),
        m.StatsReply(query_id=4, stats=()),
        m.QueueReply(query_id=5, models=()),
        m.QueueReply(
            query_id=6,
            models=(
                r.ModelQueueStatus(
                    model="ocr_cls",
                    version=1,
                    scheduler="dynamic",
                    max_batch_size=32,
                    preferred_batch_sizes=(8, 16, 32),
                    max_queue_delay_us=500,
                    levels=(
                        r.LevelStatus(
                            level=1,
                            depth=3,
                            delayed=1,
                            oldest_age_us=1200,
                            rejected=2,
                            timed_out=4,
                            delayed_total=1,
                        ),
                    ),
                    instances=(
                        r.InstanceStatus(
                            instance_id=0,
                            name="ocr_cls_0_0",
                            live=True,
                            batches_in_flight=1,
                            requests_in_flight=8,
                            batch_size_in_flight=8,
                            executions=10,
                        ),
                    ),
                    batch_sizes={8: 3, 1: 2},
                    close_reasons={"preferred": 3, "delay": 2},
                    recent_batches=(
                        r.BatchRecord(
                            age_us=10,
                            batch_size=8,
                            requests=8,
                            reason="preferred",
                            instance="ocr_cls_0_0",
                        ),
                    ),
                ),
            ),
        ),
        SHM_REGISTERED,
        SHM_UNREGISTERED,
        SHM_REGISTERED_AWAITED,
        SHM_UNREGISTERED_AWAITED,
        SHM_APPLIED,
        m.ModelAvailability(model="add_sub", version=1, ready=False),
        m.TraceSettingUpdate(frontend_id=1, model="add_sub", rate=5, clear_count=True),
        m.InferResponse(
            request_id=4,
            version=1,
            trace=m.TraceRecord(
                stamps=(("QUEUE_START", 5), ("COMPUTE_START", 6)),
                tensors=(m.TensorTrace("TENSOR_BACKEND_OUTPUT", "OUT", "1,2", "2", "INT32"),),
                children=(m.ChildTrace("callee", 1, "r", (("REQUEST_START", 7),)),),
            ),
        ),
    ],
    "ToBlsClient": [
        BLS_INBOX,
        m.BlsInboxUpdate(),
        m.InferResponse(request_id=3, version=2, final=False),
        m.RequestFailed(request_id=4, error=m.ErrorInfo(ErrorCode.NOT_FOUND, "unknown")),
    ],
}
UNIONS = {
    "ToScheduler": m.ToScheduler,
    "ToWorker": m.ToWorker,
    "ToFrontend": m.ToFrontend,
    "ToBlsClient": m.ToBlsClient,
    "ToSupervisor": cm.ToSupervisor,
    "FromSupervisor": cm.FromSupervisor,
}


def _members(union: object) -> set[type]:
    return set(typing.get_args(union))


def _cases() -> list[tuple[str, object]]:
    return [(channel, msg) for channel, msgs in EXAMPLES.items() for msg in msgs]


def _id(case: object) -> str:
    return type(case).__name__ if not isinstance(case, str) else case


def test_every_tagged_message_is_in_a_union_and_has_an_example() -> None:
    tagged = {
        cls
        for module in (m, cm)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, msgspec.Struct) and cls.__struct_config__.tag is not None
    }
    in_unions = set().union(*(_members(u) for u in UNIONS.values()))
    assert tagged == in_unions
    assert in_unions == {type(msg) for _, msg in _cases()}


def test_tags_are_unique_across_unions() -> None:
    tags: dict[object, type] = {}
    for union in UNIONS.values():
        for cls in _members(union):
            tag = cls.__struct_config__.tag
            assert tags.setdefault(tag, cls) is cls, f"tag {tag!r} used twice"


@pytest.mark.parametrize(("channel", "msg"), _cases(), ids=_id)
def test_round_trip_through_its_channel_union(channel: str, msg: object) -> None:
    decoded = Decoder(UNIONS[channel]).decode(encode(msg))
    assert type(decoded) is type(msg)
    assert decoded == msg


@pytest.mark.parametrize(("channel", "msg"), _cases(), ids=_id)
def test_other_channel_unions_refuse_it(channel: str, msg: object) -> None:
    data = encode(msg)
    for union in UNIONS.values():
        if type(msg) in _members(union):
            continue
        with pytest.raises(msgspec.ValidationError):
            Decoder(union).decode(data)


def test_a_reply_address_survives_typed_and_keeps_the_id_spaces_apart() -> None:
    bls = m.ReplyTo(m.Requester.BLS, 1)
    req = msgspec.structs.replace(REQUEST, reply_to=bls)
    decoded = Decoder(m.ToScheduler).decode(encode(req))
    assert isinstance(decoded, m.InferRequest)
    assert decoded.reply_to.kind is m.Requester.BLS
    assert decoded.reply_to == bls != FRONTEND_1
    assert len({(bls, 7), (FRONTEND_1, 7)}) == 2


def test_error_code_survives_as_an_int_enum() -> None:
    info = m.ErrorInfo(ErrorCode.DEADLINE_EXCEEDED, "timeout", "scheduler")
    msg = m.RequestFailed(request_id=1, error=info)
    decoded = Decoder(m.ToFrontend).decode(encode(msg))
    assert isinstance(decoded, m.RequestFailed)
    assert decoded.error.code is ErrorCode.DEADLINE_EXCEEDED


def test_stats_reply_keeps_integer_batch_size_keys() -> None:
    decoded = Decoder(m.ToFrontend).decode(encode(m.StatsReply(query_id=1, stats=(_stats(),))))
    assert isinstance(decoded, m.StatsReply)
    (stats,) = decoded.stats
    assert list(stats.batch_stats) == [4]
    assert stats.batch_stats[4].compute_infer == r.StatDuration(count=1, ns=300)


def test_garbage_is_a_validation_or_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        Decoder(m.ToScheduler).decode(b"\xc1")
    with pytest.raises(msgspec.ValidationError):
        Decoder(m.ToScheduler).decode(encode(["no_such_tag", 1, 2]))


def test_a_field_of_the_wrong_type_is_refused() -> None:
    data = encode(["worker_ready", "not an int", 5])
    with pytest.raises(msgspec.ValidationError, match="Expected `int`"):
        Decoder(m.ToScheduler).decode(data)


# --------------------------------------------------------------------------- property

_names = st.text(min_size=0, max_size=20)
_u63 = st.integers(min_value=0, max_value=2**63 - 1)
_tensor_refs = st.builds(
    m.TensorRef,
    name=_names,
    datatype=st.sampled_from(["FP32", "INT64", "BYTES", "BOOL", "FP16"]),
    shape=st.lists(st.integers(0, 1 << 20), max_size=5).map(tuple),
    segment=_names,
    offset=_u63,
    nbytes=_u63,
)
_requests = st.builds(
    m.InferRequest,
    request_id=_u63,
    reply_to=st.builds(
        m.ReplyTo, kind=st.sampled_from(list(m.Requester)), id=st.integers(0, 1 << 40)
    ),
    model=_names,
    version=st.integers(-1, 1 << 30),
    batch_size=st.integers(0, 1 << 16),
    inputs=st.lists(_tensor_refs, max_size=4).map(tuple),
    outputs=st.lists(_names, max_size=4).map(tuple),
    block=st.builds(m.BlockRef, segment=_names, offset=_u63),
    arrival_ns=_u63,
    priority=st.integers(0, 1 << 20),
    timeout_us=_u63,
    client_id=_names,
)
_errors = st.builds(
    m.ErrorInfo, code=st.sampled_from(list(ErrorCode)), message=st.text(), origin=_names
)


@given(req=_requests)
def test_any_infer_request_round_trips(req: m.InferRequest) -> None:
    assert Decoder(m.ToScheduler).decode(encode(req)) == req
    batch = m.BatchAssign(batch_id=1, requests=(req,), dispatch_ns=req.arrival_ns)
    assert Decoder(m.ToWorker).decode(encode(batch)) == batch


@given(
    request_id=_u63,
    outputs=st.lists(_tensor_refs, max_size=4).map(tuple),
    error=st.none() | _errors,
)
def test_any_infer_response_round_trips(
    request_id: int, outputs: tuple[m.TensorRef, ...], error: m.ErrorInfo | None
) -> None:
    resp = m.InferResponse(request_id=request_id, version=1, outputs=outputs, error=error)
    assert Decoder(m.ToFrontend).decode(encode(resp)) == resp
