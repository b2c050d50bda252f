"""ModelStreamInfer through the native gRPC frontend (handed to the Python stream handler in
process, ``frontend/native/stream_call.cc`` and ``handoff.py``) side by side with
``--grpc-frontend python``: the same stream gets the same messages in the same order and the
same final status from both: request order kept, a decoupled model's many responses, a model's
error under ``triton_grpc_error``, a message that does not parse, an expired deadline, an
empty stream, fuzzed requests; and a client that cancels mid-stream cancels the model's
request."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from hypothesis import given, settings

from tests.e2e.test_fuzz import FUZZ_EXAMPLES, FUZZ_SETTINGS, infer_requests, write_fuzz_models
from tests.e2e.test_grpc_answers import FAIL_CONFIG, FAIL_MODEL
from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import ServerProcess, server_factory
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.native import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    repo = copy_models(tmp_path_factory.mktemp("streams"), "add_sub_py", "repeat_int32", "add_sub")
    # NOTE: the models test_fuzz's requests name (add_sub, echo_py, bytes_py)
    write_fuzz_models(repo)
    write_python_model(repo, "fail", FAIL_CONFIG, FAIL_MODEL)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        # NOTE: the two start side by side
        both = {f: start(repo, "--grpc-frontend", f, wait=False) for f in ("native", "python")}
        for server in both.values():
            server.wait_live()
        yield both


Answer = tuple[list[pb.ModelStreamInferResponse], tuple[str, str]]


def stream(
    url: str,
    messages: list[bytes],
    metadata: tuple[tuple[str, str], ...] = (),
    timeout_s: float = 60.0,
) -> Answer:
    """One ModelStreamInfer: send ``messages`` (serialized, as they are), half-close, and
    read to the end: every response, and the final status (code name, details)."""
    got: list[pb.ModelStreamInferResponse] = []
    with grpc.insecure_channel(url) as channel:
        rpc = channel.stream_stream(
            STREAM, response_deserializer=pb.ModelStreamInferResponse.FromString
        )
        status = ("OK", "")
        try:
            for response in rpc(iter(messages), timeout=timeout_s, metadata=metadata):
                got.append(response)
        except grpc.RpcError as e:
            status = (e.code().name, str(e.details()))
    return got, status


def side_by_side(servers: dict[str, ServerProcess], messages: list[bytes], **kw: object) -> Answer:
    """The same stream to both servers; asserts equal answers and returns native's."""
    native = stream(servers["native"].url, messages, **kw)  # type: ignore[arg-type]
    python = stream(servers["python"].url, messages, **kw)  # type: ignore[arg-type]
    assert native == python
    return native


def add_sub(rid: str, value: float = 1.0) -> bytes:
    """An add_sub_py request (INPUT0, INPUT1: FP32 [1, 16] of ``value``), serialized."""
    req = pb.ModelInferRequest(model_name="add_sub_py", id=rid)
    for name in ("INPUT0", "INPUT1"):
        req.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        req.raw_input_contents.append(np.full(16, value, np.float32).tobytes())
    return bytes(req.SerializeToString())


def repeat(rid: str, values: list[int], delay_ms: int, empty_final: bool = False) -> bytes:
    """A repeat_int32 request: one response per value, each after ``delay_ms``."""
    req = pb.ModelInferRequest(model_name="repeat_int32", id=rid)
    arrays = {
        "IN": np.array(values, np.int32),
        "DELAY": np.full(len(values), delay_ms, np.uint32),
        "WAIT": np.array([0], np.uint32),
    }
    for name, arr in arrays.items():
        dtype = "INT32" if arr.dtype == np.int32 else "UINT32"
        req.inputs.add(name=name, datatype=dtype, shape=list(arr.shape))
        req.raw_input_contents.append(arr.tobytes())
    if empty_final:
        req.parameters["triton_enable_empty_final_response"].bool_param = True
    return bytes(req.SerializeToString())


def fail(rid: str, first: float) -> bytes:
    req = pb.ModelInferRequest(model_name="fail", id=rid)
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    req.raw_input_contents.append(np.array([first, 0, 0, 0], np.float32).tobytes())
    return bytes(req.SerializeToString())


def test_responses_keep_the_request_order(servers: dict[str, ServerProcess]) -> None:
    ids = [str(i) for i in range(60)]
    got, status = side_by_side(servers, [add_sub(i, float(i)) for i in ids])
    assert status == ("OK", "")
    assert [r.infer_response.id for r in got] == ids
    sums = [np.frombuffer(r.infer_response.raw_output_contents[0], np.float32)[0] for r in got]
    assert sums == [2.0 * i for i in range(60)]


