"""Output blocks held in place by native replies (``frontend/native/held_block.h``) against
clients that never read their 16 MiB answers (``ipc.output_holds``):

- a frontend SIGKILLed while its replies hold blocks: the stuck calls end UNAVAILABLE (the
  connection dropped), the frontend comes back and answers right, and every output block
  the dead process held is freed (before, they stayed LIVE until the worker restarted);
  with two frontends, the blocks the other frontend holds stay held and its clients read
  their answers whole;
- with a small ``--arena-budget-bytes``, stuck readers hold at most the budget's copy mark:
  later blocks are flagged COPY, copied into their replies and freed at once, so other
  clients' large calls succeed (before, they failed UNAVAILABLE "tensor arena budget ...
  exhausted" while the stuck clients held every block)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.test_native_large_answers import (
    CONFIG,
    COUNTS,
    MODEL,
    MODEL_NAME,
    _infer,
    _tensor_bytes,
)
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory, wait_for
from tests.helpers.worker_arenas import live_output_blocks, live_output_holders
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.native import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

INFER = "/inference.GRPCInferenceService/ModelInfer"
X = np.arange(COUNTS[-1], dtype=np.float32)
"""16 MiB - 12 B of floats that never look like a block header."""
OPTS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.use_local_subchannel_pool", 1),  # NOTE: a connection of its own per channel
]
STUCK_OPTS = [*OPTS, ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]
"""A client whose flow-control window stays small: the server cannot finish sending."""


def _request() -> bytes:
    req = pb.ModelInferRequest(model_name=MODEL_NAME, id="stuck")
    t = req.inputs.add()
    t.name, t.datatype = "INPUT0", "FP32"
    t.shape.extend([1, X.size])
    req.raw_input_contents.append(X.tobytes())
    return bytes(req.SerializeToString())


class _Stuck:
    """``n`` calls on ``channels`` connections of their own that never read their answers
    until ``read()``, which then reads each (True: the whole right answer, else the
    status code's name)."""

    def __init__(self, url: str, n: int, channels: int = 1) -> None:
        self._url, self._n, self._channels = url, n, channels
        self._read = threading.Event()
        self.sent = threading.Event()
        self.got: list[object] = []
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        assert self.sent.wait(60), "the stuck calls were not sent"

    async def _run(self) -> None:
        data = _request()
        chans = [
            grpc.aio.insecure_channel(self._url, options=STUCK_OPTS) for _ in range(self._channels)
        ]
        calls = []
        for i in range(self._n):
            c = chans[i % len(chans)].stream_stream(INFER)()
            await c.write(data)
            await c.done_writing()
            calls.append(c)
        self.sent.set()
        while not self._read.is_set():
            await asyncio.sleep(0.05)
        for c in calls:
            try:
                r = await asyncio.wait_for(c.read(), 60)
                out = pb.ModelInferResponse.FromString(r).raw_output_contents[0]
                self.got.append(np.array_equal(np.frombuffer(out, np.float32), X))
            except grpc.aio.AioRpcError as e:
                self.got.append(e.code().name)
        for ch in chans:
            await ch.close()

    def read(self) -> list[object]:
        self._read.set()
        self._thread.join(120)
        return self.got


def _pids(server: ServerProcess, title: str) -> list[int]:
    out = []
    for p in psutil.Process(server.pid).children(recursive=True):
        try:
            if p.cmdline() and p.cmdline()[0].startswith(title):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def _worker(server: ServerProcess) -> int:
    (pid,) = _pids(server, f"triton-mp: worker {MODEL_NAME}")
    return pid


def _teach(server: ServerProcess, channels: int = 1, calls: int = 8) -> None:
    """Big calls on ``channels`` connections, ``calls`` each: each frontend that gets one
    learns the form, and later calls are answered natively (in place)."""
    for _ in range(channels):
        with grpc.insecure_channel(server.url, options=OPTS) as ch:
            call = ch.unary_unary(INFER)
            for _ in range(calls):
                call(_request(), timeout=60)


def _answered_bytes(server: ServerProcess) -> float:
    """Output bytes frontend 0 answered so far, copied or sent in place (as the metrics
    text writes them: not to the byte)."""
    sent = _tensor_bytes(server)
    return sent["out"] + sent["out_in_place"]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[tuple[Path, object]]:
    repo = tmp_path / "repo"
    write_python_model(repo, MODEL_NAME, CONFIG, MODEL)
    (tmp_path / "logs").mkdir()
    with server_factory(tmp_path / "logs") as factory:
        yield repo, factory


def _ready(server: ServerProcess) -> bool:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        return bool(client.is_model_ready(MODEL_NAME))
    except Exception:  # noqa: BLE001 - not back yet
        return False
    finally:
        client.close()


def test_a_killed_frontends_held_blocks_are_freed(start: tuple[Path, object]) -> None:
    repo, factory = start
    server: ServerProcess = factory(repo, "--frontend-spare=true")  # type: ignore[operator]
    _teach(server)
    worker = _worker(server)
    (frontend,) = _pids(server, "triton-mp: frontend")
    before = _answered_bytes(server)
    stuck = _Stuck(server.url, 4)
    wait_for(lambda: _answered_bytes(server) - before > 3.5 * X.nbytes, 30, "4 answers sent")
    held = live_output_blocks(server.pid, worker)
    assert held >= 1
    holders = live_output_holders(server.pid, worker)
    os.kill(frontend, signal.SIGKILL)
    assert stuck.read() == ["UNAVAILABLE"] * 4
    wait_for(lambda: _ready(server), 60, "the frontend back")
    client = grpcclient.InferenceServerClient(server.url)
    try:
        _infer(client, X, "after")
    finally:
        client.close()
    wait_for(lambda: live_output_blocks(server.pid, worker) == 0, 15, "the held blocks freed")
    assert holders == [frontend] * held
    assert f"freed {held} output blocks held by frontend process {frontend}" in server.log()


def test_a_killed_frontend_frees_only_its_own_holds(start: tuple[Path, object]) -> None:
    """Two frontends: stuck calls, each on a connection of its own and one at a time (no
    batch shares a block), until both frontends hold blocks; one is killed: its blocks are
    freed, the other's stay LIVE and their clients read them whole."""
    repo, factory = start
    server: ServerProcess = factory(  # type: ignore[operator]
        repo, "--frontend-processes", "2", "--frontend-spare=true"
    )
    _teach(server, channels=6, calls=5)
    worker = _worker(server)
    stuck: list[_Stuck] = []
    for _ in range(16):
        held = len(live_output_holders(server.pid, worker))
        if len(set(live_output_holders(server.pid, worker))) == 2:
            break
        stuck.append(_Stuck(server.url, 1))
        # NOTE: not held: answered the Python way (its frontend learns the form from it)
        with contextlib.suppress(AssertionError):
            wait_for(lambda n=held: len(live_output_holders(server.pid, worker)) > n, 5, "")
    holders = live_output_holders(server.pid, worker)
    assert 0 not in holders, holders
    assert len(set(holders)) == 2, holders
    dead = holders[0]
    kept = [h for h in holders if h != dead]
    os.kill(dead, signal.SIGKILL)
    wait_for(lambda: live_output_holders(server.pid, worker) == kept, 30, "the dead one's freed")
    got = [r for s in stuck for r in s.read()]
    assert got.count(True) >= len(kept), got
    assert set(got) <= {True, "UNAVAILABLE"}, got
    wait_for(lambda: live_output_blocks(server.pid, worker) == 0, 15, "every block freed")


def test_stuck_readers_leave_room_for_other_clients_large_calls(
    start: tuple[Path, object],
) -> None:
    """An 80 MiB budget (four 16 MiB blocks fit): 8 stuck readers, one after the other,
    hold at most the blocks allocated below the copy mark (half the budget); the rest are
    copied. Another client's 16 MiB calls succeed meanwhile; the stuck clients then read
    every answer whole. Before, the first 4 held every block and the 5th failed
    UNAVAILABLE "tensor arena budget of 83886080 bytes is exhausted"."""
    repo, factory = start
    server: ServerProcess = factory(repo, "--arena-budget-bytes", str(80 << 20))  # type: ignore[operator]
    _teach(server)
    worker = _worker(server)
    before = _answered_bytes(server)
    stuck = []
    for i in range(8):  # NOTE: one at a time: a burst can exhaust 80 MiB without holds
        stuck.append(_Stuck(server.url, 1))
        wait_for(
            lambda i=i: _answered_bytes(server) - before > (i + 0.5) * X.nbytes, 30, f"answer {i}"
        )
    client = grpcclient.InferenceServerClient(server.url)
    try:
        for i in range(3):
            _infer(client, X, f"other{i}")
    finally:
        client.close()
    assert live_output_blocks(server.pid, worker) <= 2
    assert [s.read() for s in stuck] == [[True]] * 8
    wait_for(lambda: live_output_blocks(server.pid, worker) == 0, 15, "every block freed")
    assert "exhausted" not in server.log()
