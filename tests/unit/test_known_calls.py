"""The handoff's known calls (``frontend.native.known_calls``), without processes: a fake
submit path and arenas; the replies are checked against the ticket path's words and
bytes (``grpc.messages.infer_response_bytes``, ``servicer.grpc_status``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.common.errors import ErrorCode
from triton_mp.frontend.grpc.messages import ResponseHeads
from triton_mp.frontend.grpc.servicer import grpc_status
from triton_mp.frontend.grpc.wire import split_infer_request
from triton_mp.frontend.native.known_calls import KnownCalls
from triton_mp.ipc import TensorRef
from triton_mp.ipc.protocol.messages import ErrorInfo, InferResponse, RequestFailed


@dataclass
class Segment:
    buf: bytearray


@dataclass
class FakePending:
    released: list[InferResponse] = field(default_factory=list)
    copied_bytes: dict[str, int] = field(default_factory=lambda: {"in": 0, "out": 0})

    def release(self, msg: InferResponse) -> None:
        self.released.append(msg)


class FakeCache:
    def __init__(self) -> None:
        self.segments = {"/arena": Segment(bytearray(range(256)))}

    def get(self, name: str) -> Segment:
        return self.segments[name]


class FakeInference:
    """``Inference``'s face for known calls: ``submit_known_to`` takes the keys in
    ``known`` (``decline`` declines them), gives ids from 100, and keeps each sink."""

    def __init__(self) -> None:
        self.pending = FakePending()
        self.cache = FakeCache()
        self.known_keys: set[bytes] = set()
        self.decline = False
        self.sinks: dict[int, Any] = {}
        self.submitted: list[tuple[bytes, str, list[bytes]]] = []
        self.cancelled: list[tuple[int, str, int]] = []
        self.released_at_reply: list[int] = []

    def submit_known_to(self, key: bytes, client_id: str, raw: Any, sink: Any) -> Any:
        if self.decline:
            return None
        self.submitted.append((key, client_id, [bytes(r) for r in raw]))
        rid = 100 + len(self.sinks)
        self.sinks[rid] = sink
        return rid, Model("m"), 3

    def cancel(self, rid: int, model: str, version: int) -> None:
        self.cancelled.append((rid, model, version))


@dataclass(frozen=True)
class Model:
    name: str


class Gate:
    allowed = True

    def known_allowed(self) -> bool:
        return self.allowed


def make() -> tuple[KnownCalls, FakeInference, Gate, list[tuple[int, int, str, bytes]]]:
    inference, gate = FakeInference(), Gate()
    replies: list[tuple[int, int, str, bytes]] = []

    def reply(call_id: int, code: int, details: str, data: Any) -> None:
        # NOTE: as _native.reply, the parts are copied now (``released_at_reply``: how
        # many answers were released by then).
        inference.released_at_reply.append(len(inference.pending.released))
        joined = data if isinstance(data, bytes) else b"".join(data)
        replies.append((call_id, code, details, joined))

    calls = KnownCalls(
        inference,  # type: ignore[arg-type]
        ResponseHeads(),
        gate,
        reply,
    )
    return calls, inference, gate, replies


def request_bytes(rid: str = "r1") -> tuple[bytes, Any]:
    """A ModelInferRequest with two raw inputs, and its split (``request_split.cc``'s)."""
    req = pb.ModelInferRequest(model_name="m", id=rid)
    for name in ("A", "B"):
        t = req.inputs.add(name=name, datatype="INT32")
        t.shape.extend([1, 2])
    req.raw_input_contents.extend([b"\x01" * 8, b"\x02" * 8])
    data = req.SerializeToString()
    wire = split_infer_request(data)
    spans = ((data.index(b"\x01" * 8), 8), (data.index(b"\x02" * 8), 8))
    return data, (b"", wire.key, rid.encode(), spans)


def submitted(rid: str = "r1") -> tuple[KnownCalls, FakeInference, Gate, list[Any], Any]:
    calls, inference, gate, replies = make()
    data, split = request_bytes(rid)
    inference.known_keys.add(split[1])
    assert calls.submit(7, data, split)
    return calls, inference, gate, replies, split


def test_a_known_key_is_submitted_with_its_id_and_raw_inputs() -> None:
    calls, inference, _, replies, split = submitted()
    assert inference.submitted == [(split[1], "r1", [b"\x01" * 8, b"\x02" * 8])]
    assert replies == []
    assert 7 in calls.calls


def test_what_is_not_known_or_not_allowed_is_left_to_the_caller() -> None:
    calls, inference, gate, _ = make()
    data, split = request_bytes()
    assert not calls.submit(1, data, None)  # NOTE: no native split
    assert not calls.submit(1, data, split)  # unknown key
    inference.known_keys.add(split[1])
    gate.allowed = False
    assert not calls.submit(1, data, split)  # tracing or forwarded headers
    gate.allowed = True
    assert not calls.submit(1, data, (split[0], split[1], b"\xff", split[3]))  # not UTF-8
    inference.decline = True
    assert not calls.submit(1, data, split)
    assert inference.submitted == []
    assert calls.calls == {}


def test_an_answer_replies_the_ticket_paths_bytes_and_releases_once() -> None:
    calls, inference, _, replies, _ = submitted()
    outputs = (
        TensorRef("OUT", "INT32", (1, 2), "/arena", 16, 8),
        TensorRef("SHM", "INT32", (1, 2), "client_key", 0, 8, region_id=5),
    )
    answer = InferResponse(request_id=100, version=3, outputs=outputs)
    inference.sinks[100](answer)
    assert len(replies) == 1
    call_id, code, details, data = replies[0]
    assert (call_id, code, details) == (7, 0, "")
    resp = pb.ModelInferResponse.FromString(data)
    assert (resp.model_name, resp.model_version, resp.id) == ("m", "3", "r1")
    assert [o.name for o in resp.outputs] == ["OUT", "SHM"]
    assert list(resp.raw_output_contents) == [bytes(range(16, 24)), b""]
    # NOTE: the output's block (its view is a reply part) is freed after the reply copied it.
    assert inference.released_at_reply == [0]
    assert inference.pending.released == [answer]
    assert inference.pending.copied_bytes["out"] == 8
    assert calls.calls == {}
    inference.sinks[100](answer)  # NOTE: a second answer is freed, not replied
    assert len(replies) == 1
    assert inference.pending.released == [answer, answer]


def test_errors_reply_modelinfers_status() -> None:
    calls, inference, _, replies, _ = submitted()
    error = ErrorInfo(ErrorCode.UNAVAILABLE, "worker died")
    inference.sinks[100](RequestFailed(request_id=100, error=error))
    code, details = grpc_status(ErrorCode.UNAVAILABLE, "worker died")
    assert replies == [(7, int(code.value[0]), details, b"")]
    calls, inference, _, replies, _ = submitted()
    failed = InferResponse(request_id=100, version=3, error=ErrorInfo(ErrorCode.INTERNAL, "x"))
    inference.sinks[100](failed)
    assert replies == [(7, grpc.StatusCode.INTERNAL.value[0], "x", b"")]
    assert inference.pending.released == [failed]


def test_a_response_that_cannot_be_built_replies_unknown_and_still_releases() -> None:
    calls, inference, _, replies, _ = submitted()
    gone = InferResponse(
        request_id=100, version=3, outputs=(TensorRef("O", "INT32", (1,), "/gone", 0, 4),)
    )
    inference.sinks[100](gone)
    assert replies[0][:2] == (7, grpc.StatusCode.UNKNOWN.value[0])
    assert replies[0][2].startswith("Unexpected <class 'KeyError'>")
    assert inference.pending.released == [gone]


def test_a_cancelled_call_asks_the_scheduler_to_drop_it_and_frees_a_late_answer() -> None:
    calls, inference, _, replies, _ = submitted()
    assert calls.cancel(7)
    assert inference.cancelled == [(100, "m", 3)]
    assert not calls.cancel(7)  # NOTE: once
    late = InferResponse(request_id=100, version=3)
    inference.sinks[100](late)
    assert replies == []
    assert inference.pending.released == [late]


def test_an_answered_call_is_not_cancelled() -> None:
    calls, inference, _, replies, _ = submitted()
    inference.sinks[100](InferResponse(request_id=100, version=3))
    assert not calls.cancel(7)
    assert inference.cancelled == []
    assert len(replies) == 1