def test_a_decoupled_model_answers_many_times(servers: dict[str, ServerProcess]) -> None:
    messages = [repeat("a", list(range(12)), 2, empty_final=True), repeat("b", [7, 8], 1)]
    got, status = stream(servers["native"].url, messages)
    python, python_status = stream(servers["python"].url, messages)
    assert status == python_status == ("OK", "")

    def by_id(answers: list[pb.ModelStreamInferResponse]) -> dict[str, list[bytes]]:
        out: dict[str, list[bytes]] = {}
        for r in answers:
            out.setdefault(r.infer_response.id, []).append(r.SerializeToString())
        return out

    # NOTE: the two requests' responses interleave as they complete; each request's in order
    assert by_id(got) == by_id(python)
    values = [
        int(np.frombuffer(r.infer_response.raw_output_contents[0], np.int32)[0])
        for r in got
        if r.infer_response.id == "a" and r.infer_response.raw_output_contents
    ]
    assert values == list(range(12))
    assert len(by_id(got)["a"]) == 13  # twelve responses and the empty final one


def test_a_model_error_ends_the_stream_with_triton_grpc_error(
    servers: dict[str, ServerProcess],
) -> None:
    header = (("triton_grpc_error", "true"),)
    got, status = side_by_side(servers, [fail("ok", 1), fail("bad", -1)], metadata=header)
    assert [r.infer_response.id for r in got] == ["ok"]
    assert status == ("INTERNAL", "negative input")
    # without the header the error is a message and the stream goes on
    got, status = side_by_side(servers, [fail("bad", -1), fail("ok", 1)])
    assert [(r.error_message, r.infer_response.id) for r in got] == [
        ("negative input", "bad"),
        ("", "ok"),
    ]
    assert status == ("OK", "")


def test_a_message_that_does_not_parse_ends_the_stream(servers: dict[str, ServerProcess]) -> None:
    got, status = side_by_side(servers, [add_sub("1"), b"\x0a\x05ab", add_sub("2")])
    assert [r.infer_response.id for r in got] == ["1"]
    assert status == ("OK", "")


def test_an_empty_stream_ends_at_once(servers: dict[str, ServerProcess]) -> None:
    assert side_by_side(servers, []) == ([], ("OK", ""))


def test_an_expired_deadline_ends_the_stream(servers: dict[str, ServerProcess]) -> None:
    got, status = stream(servers["native"].url, [repeat("d", [1, 2, 3], 500)], timeout_s=0.3)
    assert status[0] == "DEADLINE_EXCEEDED"
    assert stream(servers["native"].url, [add_sub("after")])[1] == ("OK", "")


def test_a_cancelled_stream_cancels_the_models_request(servers: dict[str, ServerProcess]) -> None:
    server = servers["native"]
    first = threading.Event()
    with grpc.insecure_channel(server.url) as channel:
        rpc = channel.stream_stream(
            STREAM, response_deserializer=pb.ModelStreamInferResponse.FromString
        )
        call = rpc(iter([repeat("gone", list(range(40)), 100)]), timeout=60)

        def read() -> None:
            try:
                for _ in call:
                    first.set()
            except grpc.RpcError:
                pass  # NOTE: CANCELLED, the client's own doing

        reader = threading.Thread(target=read)
        reader.start()
        assert first.wait(30)
        call.cancel()
        reader.join(30)
    deadline = time.monotonic() + 30
    while "request 'gone' cancelled after" not in server.log():
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.1)
    line = next(x for x in server.log().splitlines() if "request 'gone' cancelled after" in x)
    assert int(line.split("cancelled after ")[1].split()[0]) < 40
    # the frontend serves on
    assert stream(server.url, [add_sub("after")])[1] == ("OK", "")


def test_fuzzed_requests_in_a_stream_get_pythons_answers(
    servers: dict[str, ServerProcess],
) -> None:
    """test_fuzz's malformed ModelInferRequests, each in a stream before a good request, sent
    to both servers: the same messages (or, with two bad parameters, whose order protobuf
    maps do not fix, the same kinds) and the same status. A quarter of test_fuzz's examples:
    the words are the unary fuzz's (test_native_grpc); this checks the stream carries them."""

    @settings(FUZZ_SETTINGS, max_examples=max(1, FUZZ_EXAMPLES // 4))
    @given(req=infer_requests())
    def one(req: pb.ModelInferRequest) -> None:
        messages = [req.SerializeToString(), add_sub("good")]
        native = stream(servers["native"].url, messages)
        python = stream(servers["python"].url, messages)
        maps = len(req.parameters) + sum(len(t.parameters) for t in [*req.inputs, *req.outputs])
        if maps > 1:
            assert native[1][0] == python[1][0], req
            assert [bool(r.error_message) for r in native[0]] == [
                bool(r.error_message) for r in python[0]
            ], req
        else:
            assert native == python, req

    one()
