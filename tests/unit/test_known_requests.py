"""Known requests (``frontend.dispatch.known_requests``, ``Inference.submit_known``): a request that
passed once is sent again straight from its raw bytes, and everything that could make a
later one differ takes the full path. No process: the fakes of ``fake_frontend``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import numpy as np
import pytest

from tests.unit.fake_frontend import (
    FakeArena,
    FakeCache,
    FakeScheduler,
    FakeSegment,
    FakeWorker,
    model_entry,
    ring_full,
    table,
)
from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.common.trace_config import TraceLevel
from triton_mp.frontend.dispatch.known_requests import InBuffers, KnownRequests, known_request
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.grpc.wire import _encode_varint as varint
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.native import _NATIVE
from triton_mp.frontend.request import (
    InferenceRequest,
    InputTensor,
    Parameter,
    RequestedOutput,
    int64_parameter,
    string_parameter,
)
from triton_mp.frontend.shm.system import Region, SystemShmRegistry
from triton_mp.frontend.tracing.tracer import Trace
from triton_mp.frontend.validation.request import validate_request
from triton_mp.ipc.memory.ring import RecordTooLarge

pytestmark = pytest.mark.timeout(30)

KEY = b"wire-key"


class Frontend:
    """An ``Inference`` over fakes serving "m" (two FP32 [2] inputs) and "b" (a BYTES one)."""

    def __init__(self) -> None:
        self.input_segment = FakeSegment("/in")
        self.arena = FakeArena(self.input_segment)
        self.worker = FakeWorker(FakeSegment("/out"))
        cache = FakeCache(self.input_segment, self.worker.arena.segment)
        self.pending = PendingTable(cache)  # type: ignore[arg-type]
        self.scheduler = FakeScheduler()
        self.shm = SystemShmRegistry(1)
        two = (("A", mc.TYPE_FP32, (2,)), ("B", mc.TYPE_FP32, (2,)))
        self.models = table(
            model_entry("m", inputs=two, outputs=("OUT",)),
            model_entry("b", inputs=(("S", mc.TYPE_STRING, (1,)),)),
            model_entry("o", inputs=two, outputs=("OUT",), preserve_ordering=True),
        )
        self.inference = Inference(
            frontend_id=1,
            models=self.models,
            shm=self.shm,
            arena=self.arena,  # type: ignore[arg-type]
            cache=cache,  # type: ignore[arg-type]
            pending=self.pending,
            send_scheduler=self.scheduler.send,
            clock_ns=lambda: 7,
        )


def _raw(*values: float) -> bytes:
    return np.array(values, np.float32).tobytes()


def _request(**kw: object) -> InferenceRequest:
    fields: dict[str, object] = {
        "model_name": "m",
        "id": "first",
        "inputs": (InputTensor("A", "FP32", (2,)), InputTensor("B", "FP32", (2,))),
        "outputs": (RequestedOutput("OUT"),),
        "raw_inputs": (_raw(1, 2), _raw(3, 4)),
        "parameters": {"priority": int64_parameter(2), "note": string_parameter("x")},
    }
    fields.update(kw)
    return InferenceRequest(**fields)  # type: ignore[arg-type]


def _run(body: Callable[[Frontend], Awaitable[None]]) -> None:
    async def main() -> None:
        await body(Frontend())

    asyncio.run(main())


def test_a_known_request_of_a_form_sent_before_sends_its_patched_record() -> None:
    async def body(f: Frontend) -> None:
        f.inference.submit(_request(), known_key=KEY)
        sent = []
        for values in ((5, 6, 7, 8), (1, 1, 2, 2), (3, 3, 4, 4)):
            raw = [_raw(*values[:2]), _raw(*values[2:])]
            assert f.inference.submit_known(KEY, "again", raw) is not None
            sent.append(f.scheduler.requests()[-1])
            written = [
                bytes(f.input_segment.buf[r.offset : r.offset + r.nbytes]) for r in sent[-1].inputs
            ]
            assert written == raw
        # NOTE: the first "again" was encoded and kept as the form's template; the others
        # are patched from it: each its own id, block and input offsets, the rest the same.
        assert len({r.request_id for r in sent}) == 3
        assert len({r.block for r in sent}) == 3
        for r in sent[1:]:
            same = msgspec.structs.replace(r, request_id=0, block=sent[0].block, inputs=())
            assert same == msgspec.structs.replace(sent[0], request_id=0, inputs=())
            assert [i.offset for i in r.inputs] != [i.offset for i in sent[0].inputs]
            assert [msgspec.structs.replace(i, offset=0) for i in r.inputs] == [
                msgspec.structs.replace(i, offset=0) for i in sent[0].inputs
            ]

    _run(body)


def test_an_ordered_model_takes_the_known_path_only_in_a_task() -> None:
    """preserve_ordering: answers leave the pending table in request order, and a call
    answered from the ticket's callback would reply before the calls awaiting theirs in a
    task (a loop pass later), so the callback path is declined for such a model."""

    async def body(f: Frontend) -> None:
        f.inference.submit(_request(model_name="o"), known_key=KEY)
        raw = [_raw(5, 6), _raw(7, 8)]
        assert f.inference.submit_known(KEY, "cb", raw, in_task=False) is None
        assert f.inference.submit_known(KEY, "task", raw) is not None
        f.inference.submit(_request(), known_key=b"m-key")
        assert f.inference.submit_known(b"m-key", "cb", raw, in_task=False) is not None

    _run(body)


def test_a_known_request_sends_what_the_full_path_sends() -> None:
    async def body(f: Frontend) -> None:
        assert f.inference.submit_known(KEY, "x", [_raw(1, 2), _raw(3, 4)]) is None
        f.inference.submit(_request(), known_key=KEY)
        full = f.scheduler.requests()[-1]
        assert KEY in f.inference.known_keys
        ticket = f.inference.submit_known(KEY, "second", [_raw(5, 6), _raw(7, 8)])
        assert ticket is not None
        fast = f.scheduler.requests()[-1]
        assert fast.request_id == full.request_id + 1
        assert fast.client_id == "second"
        assert fast.block != full.block
        same = ("reply_to", "model", "version", "batch_size", "outputs", "arrival_ns")
        same += ("priority", "timeout_us", "parameters_json", "sequence_id", "trace")
        for name in same:
            assert getattr(fast, name) == getattr(full, name), name
        for a, b in zip(fast.inputs, full.inputs, strict=True):
            assert (a.name, a.datatype, a.shape, a.nbytes) == (
                b.name,
                b.datatype,
                b.shape,
                b.nbytes,
            )
        written = [bytes(f.input_segment.buf[r.offset : r.offset + r.nbytes]) for r in fast.inputs]
        assert written == [_raw(5, 6), _raw(7, 8)]
        out = _raw(9, 9)
        f.pending.deliver([f.worker.answer(fast, {"OUT": out})])
        result = await ticket.result()
        assert (result.model, result.version, result.request_id) == ("m", 1, "second")
        assert result.data(result.outputs[0]) == out
        result.release()
        assert f.arena.live_blocks() == 1, "the first request's block waits for its answer"
        assert f.pending.copied_bytes["in"] == 32

    _run(body)


def test_what_its_key_does_not_show_takes_the_full_path() -> None:
    async def body(f: Frontend) -> None:
        f.inference.submit(_request(), known_key=KEY)
        sent = len(f.scheduler.sent)
        assert f.inference.submit_known(KEY, "", [_raw(1, 2, 3), _raw(3, 4)]) is None
        assert f.inference.submit_known(KEY, "", [_raw(1, 2)]) is None
        assert len(f.scheduler.sent) == sent
        assert f.arena.live_blocks() == 1
        # the full path then answers with the full path's words
        with pytest.raises(InvalidRequest) as e:
            f.inference.submit(_request(raw_inputs=(_raw(1, 2, 3), _raw(3, 4))), known_key=KEY)
        assert e.value.message == (
            "[request id: first] input byte size mismatch for input 'A' for model 'm'. "
            "Expected 8, got 12"
        )
        # a surplus entry is ignored, as on the full path
        assert f.inference.submit_known(KEY, "", [_raw(1, 2), _raw(3, 4), b"zz"]) is not None

    _run(body)


def test_a_reload_or_the_drain_declines_a_known_request() -> None:
    async def body(f: Frontend) -> None:
        f.inference.submit(_request(), known_key=KEY)
        f.models.update((model_entry("m"),))
        assert f.inference.submit_known(KEY, "", [_raw(1, 2), _raw(3, 4)]) is None
        assert KEY not in f.inference.known_keys, "an entry for an old model is dropped"
        g = Frontend()
        g.inference.submit(_request(), known_key=KEY)
        g.inference.start_draining()
        assert g.inference.submit_known(KEY, "", [_raw(1, 2), _raw(3, 4)]) is None

    _run(body)


@pytest.mark.parametrize(
    "change",
    [
        {"headers": (("x-h", "v"),)},
        {"parameters": {"sequence_id": int64_parameter(5)}},
        {
            "inputs": (
                InputTensor("A", "FP32", (2,), contents={"fp32_contents": [1.0, 2.0]}),
                InputTensor("B", "FP32", (2,), contents={"fp32_contents": [3.0, 4.0]}),
            ),
            "raw_inputs": (),
        },
        {"outputs": (RequestedOutput("OUT", {"classification": int64_parameter(1)}),)},
    ],
    ids=["headers", "sequence", "typed contents", "classification"],
)
def test_requests_whose_key_may_not_decide_are_not_kept(change: dict[str, object]) -> None:
    async def body(f: Frontend) -> None:
        f.inference.submit(_request(**change), known_key=KEY)
        assert KEY not in f.inference.known_keys

    _run(body)


def test_traced_bytes_and_failed_requests_are_not_kept() -> None:
    async def body(f: Frontend) -> None:
        trace = Trace(1, None, "m", "first", TraceLevel.TIMESTAMPS)  # type: ignore[arg-type]
        f.inference.submit(_request(), known_key=KEY, trace=trace)
        assert KEY not in f.inference.known_keys
        strings = _request(
            model_name="b",
            inputs=(InputTensor("S", "BYTES", (1,)),),
            outputs=(),
            raw_inputs=(b"\x01\x00\x00\x00z",),
        )
        f.inference.submit(strings, known_key=KEY)
        assert KEY not in f.inference.known_keys
        with pytest.raises(InvalidRequest):
            f.inference.submit(_request(outputs=(RequestedOutput("NOPE"),)), known_key=KEY)
        assert KEY not in f.inference.known_keys
        assert len(f.inference.known_keys) == 0

    _run(body)


def test_the_table_is_cleared_whole_when_full() -> None:
    f = Frontend()
    req = _request()
    model = f.models.get("m")
    entry = known_request(req, validate_request(req, model, 1))
    assert entry is not None
    assert (entry.sizes, entry.block_bytes) == ((8, 8), 128)
    known = KnownRequests(capacity=2)
    known.put(b"a", entry)
    known.put(b"b", entry)
    known.put(b"c", entry)
    assert len(known) == 1
    assert b"c" in known
    assert known.get(b"a") is None


def _in_region(**kw: object) -> InferenceRequest:
    """Input A and output OUT in region "r" (B sent raw)."""

    def window(offset: int, size: int) -> dict[str, Parameter]:
        return {
            "shared_memory_region": string_parameter("r"),
            "shared_memory_offset": int64_parameter(offset),
            "shared_memory_byte_size": int64_parameter(size),
        }

    return _request(
        inputs=(InputTensor("A", "FP32", (2,), window(0, 8)), InputTensor("B", "FP32", (2,))),
        outputs=(RequestedOutput("OUT", window(64, 8)),),
        raw_inputs=(_raw(3, 4),),
        **kw,
    )


def test_a_request_in_shared_memory_holds_its_regions_until_answered() -> None:
    async def body(f: Frontend) -> None:
        f.shm.add([Region("r", "/client_r", 0, 4096, 77)])
        f.inference.submit(_in_region(), known_key=KEY)
        full = f.scheduler.requests()[-1]
        assert KEY in f.inference.known_keys
        ticket = f.inference.submit_known(KEY, "second", [_raw(5, 6)])
        assert ticket is not None
        fast = f.scheduler.requests()[-1]
        assert fast.inputs[0] == full.inputs[0], "the window, named as the full path names it"
        assert fast.inputs[0].region_id == 77
        assert fast.output_regions == full.output_regions
        assert fast.output_regions[0] is not None
        written = fast.inputs[1]
        assert bytes(f.input_segment.buf[written.offset : written.offset + 8]) == _raw(5, 6)
        for req in (full, fast):
            f.pending.deliver([f.worker.answer(req, {"OUT": b"\0" * 8})])
            assert f.shm.in_use("r") is (req is full)
        (await ticket.result()).release()
        assert not f.shm.in_use("r")

    _run(body)


def test_a_registration_or_unregistration_makes_requests_in_regions_unknown_again() -> None:
    async def body(f: Frontend) -> None:
        f.shm.add([Region("r", "/client_r", 0, 4096, 77)])
        f.inference.submit(_in_region(), known_key=KEY)
        f.inference.submit(_request(), known_key=b"raw only")
        f.pending.deliver([f.worker.answer(r, {"OUT": b"\0" * 8}) for r in f.scheduler.requests()])
        f.shm.drop(["r"])
        f.shm.add([Region("r", "/client_r", 0, 4096, 78)])
        assert f.inference.submit_known(KEY, "", [_raw(5, 6)]) is None
        assert len(f.inference.known_keys) == 1
        assert f.inference.submit_known(b"raw only", "", [_raw(1, 2), _raw(3, 4)]) is not None
        f.inference.submit(_in_region(), known_key=KEY)
        assert f.scheduler.requests()[-1].inputs[0].region_id == 78

    _run(body)


def test_a_call_answered_from_its_sink_sends_the_patched_record_and_undoes_a_refusal() -> None:
    """``submit_known_to`` (the native handoff's known calls): the first call of a form is
    encoded, later ones are its patched template (the fast lane); each is registered with
    its sink, counted, and a ring that refuses it leaves nothing registered or allocated."""

    async def body(f: Frontend) -> None:
        f.inference.submit(_request(), known_key=KEY)
        answers: list[object] = []
        sent = []
        for values in ((5, 6, 7, 8), (1, 1, 2, 2)):
            raw = [_raw(*values[:2]), _raw(*values[2:])]
            got = f.inference.submit_known_to(KEY, "cb", raw, answers.append)
            assert got is not None
            rid, model, version = got
            req = f.scheduler.requests()[-1]
            assert (req.request_id, req.model, req.version) == (rid, model.name, version)
            assert (req.client_id, req.priority, req.arrival_ns) == ("cb", 2, 7)
            written = [
                bytes(f.input_segment.buf[r.offset : r.offset + r.nbytes]) for r in req.inputs
            ]
            assert written == raw
            sent.append(req)
        assert msgspec.structs.replace(sent[1], request_id=0, block=sent[0].block, inputs=()) == (
            msgspec.structs.replace(sent[0], request_id=0, inputs=())
        )
        assert f.pending.copied_bytes["in"] == 16 * 3
        f.pending.deliver([f.worker.answer(sent[1], {"OUT": _raw(9, 9)})])
        assert len(answers) == 1
        assert answers[0].request_id == sent[1].request_id  # type: ignore[attr-defined]
        f.pending.release(answers[0])  # type: ignore[arg-type]
        live, pending = f.arena.live_blocks(), len(f.pending)
        f.scheduler.refuse = RecordTooLarge("too big")
        with pytest.raises(InvalidRequest) as big:
            f.inference.submit_known_to(KEY, "cb", [_raw(1, 2), _raw(3, 4)], answers.append)
        assert big.value.message.startswith("[request id: cb] request of ")
        f.scheduler.refuse = ring_full()
        with pytest.raises(TritonMPError) as full:
            f.inference.submit_known_to(KEY, "cb", [_raw(1, 2), _raw(3, 4)], answers.append)
        assert full.value.code == ErrorCode.UNAVAILABLE
        assert (f.arena.live_blocks(), len(f.pending)) == (live, pending)

    _run(body)


class _Received:
    """``_native.Received``'s part ``write_known`` uses, over bytes (process-free)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.copies = 0

    def tobytes(self) -> bytes:
        return self.data

    def copy_into(self, dst: memoryview, places: Sequence[tuple[int, int, int]]) -> None:
        self.copies += 1
        for at, offset, n in places:
            dst[at : at + n] = self.data[offset : offset + n]


def _received(*entries: bytes) -> tuple[_Received, list[tuple[int, int]]]:
    """A message holding ``entries`` (raw_input_contents) between two other fields, and
    their spans."""
    data, spans = b"\x0a\x04head", []
    for e in entries:
        data += b"\x3a" + varint(len(e))
        spans.append((len(data), len(e)))
        data += e
    return _Received(data + b"\x12\x04tail"), spans


@pytest.mark.parametrize("native", [False, True], ids=["fake", "native"])
def test_raw_entries_still_received_are_copied_from_there(native: bool) -> None:
    """``InBuffers``: a known request's entries copied from the message as received
    straight into the block (one ``copy_into`` for all), each at its input's aligned
    offset; wrong sizes decline before a block is taken; a surplus entry is ignored."""
    if native and _NATIVE is None:
        pytest.skip("native extension not built")

    def made(*entries: bytes) -> InBuffers:
        message, spans = _received(*entries)
        if not native:
            return InBuffers(message, spans)
        assert _NATIVE is not None
        # NOTE: a Received only past RECEIVED_MIN_RAW_BYTES: a large surplus entry after
        # them; two slices, cut inside the first entry
        n = _NATIVE.RECEIVED_MIN_RAW_BYTES
        data = message.data + b"\x3a" + varint(n) + bytes(n)
        cut = spans[0][0] + 3
        received, split = _NATIVE.call_request([data[:cut], data[cut:]])
        assert isinstance(received, _NATIVE.Received)
        assert list(split[3][: len(entries)]) == spans
        return InBuffers(received, spans)

    async def body(f: Frontend) -> None:
        f.inference.submit(_request(), known_key=KEY)
        got: list[object] = []
        sent = f.inference.submit_known_to(KEY, "in", made(_raw(5, 6), _raw(7, 8)), got.append)
        assert sent is not None
        fast = f.scheduler.requests()[-1]
        written = [bytes(f.input_segment.buf[r.offset : r.offset + r.nbytes]) for r in fast.inputs]
        assert written == [_raw(5, 6), _raw(7, 8)]
        assert [r.offset % 64 for r in fast.inputs] == [0, 0]
        assert f.pending.copied_bytes["in"] == 32
        blocks = f.arena.live_blocks()
        assert (
            f.inference.submit_known_to(KEY, "", made(_raw(1, 2, 3), _raw(3, 4)), got.append)
            is None
        )
        assert f.inference.submit_known_to(KEY, "", made(_raw(1, 2)), got.append) is None
        assert f.arena.live_blocks() == blocks
        surplus = made(_raw(1, 2), _raw(3, 4), b"zz")
        assert f.inference.submit_known_to(KEY, "", surplus, got.append) is not None
        written = [
            bytes(f.input_segment.buf[r.offset : r.offset + r.nbytes])
            for r in f.scheduler.requests()[-1].inputs
        ]
        assert written == [_raw(1, 2), _raw(3, 4)]

    _run(body)
