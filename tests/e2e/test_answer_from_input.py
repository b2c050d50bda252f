"""Outputs answered from the request's own input block (``TensorRef``'s rule in
``ipc.protocol.messages``; ``workers/native/answer_writer.cc`` PlanAlias, the native
frontend's input holds in ``known_answer.h``, ``frontend.dispatch.pending`` for Python),
through tritonclient against a running server, 1 MiB tensors:

- a model that returns its input (``echo``), one that returns a view inside it (``tail``:
  its second half) and one that returns a modified copy (``plus_one``): over gRPC (the
  first calls of a form through Python, the later ones native) and HTTP (Python), every
  answer holds exactly the bytes it should; the native answers of ``echo`` are sent in
  place; no input block stays LIVE afterwards;
- clients that do not read their answers hold their input blocks: calls of other clients
  meanwhile (which reuse the arena's free room) do not change the bytes the stuck clients
  then read, and once those are read, or their clients gone, every input block is free.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.test_native_large_answers import _tensor_bytes
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory, wait_for
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.native import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", %s)]))
        return out
"""
MODELS = {"echo": "x", "tail": "x[x.size // 2:]", "plus_one": "x + 1"}
"""model name -> what it returns of its input ``x``."""
EXPECT = {"echo": lambda x: x, "tail": lambda x: x[x.size // 2 :], "plus_one": lambda x: x + 1}
N = 1 << 18
"""FP32 elements: 1 MiB."""
CALLS = 8  # NOTE: the first 3-4 of a form go the Python way (it teaches the gRPC thread)
INFER = "/inference.GRPCInferenceService/ModelInfer"
STUCK_OPTS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.use_local_subchannel_pool", 1),  # NOTE: a connection of its own per channel
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 1024),
]
"""A client whose flow-control window stays small: the server cannot finish sending."""
_HEADER = struct.Struct("<IIQ")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("from_input") / "repo"
    for name, returned in MODELS.items():
        write_python_model(repo, name, CONFIG, MODEL % returned)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def live_input_blocks(server: ServerProcess) -> int:
    """LIVE block headers (u32 state 1, u32 generation != 0, u64 size of whole 64-byte
    steps) at the 64-byte steps of the frontends' input arenas
    (``triton_mp_<server>_f*p*_a*``); the float payloads sent here never look like one."""
    live = 0
    for path in Path("/dev/shm").glob(f"triton_mp_{server.pid}_f*p*_a*"):
        data = path.read_bytes()
        for off in range(64, len(data) - 16, 64):
            state, generation, size = _HEADER.unpack_from(data, off)
            live += state == 1 and generation != 0 and size % 64 == 0 and 0 < size <= len(data)
    return live


def _x(seed: int) -> np.ndarray:
    return np.arange(N, dtype=np.float32) + np.float32(seed)


def test_answers_from_the_input_block_hold_the_right_bytes(server: ServerProcess) -> None:
    g = grpcclient.InferenceServerClient(server.url)
    h = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        for name in MODELS:
            before = _tensor_bytes(server)
            for i in range(CALLS):
                x = _x(i)
                inp = grpcclient.InferInput("INPUT0", [N], "FP32")
                inp.set_data_from_numpy(x)
                got = g.infer(name, [inp], request_id=f"{name}{i}")
                assert got.get_response().id == f"{name}{i}"
                np.testing.assert_array_equal(got.as_numpy("OUTPUT0"), EXPECT[name](x))
            in_place = _tensor_bytes(server)["out_in_place"] - before["out_in_place"]
            if name == "echo":  # NOTE: the native answers, sent from the input block
                assert in_place >= 2 * 4 * N, in_place
            for i in range(3):
                x = _x(100 + i)
                inp = httpclient.InferInput("INPUT0", [N], "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                got = h.infer(name, [inp])
                np.testing.assert_array_equal(got.as_numpy("OUTPUT0"), EXPECT[name](x))
    finally:
        g.close()
        h.close()
    wait_for(lambda: live_input_blocks(server) == 0, 10, "the input blocks freed")
    assert "Traceback" not in server.log()


class _Stuck:
    """``n`` echo calls (data ``_x(1000 + i)``), each on a connection of its own, that read
    nothing until ``read()``: then each answer's check (True: its own bytes whole, else the
    status code's name); ``drop()`` closes the connections unread instead."""

    def __init__(self, url: str, n: int) -> None:
        self._url, self._n = url, n
        self._go = threading.Event()
        self._read = True
        self.sent = threading.Event()
        self.got: list[object] = []
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        assert self.sent.wait(60), "the stuck calls were not sent"

    async def _run(self) -> None:
        chans = [grpc.aio.insecure_channel(self._url, options=STUCK_OPTS) for _ in range(self._n)]
        calls = []
        for i, ch in enumerate(chans):
            req = pb.ModelInferRequest(model_name="echo", id=f"stuck{i}")
            t = req.inputs.add()
            t.name, t.datatype = "INPUT0", "FP32"
            t.shape.append(N)
            req.raw_input_contents.append(_x(1000 + i).tobytes())
            c = ch.stream_stream(INFER)()
            await c.write(req.SerializeToString())
            await c.done_writing()
            calls.append(c)
        self.sent.set()
        while not self._go.is_set():
            await asyncio.sleep(0.05)
        for i, c in enumerate(calls):
            if not self._read:
                break
            try:
                r = await asyncio.wait_for(c.read(), 60)
                out = pb.ModelInferResponse.FromString(r).raw_output_contents[0]
                self.got.append(np.array_equal(np.frombuffer(out, np.float32), _x(1000 + i)))
            except grpc.aio.AioRpcError as e:
                self.got.append(e.code().name)
        for ch in chans:
            await ch.close()

    def read(self) -> list[object]:
        self._go.set()
        self._thread.join(120)
        return self.got

    def drop(self) -> None:
        self._read = False
        self.read()


def _teach_echo(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        for i in range(CALLS):
            inp = grpcclient.InferInput("INPUT0", [N], "FP32")
            inp.set_data_from_numpy(_x(i))
            client.infer("echo", [inp])
    finally:
        client.close()


def test_unread_answers_keep_their_input_blocks_until_sent(server: ServerProcess) -> None:
    _teach_echo(server)
    wait_for(lambda: live_input_blocks(server) == 0, 10, "the taught calls' blocks freed")
    stuck = _Stuck(server.url, 4)
    wait_for(lambda: live_input_blocks(server) >= 1, 30, "a stuck answer holding its input")
    _teach_echo(server)  # NOTE: other calls meanwhile reuse the arena's free room
    got = stuck.read()
    assert got == [True] * 4, got
    wait_for(lambda: live_input_blocks(server) == 0, 10, "the input blocks freed once sent")
    dropped = _Stuck(server.url, 3)
    wait_for(lambda: live_input_blocks(server) >= 1, 30, "a stuck answer holding its input")
    dropped.drop()  # NOTE: the clients go away unread: gRPC lets go of the replies
    wait_for(lambda: live_input_blocks(server) == 0, 30, "the input blocks freed once dropped")
    _teach_echo(server)
    assert "Traceback" not in server.log()
