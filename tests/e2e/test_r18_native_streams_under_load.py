"""The native frontend's serial lock (``Handoff``: a Kick never waits for it, the holder sends
what is due) attacked through tritonclient with many callers at once (r18); the same against
``--grpc-frontend python``:

- streams of a batched echo, 1 KiB to 512 KiB answers, each checked in its stream's order
  and byte for byte; streams of a decoupled model (two instances) answering three times
  per request, each request's answers in order;
- unary calls of the same echo on other connections meanwhile;
- callers cancelling their calls at once or a few ms in, and callers whose deadline expires;
- afterwards every caller's last calls are answered (nothing hung: a lost wake-up would
  leave an answer unsent until the deadline), no input block stays LIVE, no traceback.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.test_answer_from_input import live_input_blocks
from tests.helpers.repos import IDENTITY_PY, write_python_model
from tests.helpers.server import ServerProcess, server_factory, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIZES = [256, 1 << 14, 1 << 16, 1 << 17]
"""FP32 elements per call, cycled: 1 KiB to 512 KiB."""
STREAMS = 6
UNARY = 4
CANCELLING = 4
CALLS = 40
ECHO_CONFIG = """
backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 500 }
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [{ count: 2, kind: KIND_CPU }]
"""
REPEAT_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [{ count: 2, kind: KIND_CPU }]
"""
REPEAT_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            s = r.get_response_sender()
            for k in range(3):
                s.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + k)]))
            s.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
REPEATS = 3


@pytest.fixture(params=["native", "python"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    repo = tmp_path / "repo"
    write_python_model(repo, "echo", ECHO_CONFIG, IDENTITY_PY)
    write_python_model(repo, "repeat", REPEAT_CONFIG, REPEAT_MODEL)
    (tmp_path / "logs").mkdir()
    with server_factory(tmp_path / "logs") as start:
        yield start(repo, "--grpc-frontend", request.param)


def _x(k: int, call: int) -> np.ndarray:
    n = SIZES[call % len(SIZES)]
    return np.arange(n, dtype=np.float32) + np.float32(1_000_000 * (k + 1) + 1000 * call)


def _input(x: np.ndarray, batched: bool) -> grpcclient.InferInput:
    shape = [1, x.size] if batched else [x.size]
    inp = grpcclient.InferInput("INPUT0", shape, "FP32")
    inp.set_data_from_numpy(x.reshape(shape))
    return inp


def _client(server: ServerProcess) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        server.url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
    )


def _stream(server: ServerProcess, k: int, model: str, problems: list[str]) -> None:
    """CALLS requests on one stream; the answers checked in order."""
    got: queue.Queue[Any] = queue.Queue()
    c = _client(server)
    per = REPEATS if model == "repeat" else 1
    try:
        c.start_stream(callback=lambda result, error: got.put(error or result))
        for call in range(CALLS):
            c.async_stream_infer(
                model, [_input(_x(k, call), model == "echo")], request_id=str(call)
            )
        seen = [0] * CALLS
        for i in range(CALLS * per):
            r = got.get(timeout=60)
            if isinstance(r, InferenceServerException):
                problems.append(f"stream {k} {model}: {r}")
                return
            rid = r.get_response().id
            call = int(rid)
            # NOTE: a unary model's answers come in the stream's order; a decoupled one's
            # requests run on two instances, so only each request's answers are ordered
            expect = i if per == 1 else call
            out = r.as_numpy("OUTPUT0").reshape(-1)
            if call != expect or not np.array_equal(out, _x(k, call) + seen[call]):
                problems.append(f"stream {k} {model}: answer {i} is {rid}/{seen[call]}")
            seen[call] += 1
        c.stop_stream()
    finally:
        c.close()


def _unary(server: ServerProcess, k: int, problems: list[str]) -> None:
    c = _client(server)
    try:
        for call in range(CALLS):
            x = _x(k, call)
            out = c.infer("echo", [_input(x, True)], client_timeout=60).as_numpy("OUTPUT0")
            if not np.array_equal(out.reshape(-1), x):
                problems.append(f"unary {k}/{call}")
    finally:
        c.close()


def _cancelling(server: ServerProcess, k: int, problems: list[str]) -> None:
    """Calls cancelled at once or 0-3 ms in, or given a 1 ms deadline; then one call that
    must be answered whole."""
    c = _client(server)
    try:
        for call in range(CALLS):
            x = _x(k, call)
            if call % 3 == 2:
                with contextlib.suppress(InferenceServerException):
                    c.infer("echo", [_input(x, True)], client_timeout=0.001)
                continue
            done = threading.Event()
            ctx = c.async_infer(
                "echo", [_input(x, True)], lambda result, error, done=done: done.set()
            )
            time.sleep((call % 4) / 1000)
            ctx.cancel()
            if not done.wait(60):
                problems.append(f"cancelling {k}/{call}: no callback")
        x = _x(k, 99)
        out = c.infer("echo", [_input(x, True)], client_timeout=60).as_numpy("OUTPUT0")
        if not np.array_equal(out.reshape(-1), x):
            problems.append(f"cancelling {k}: the last call")
    finally:
        c.close()


def test_streams_unary_and_cancelled_calls_at_once(server: ServerProcess) -> None:
    problems: list[str] = []
    jobs = (
        [(_stream, (server, k, "echo", problems)) for k in range(STREAMS)]
        + [(_stream, (server, 100 + k, "repeat", problems)) for k in range(STREAMS // 2)]
        + [(_unary, (server, 200 + k, problems)) for k in range(UNARY)]
        + [(_cancelling, (server, 300 + k, problems)) for k in range(CANCELLING)]
    )
    for _ in range(3):
        threads = [threading.Thread(target=f, args=a) for f, a in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert not any(t.is_alive() for t in threads), "a caller hung"
        assert not problems, problems
    wait_for(lambda: live_input_blocks(server) == 0, 10, "the input blocks freed")
    assert "Traceback" not in server.log()
