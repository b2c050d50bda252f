"""The native gRPC frontend (``--grpc-frontend native``, ``frontend.native``) end to end:
it owns the public port, hands ModelInfer and ModelStreamInfer to the Python handlers in
process and every other call to the Python frontend as it came, so answers and errors are
word for word those of ``--grpc-frontend python``: run side by side here on the same bad
requests (unknown model, wrong shape, raw contents that disagree with the shape, truncated
bytes, an expired deadline), plus ModelStreamInfer of a decoupled model, a client that goes
away mid-stream, and the fallback where the extension is absent. Streams side by side:
``test_native_grpc_streams``."""

from __future__ import annotations

import queue
import random
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import given
from tritonclient.utils import InferenceServerException

from tests.e2e.test_fuzz import FUZZ_SETTINGS, infer_requests, write_fuzz_models
from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import REPO_ROOT, ServerProcess, counted, server_factory, wait_for
from tests.helpers.worker_arenas import live_output_blocks
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.native import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = copy_models(tmp_path_factory.mktemp("native"), "add_sub_py", "repeat_int32", "add_sub")
    # NOTE: the models test_fuzz's requests name (infer_requests draws add_sub, echo_py, bytes_py)
    write_fuzz_models(repo)
    write_python_model(repo, "slow_py", SLOW_CONFIG, SLOW_MODEL)
    write_python_model(repo, "slow_batched_py", SLOW_BATCHED_CONFIG, SLOW_BATCHED_MODEL)
    shutil.copytree(REPO_ROOT / "bench" / "model_repository" / "identity_py", repo / "identity_py")
    return repo


