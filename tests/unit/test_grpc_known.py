"""gRPC ModelInfer's one pass for known requests (``grpc.wire`` keys, ``servicer.ModelInfer``,
``messages.ResponseHeads``), driven through the servicer with a stand-in call context and the
fakes of ``fake_frontend``: the answers and errors are those of the full path."""

from __future__ import annotations

import asyncio
import types

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError

from tests.unit.fake_frontend import (
    FakeArena,
    FakeCache,
    FakeScheduler,
    FakeSegment,
    FakeWorker,
    model_entry,
    table,
)
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp._proto import model_config_pb2 as mc
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.dispatch.ticket import InferResult
from triton_mp.frontend.grpc.messages import ResponseHeads, infer_response_bytes
from triton_mp.frontend.grpc.servicer import InferenceServicer
from triton_mp.frontend.grpc.wire import MALFORMED, PARSE_FAILURE, split_infer_request
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.frontend.tracing.tracer import Tracer

pytestmark = pytest.mark.timeout(30)


class Aborted(Exception):
    """What the stand-in context raises for ``abort`` (grpc.aio raises too)."""


class Context:
    """The parts of ``grpc.aio.ServicerContext`` ModelInfer uses."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def add_done_callback(self, _callback: object) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise Aborted(code, message)


class Server:
    """A servicer over fakes serving "m": two FP32 [2] inputs, output "OUT"."""

    def __init__(self) -> None:
        segment = FakeSegment("/in")
        self.worker = FakeWorker(FakeSegment("/out"))
        self.cache = cache = FakeCache(segment, self.worker.arena.segment)
        self.pending = PendingTable(cache)  # type: ignore[arg-type]
        self.scheduler = FakeScheduler()
        two = (("A", mc.TYPE_FP32, (2,)), ("B", mc.TYPE_FP32, (2,)))
        self.inference = Inference(
            frontend_id=0,
            models=table(model_entry("m", inputs=two, outputs=("OUT",))),
            shm=SystemShmRegistry(0),
            arena=FakeArena(segment),  # type: ignore[arg-type]
            cache=cache,  # type: ignore[arg-type]
            pending=self.pending,
            send_scheduler=self.scheduler.send,
        )
        api = types.SimpleNamespace(inference=self.inference, tracer=Tracer.off())
        self.servicer = InferenceServicer(api)  # type: ignore[arg-type]

    async def call(self, data: bytes, out: bytes = b"") -> bytes:
        """ModelInfer on serialized ``data``, answered with ``out`` as OUT."""
        request = self.servicer.parse_infer(data)
        task = asyncio.ensure_future(self.servicer.ModelInfer(request, Context()))
        sent = len(self.scheduler.requests())
        while not task.done() and len(self.scheduler.requests()) == sent:
            await asyncio.sleep(0)
        if not task.done():
            self.pending.deliver([self.worker.answer(self.scheduler.requests()[-1], {"OUT": out})])
        return bytes(await task)


def _wire(request_id: str, a: list[float], b: list[float]) -> bytes:
    req = pb.ModelInferRequest(model_name="m", id=request_id)
    req.parameters["priority"].int64_param = 1
    for name in ("A", "B"):
        req.inputs.add(name=name, datatype="FP32", shape=[2])
    req.outputs.add(name="OUT")
    req.raw_input_contents.extend(
        [np.array(a, np.float32).tobytes(), np.array(b, np.float32).tobytes()]
    )
    return req.SerializeToString()


def _expected(request_id: str, out: bytes) -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name="m", model_version="1", id=request_id)
    resp.outputs.add(name="OUT", datatype="FP32", shape=[len(out) // 4])
    resp.raw_output_contents.append(out)
    return resp


def test_the_key_leaves_out_tensor_bytes_and_id_and_parsing_waits_when_known() -> None:
    first = split_infer_request(_wire("one", [1, 2], [3, 4]))
    second = split_infer_request(_wire("two-and-longer", [5, 6], [7, 8]))
    assert first.key is not None
    assert first.key == second.key
    assert (first.client_id, second.client_id) == ("one", "two-and-longer")
    lazy = split_infer_request(_wire("two-and-longer", [5, 6], [7, 8]), {first.key})
    assert lazy.client_id == "two-and-longer"
    assert lazy.request == second.request, "parsed on first use, as the eager parse"
    assert [bytes(v) for v in lazy.raw] == [bytes(v) for v in second.raw]
    no_id = split_infer_request(_wire("", [1, 2], [3, 4]))
    assert (no_id.key, no_id.client_id) == (first.key, "")


def test_an_id_that_is_not_utf8_fails_to_parse_as_before_even_when_its_key_is_known() -> None:
    good = _wire("ab", [1, 2], [3, 4])
    bad = good.replace(b"\x1a\x02ab", b"\x1a\x02\xff\xfe")
    assert bad != good
    known = {split_infer_request(good).key}
    with pytest.raises(DecodeError):
        split_infer_request(bad, known)


def test_a_known_request_is_answered_as_the_full_path_answers() -> None:
    async def body() -> None:
        s = Server()
        out = np.array([9, 8], np.float32).tobytes()
        first = await s.call(_wire("one", [1, 2], [3, 4]), out)
        assert pb.ModelInferResponse.FromString(first) == _expected("one", out)
        assert len(s.inference.known_keys) == 1
        again = await s.call(_wire("two", [5, 6], [7, 8]), out)
        assert pb.ModelInferResponse.FromString(again) == _expected("two", out)
        sent = s.scheduler.requests()
        assert [r.client_id for r in sent] == ["one", "two"]
        assert sent[1].priority == sent[0].priority == 1

    asyncio.run(body())


def test_a_known_key_with_other_byte_sizes_gets_the_full_paths_error() -> None:
    async def body() -> None:
        s = Server()
        await s.call(_wire("one", [1, 2], [3, 4]), b"\0" * 8)
        with pytest.raises(Aborted) as e:
            await s.call(_wire("two", [1, 2, 3], [3, 4]))
        assert e.value.args == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "[request id: two] input byte size mismatch for input 'A' for model 'm'. "
            "Expected 8, got 12",
        )
        assert [r.client_id for r in s.scheduler.requests()] == ["one"]

    asyncio.run(body())


def test_a_request_that_does_not_parse_is_answered_internal() -> None:
    async def body() -> None:
        s = Server()
        with pytest.raises(Aborted) as e:
            await s.servicer.ModelInfer(MALFORMED, Context())
        assert e.value.args == (grpc.StatusCode.INTERNAL, PARSE_FAILURE)

    asyncio.run(body())


def test_response_heads_serialize_as_the_head_built_each_time() -> None:
    s = Server()
    heads = ResponseHeads(capacity=2)
    worker = s.worker
    for rid in ("a", "b", "a", "c"):
        req = types.SimpleNamespace(request_id=1, version=1)
        answer = worker.answer(req, {"OUT": b"\1" * 8, "X": b"\2" * 4})  # type: ignore[arg-type]
        results = [
            InferResult(
                model="m",
                version=1,
                request_id=rid,
                outputs=answer.outputs,
                answer=None,
                cache=s.cache,  # type: ignore[arg-type]
                pending=s.pending,
                parameters_json='{"k": 1}',
            )
            for _ in range(2)
        ]
        assert infer_response_bytes(results[0], heads) == infer_response_bytes(results[1])
        assert len(heads) <= 2


def test_a_request_without_raw_bytes_has_a_key_too() -> None:
    req = pb.ModelInferRequest(model_name="m", id="x")
    t = req.inputs.add(name="A", datatype="FP32", shape=[2])
    t.parameters["shared_memory_region"].string_param = "r"
    t.parameters["shared_memory_byte_size"].int64_param = 8
    data = req.SerializeToString()
    wire = split_infer_request(data)
    assert wire.raw == []
    assert wire.key is not None
    assert wire.key != data, "the id is left out"
    assert wire.request == req
    assert split_infer_request(pb.ModelInferRequest(model_name="m").SerializeToString()).key