@pytest.fixture(scope="module")
def servers(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        # NOTE: the two start side by side
        both = {f: start(repo, "--grpc-frontend", f, wait=False) for f in ("native", "python")}
        for server in both.values():
            server.wait_live()
        yield both


def _add_sub_request(**changes: Any) -> bytes:
    """A ModelInferRequest for add_sub_py (INPUT0, INPUT1: FP32 [1, 16]), serialized."""
    req = pb.ModelInferRequest(model_name=changes.get("model", "add_sub_py"))
    shape = changes.get("shape", [1, 16])
    for name in ("INPUT0", "INPUT1"):
        req.inputs.add(name=name, datatype="FP32", shape=shape)
        req.raw_input_contents.append(np.ones(changes.get("count", 16), np.float32).tobytes())
    return bytes(req.SerializeToString())


BAD_REQUESTS = {
    "unknown model": _add_sub_request(model="nope"),
    "wrong shape": _add_sub_request(shape=[1, 15], count=15),
    "raw contents disagree with shape": _add_sub_request(count=15),
    "truncated message": _add_sub_request()[:-7],
    "not a message": b"\x0a\x05ab",
}


def _call(url: str, body: bytes, timeout_s: float | None = 30.0) -> tuple[str, str, bytes]:
    """(status code name, details, response bytes) of a raw ModelInfer call."""
    with grpc.insecure_channel(url) as channel:
        infer = channel.unary_unary(INFER)
        try:
            out = infer(body, timeout=timeout_s, metadata=(("my-header", "x"),))
        except grpc.RpcError as e:
            return e.code().name, str(e.details()), b""
    return "OK", "", bytes(out)


def test_native_server_owns_the_port(servers: dict[str, ServerProcess]) -> None:
    assert "(native)" in servers["native"].log()
    assert "(native)" not in servers["python"].log()


def test_infer_answers_as_python_does(servers: dict[str, ServerProcess]) -> None:
    native = _call(servers["native"].url, _add_sub_request())
    python = _call(servers["python"].url, _add_sub_request())
    assert native[0] == "OK"
    assert pb.ModelInferResponse.FromString(native[2]) == pb.ModelInferResponse.FromString(
        python[2]
    )
    out = pb.ModelInferResponse.FromString(native[2])
    assert np.frombuffer(out.raw_output_contents[0], np.float32).tolist() == [2.0] * 16


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_requests_get_pythons_words(servers: dict[str, ServerProcess], case: str) -> None:
    native = _call(servers["native"].url, BAD_REQUESTS[case])
    python = _call(servers["python"].url, BAD_REQUESTS[case])
    assert native[0] != "OK"
    assert native == python


def _maps(req: pb.ModelInferRequest) -> int:
    """How many parameters the request's maps hold (request's and tensors')."""
    tensors = [*req.inputs, *req.outputs]
    return len(req.parameters) + sum(len(t.parameters) for t in tensors)


def test_fuzzed_requests_get_pythons_answers(servers: dict[str, ServerProcess]) -> None:
    """test_fuzz's malformed ModelInferRequests, each sent to both servers: the same status
    code and words, or the same response."""

    @FUZZ_SETTINGS
    @given(req=infer_requests())
    def one(req: pb.ModelInferRequest) -> None:
        body = req.SerializeToString()
        native = _call(servers["native"].url, body, timeout_s=60)
        python = _call(servers["python"].url, body, timeout_s=60)
        if native[0] == python[0] == "OK":
            assert pb.ModelInferResponse.FromString(native[2]) == (
                pb.ModelInferResponse.FromString(python[2])
            )
        elif _maps(req) > 1:
            # NOTE: with two bad parameters the Python side names whichever its map yields
            # first, and protobuf map order differs between processes: the code must agree.
            assert native[0] == python[0], req
        else:
            assert native[:2] == python[:2], req

    one()


def test_an_expired_deadline_reaches_python(servers: dict[str, ServerProcess]) -> None:
    # NOTE: a model slower than the deadline (SLOW_MODEL sleeps 1 s): gRPC rounds deadlines up
    # to the millisecond, and add_sub_py's answer can come back within one (1e-6 s passed once).
    req = pb.ModelInferRequest(model_name="slow_py")
    req.inputs.add(name="IN", datatype="INT32", shape=[1])
    req.raw_input_contents.append(np.ones(1, np.int32).tobytes())
    for name in ("native", "python"):
        answer = _call(servers[name].url, req.SerializeToString(), timeout_s=0.2)
        assert answer[0] == "DEADLINE_EXCEEDED", (name, answer)
    assert _call(servers["native"].url, _add_sub_request())[0] == "OK"


def test_known_requests_answer_as_python_does(servers: dict[str, ServerProcess]) -> None:
    """tritonclient sends the same request (its key) again and again, each with its own
    inputs and id: from the second on the native side answers it without the handler
    (``frontend.native.known_calls``), in the same bytes, and with the model's errors."""
    answers: dict[str, list[Any]] = {}
    for name in ("native", "python"):
        client = grpcclient.InferenceServerClient(servers[name].url)
        try:
            got = answers[name] = []
            for i in range(6):
                inputs = []
                for tensor in ("INPUT0", "INPUT1"):
                    inp = grpcclient.InferInput(tensor, [1, 16], "FP32")
                    inp.set_data_from_numpy(np.full((1, 16), i + len(tensor), np.float32))
                    inputs.append(inp)
                result = client.infer("add_sub_py", inputs, request_id=f"r{i % 2}")
                got.append(result.get_response(as_json=True))
        finally:
            client.close()
    assert answers["native"] == answers["python"]
    assert answers["native"][5]["id"] == "r1"
    wrong = _add_sub_request(count=15)  # NOTE: the known key with the wrong byte size
    for _ in range(2):
        assert _call(servers["native"].url, _add_sub_request())[0] == "OK"
        assert _call(servers["native"].url, wrong) == _call(servers["python"].url, wrong)


def test_known_large_tensors_come_back_whole(servers: dict[str, ServerProcess]) -> None:
    """identity_py at 1 MiB, three times with the same key (the second and third answered
    by ``known_calls``, the output copied from the worker's arena straight into the reply,
    ``_native.reply``'s parts): each answer is its own request's tensor, byte for byte."""
    client = grpcclient.InferenceServerClient(servers["native"].url)
    try:
        for seed in range(3):
            x = np.random.default_rng(seed).standard_normal(1 << 18, dtype=np.float32)
            inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            result = client.infer("identity_py", [inp], request_id=f"big{seed}")
            assert result.get_response().id == f"big{seed}"
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    finally:
        client.close()


def test_a_known_request_past_its_deadline_is_cancelled(servers: dict[str, ServerProcess]) -> None:
    """The second slow request is known: its deadline ends the call natively, and the
    frontend drops it (``KnownCall.cancel``) and frees its late answer."""
    req = pb.ModelInferRequest(model_name="slow_py")
    req.inputs.add(name="IN", datatype="INT32", shape=[1])
    req.raw_input_contents.append(np.ones(1, np.int32).tobytes())
    for _ in range(3):
        answer = _call(servers["native"].url, req.SerializeToString(), timeout_s=0.2)
        assert answer[0] == "DEADLINE_EXCEEDED", answer
    time.sleep(1.5)  # NOTE: the late answers arrive and are freed
    assert _call(servers["native"].url, _add_sub_request())[0] == "OK"
    log = servers["native"].log()
    assert "Traceback" not in log
    assert "refused to free" not in log


_KNOWN_SAMPLE = re.compile(
    r'^triton_mp_frontend_native_known_calls_total\{outcome="(\w+)"\} (\S+)$', re.M
)


def _known_counts(server: ServerProcess) -> dict[str, float]:
    """The native gRPC thread's known calls by outcome (``GET /metrics``)."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    return {m[1]: float(m[2]) for m in _KNOWN_SAMPLE.finditer(text)}


def test_known_calls_are_sent_natively_until_an_event_unteaches_them(
    servers: dict[str, ServerProcess],
) -> None:
    """From the fourth call of a key and id on, the gRPC thread submits the call itself
    (``known_submit.h``: counted as sent), each answer still its own request's; a trace
    settings update un-teaches it: the next call goes the Python way (which teaches it
    again), the one after is sent natively again. Another id (or none) is the same lesson,
    sent natively with its own id; another byte size is Python's."""
    server = servers["native"]
    client = grpcclient.InferenceServerClient(server.url)

    def infer(value: float, rid: str = "nk") -> None:
        inputs = []
        for tensor, v in (("INPUT0", value), ("INPUT1", 1.0)):
            inp = grpcclient.InferInput(tensor, [1, 16], "FP32")
            inp.set_data_from_numpy(np.full((1, 16), v, np.float32))
            inputs.append(inp)
        result = client.infer("add_sub_py", inputs, request_id=rid)
        assert result.get_response().id == rid
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), value + 1))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.full((1, 16), value - 1))

    try:
        # NOTE: the full way (its key is kept), the Python lane (its record template is
        # kept), the Python lane patching the template (taught), then natively.
        for i in range(3):
            infer(i)
        before = _known_counts(server)
        for i in range(3, 13):
            infer(i)
        after = _known_counts(server)
        assert after["sent"] - before["sent"] == 10
        infer(13, rid="other")  # NOTE: another id: the same lesson, its own id written in
        infer(14, rid="")
        assert _known_counts(server)["sent"] == after["sent"] + 2
        client.update_trace_settings(model_name="add_sub_py", settings={"trace_rate": "1000"})
        mid = _known_counts(server)
        assert mid["cleared"] > after["cleared"]
        infer(20)
        assert _known_counts(server)["sent"] == mid["sent"]
        infer(21)
        assert _known_counts(server)["sent"] == mid["sent"] + 1
    finally:
        client.close()
    short = _add_sub_request(count=15)  # NOTE: the known key with the wrong byte size
    assert _call(server.url, short) == _call(servers["python"].url, short)
    assert "Traceback" not in server.log()


_BYTES_SAMPLE = re.compile(
    r'^triton_mp_frontend_tensor_bytes_total\{direction="(\w+)"\} (\S+)$', re.M
)


def _tensor_bytes(server: ServerProcess) -> dict[str, float]:
    """The frontend's copied tensor bytes by direction (``GET /metrics``)."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    return {m[1]: float(m[2]) for m in _BYTES_SAMPLE.finditer(text)}


def test_known_answers_are_served_natively_with_exact_counts(
    servers: dict[str, ServerProcess],
) -> None:
    """The answers of the calls the gRPC thread submitted are served by C++
    (``known_answers``): the first has no response head yet and goes to Python (declined,
    the owned calls released), which teaches it; every later one is answered natively,
    each its own request's bytes, and the tensor bytes copied are counted exactly as the
    Python path counts them (64 + 64 in, 64 + 64 out per call)."""
    server = servers["native"]
    client = grpcclient.InferenceServerClient(server.url)

    def infer(value: float) -> None:
        inputs = []
        for tensor, v in (("INPUT0", value), ("INPUT1", 2.0)):
            inp = grpcclient.InferInput(tensor, [1, 16], "FP32")
            inp.set_data_from_numpy(np.full((1, 16), v, np.float32))
            inputs.append(inp)
        result = client.infer("add_sub_py", inputs, request_id="na")
        assert result.get_response().id == "na"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), value + 2))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.full((1, 16), value - 2))

    # NOTE: un-teach what an earlier test taught (a lesson serves any request id)
    client.update_trace_settings(model_name="add_sub_py", settings={"trace_rate": "999"})
    before, bytes_before = _known_counts(server), _tensor_bytes(server)
    try:
        # NOTE: the first calls go the Python way (the full way or the Python lane) until
        # the key and id are taught; the rest are sent natively
        for i in range(13):
            infer(i)
    finally:
        client.close()
    after, bytes_after = _known_counts(server), _tensor_bytes(server)
    sent = after["sent"] - before["sent"]
    assert sent >= 10, (before, after)
    assert after["answer_declined"] - before["answer_declined"] == 1, (before, after)
    assert after["released"] - before["released"] >= 1
    assert after["answered"] - before["answered"] == sent - 1
    # NOTE: every call counted once, whichever way it went
    assert bytes_after["in"] - bytes_before["in"] == 13 * 128
    assert bytes_after["out"] - bytes_before["out"] == 13 * 128
    assert "Traceback" not in server.log()


def _repeat_inputs(values: list[int], delay_ms: int) -> list[grpcclient.InferInput]:
    arrays = {
        "IN": np.array(values, np.int32),
        "DELAY": np.full(len(values), delay_ms, np.uint32),
        "WAIT": np.array([0], np.uint32),
    }
    inputs = []
    for name, arr in arrays.items():
        dtype = "INT32" if arr.dtype == np.int32 else "UINT32"
        inp = grpcclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def test_stream_infer_of_a_decoupled_model(servers: dict[str, ServerProcess]) -> None:
    got: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(servers["native"].url)
    client.start_stream(callback=lambda result, error: got.put(error or result))
    client.async_stream_infer("repeat_int32", _repeat_inputs([5, 6, 7], 1), request_id="r1")
    client.async_stream_infer("repeat_int32", _repeat_inputs([9], 1), request_id="r2")
    answers = [got.get(timeout=30) for _ in range(4)]
    client.stop_stream()
    assert all(not isinstance(a, Exception) for a in answers), answers
    by_id: dict[str, list[int]] = {}
    for a in answers:
        by_id.setdefault(a.get_response().id, []).append(int(a.as_numpy("OUT")[0]))
    assert by_id == {"r1": [5, 6, 7], "r2": [9]}


def test_a_client_going_away_mid_stream_loses_nothing(servers: dict[str, ServerProcess]) -> None:
    url = servers["native"].url
    got: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put(error or result))
    client.async_stream_infer("repeat_int32", _repeat_inputs(list(range(20)), 100))
    got.get(timeout=30)
    client.stop_stream(cancel_requests=True)
    client.close()
    time.sleep(0.5)
    # the frontend still serves, and its Python side saw the cancellation
    assert _call(url, _add_sub_request())[0] == "OK"


SLOW_CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
SLOW_MODEL = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1.0)
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())
            ])
            for r in requests
        ]
"""


SLOW_BATCHED_CONFIG = """
backend: "python"
max_batch_size: 4
input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [{ count: 1, kind: KIND_CPU }]
"""
"""A slow model the frontends never hand straight to an instance (its batching delay): its
known calls are submitted by the gRPC thread."""
SLOW_BATCHED_MODEL = SLOW_MODEL.replace("time.sleep(1.0)", "time.sleep(0.4)")


def test_an_owned_call_past_its_deadline_is_cancelled_by_python(
    servers: dict[str, ServerProcess],
) -> None:
    """A slow request answered in time until the gRPC thread submits and keeps it
    (``known_answers``); then one past its deadline: the call is handed to Python (released
    before its cancel, ``handoff.cc`` Withdraw), which cancels it as any known call, and its
    late answer is freed."""
    server = servers["native"]
    req = pb.ModelInferRequest(model_name="slow_batched_py", id="owned")
    req.inputs.add(name="IN", datatype="INT32", shape=[1, 1])
    req.raw_input_contents.append(np.ones(1, np.int32).tobytes())
    body = req.SerializeToString()
    before = _known_counts(server)
    with grpc.insecure_channel(server.url) as channel:
        infer = channel.unary_unary(INFER)
        for _ in range(6):  # NOTE: at most: until one was sent natively
            infer(body, timeout=10)
            if _known_counts(server)["sent"] > before["sent"]:
                break
        sent = _known_counts(server)
        assert sent["sent"] > before["sent"]
        with pytest.raises(grpc.RpcError) as late:
            infer(body, timeout=0.2)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # NOTE: its late answer arrives and is freed
    after = counted(
        lambda: _known_counts(server), lambda c: c["released"] > sent["released"], "the release"
    )
    assert after["sent"] == sent["sent"] + 1
    assert after["released"] > sent["released"]
    assert after["answered"] == sent["answered"]
    assert _call(server.url, _add_sub_request())[0] == "OK"
    log = server.log()
    assert "Traceback" not in log
    assert "refused to free" not in log


def _live_output_blocks(server: ServerProcess, instance: str) -> int:
    """LIVE block headers (tensor_pool: u32 state 1, u32 generation != 0, u64 size, at 64-byte
    steps) in the arenas of worker ``instance`` (its outputs: float payloads never look like
    one)."""
    pids = [
        p.pid
        for p in psutil.Process(server.pid).children(recursive=True)
        if p.cmdline() and p.cmdline()[0] == f"triton-mp: worker {instance}"
    ]
    assert len(pids) == 1, pids
    return live_output_blocks(server.pid, pids[0])


def test_deadlines_of_16_clients_leave_no_owned_call_and_no_block(
    servers: dict[str, ServerProcess],
) -> None:
    """16 clients at once, a third of their calls with a 1-3 ms deadline, so that calls end
    while the gRPC thread owns them, while C++ builds their answers and after it queued them
    (handoff.cc Withdraw, known_answer_py.cc Serve): every answer that comes is its own
    request's, every call sent natively is then either answered there or handed to Python
    (sent = answered + released), no free is refused, and every output block of add_sub_py's
    worker is freed."""
    server = servers["native"]
    before = _known_counts(server)
    outcomes: list[str] = []

    def client(i: int) -> None:
        rng = random.Random(i)
        c = grpcclient.InferenceServerClient(
            server.url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )
        inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        try:
            for k in range(40):
                value = float(i * 1000 + k) + 0.5
                inputs[0].set_data_from_numpy(np.full((1, 16), value, np.float32))
                inputs[1].set_data_from_numpy(np.full((1, 16), 2.0, np.float32))
                timeout = rng.choice([30.0, 30.0, 0.001, 0.003])
                try:
                    result = c.infer(
                        "add_sub_py", inputs, request_id=f"dl{i}", client_timeout=timeout
                    )
                except InferenceServerException as e:
                    outcomes.append(str(e.status()))
                    continue
                good = np.array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), value + 2))
                outcomes.append("OK" if good else f"wrong answer for {value}")
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(outcomes) <= {"OK", "StatusCode.DEADLINE_EXCEEDED"}, set(outcomes)
    assert outcomes.count("OK") > 100
    assert "StatusCode.DEADLINE_EXCEEDED" in outcomes

    def settled() -> bool:
        now = _known_counts(server)
        owned = (now["sent"] - before["sent"]) - (now["answered"] - before["answered"])
        return owned == now["released"] - before["released"]

    wait_for(settled, 10, "every call sent natively to be answered or released")
    after = _known_counts(server)
    assert after["answered"] > before["answered"]
    assert after["released"] > before["released"]
    assert after["stray_frees"] == before["stray_frees"]
    wait_for(lambda: _live_output_blocks(server, "add_sub_py_0_0") == 0, 10, "the blocks freed")
    assert "refused to free" not in server.log()


def test_a_stop_answers_the_calls_in_flight(tmp_path: Path) -> None:
    """SIGINT while handed-off ModelInfer calls wait for a slow model: the drain answers
    every one (the native server stops only after them), and the server exits cleanly."""
    repo = tmp_path / "repo"
    write_python_model(repo, "slow_py", SLOW_CONFIG, SLOW_MODEL)
    got: queue.Queue[Any] = queue.Queue()
    with server_factory(tmp_path) as start:
        server = start(repo, "--grpc-frontend", "native")
        client = grpcclient.InferenceServerClient(server.url)
        for i in range(3):
            inp = grpcclient.InferInput("IN", [1], "INT32")
            inp.set_data_from_numpy(np.array([i], np.int32))
            client.async_infer("slow_py", [inp], lambda result, error: got.put(error or result))
        time.sleep(0.5)
        assert server.stop() == 0
        answers = [got.get(timeout=30) for _ in range(3)]
        client.close()
    assert sorted(int(a.as_numpy("OUT")[0]) for a in answers) == [0, 1, 2], answers


def test_calls_cancelled_before_their_request_is_read_leave_a_stop_nothing_to_wait_for(
    tmp_path: Path,
) -> None:
    """Clients that cancel a ModelInfer before sending its request: when the call's end
    (AsyncNotifyWhenDone) reaches the gRPC thread before its failed read, the call it then
    relays to the Python side is cancelled too. Before, nothing cancelled that relayed call,
    which waited for a message that never came: the stop then waited out the exit timeout
    and the supervisor killed the frontend ("frontend 0 did not stop")."""
    repo = tmp_path / "repo"
    write_python_model(repo, "slow_py", SLOW_CONFIG, SLOW_MODEL)
    request = pb.ModelInferRequest(model_name="slow_py")
    with server_factory(tmp_path) as start:
        server = start(repo, "--grpc-frontend", "native", "--exit-timeout-secs", "2")
        with grpc.insecure_channel(server.url) as channel:
            call = channel.unary_unary(
                INFER, request_serializer=pb.ModelInferRequest.SerializeToString
            )
            for _ in range(200):
                call.future(request).cancel()  # NOTE: the cancel chases the request
        assert server.stop() == 0
        assert "did not stop" not in server.log()


def test_absent_extension_falls_back_to_python(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_MP_NATIVE", "0")
    with server_factory(tmp_path) as start:
        server = start(repo, "--grpc-frontend", "native")
        assert _call(server.url, _add_sub_request())[0] == "OK"
        log = server.log()
    lines = [line for line in log.splitlines() if "native gRPC frontend not built" in line]
    assert len(lines) == 1, log
    assert "TRITON_MP_NATIVE=0" in lines[0]
