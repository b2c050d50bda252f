"""Client shared memory with ``--frontend-processes 2``, as one Triton process answers it.

Triton is one process: once SystemSharedMemoryRegister (or an unregister) returns, every
connection sees it, and a region a request uses cannot be unregistered through any
connection (2.51: INTERNAL, and the region stays). Here each frontend keeps its own copy of
the regions (``frontend.shm.peers``). The tests hold one connection on each frontend (which
frontend a connection reached is read from the server side, with psutil) and cross them: a
region registered through one is used at once through the other, many times; an unregister
through one while the other's request uses the region gets Triton's refusal. A register
while a frontend restarts returns, and the restarted process has the region. CUDA regions
(on the test-only fake GPU) travel the same way. One name registered through both frontends
at the same moment lets exactly one call through, as Triton's one process does.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory, wait_for
from triton_mp.common.process.gpus import FAKE_GPUS_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
name: "twice_py"
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }]
"""
MODEL = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            if x.size and x[0] < 0:
                time.sleep(-float(x[0]))  # a request that stays in flight that long
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return out
"""
REGION_BYTES = 256
ROUNDS = 200
"""Register-then-use rounds (r11 saw 4 of 200 uses fail, 2 of 200 stale uses succeed)."""
SLOW_S = 3.0
"""How long the request that holds the regions runs."""

Client = Any
"""A tritonclient gRPC or HTTP client."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("shm_frontends") / "repo"
    write_python_model(repo, "twice_py", CONFIG, MODEL)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        server = start(repo, "--allow-client-shm=true", "--frontend-processes", "2")
        wait_for(lambda: "triton-mp serving" in server.log(), 60, "both frontends to listen")
        yield server


@pytest.fixture
def objects() -> Iterator[dict[str, Any]]:
    """The client's ``in`` (0, 1, 2, ... as FP32) and ``out`` objects, destroyed after."""
    made = {}
    for name in ("in", "out"):
        key = f"/triton_mp_{os.getpid()}_test_xfe_{name}"
        made[name] = shm.create_shared_memory_region(name, key, REGION_BYTES, create_only=True)
    shm.set_shared_memory_region(made["in"], [np.arange(64, dtype=np.float32)])
    yield made
    for handle in made.values():
        shm.destroy_shared_memory_region(handle)


def _key(name: str) -> str:
    return f"/triton_mp_{os.getpid()}_test_xfe_{name}"


def _frontend_pids(server: ServerProcess) -> dict[int, int]:
    """Frontend id -> pid (process titles ``triton-mp: frontend <id>``)."""
    out = {}
    for p in psutil.Process(server.pid).children(recursive=True):
        try:
            title = " ".join(p.cmdline()).strip()
        except psutil.Error:
            continue
        if title.startswith("triton-mp: frontend "):
            out[int(title.rsplit(" ", 1)[1])] = p.pid
    return out


def _clients_of(pids: dict[int, int]) -> dict[int, set[Any]]:
    """Per frontend: the client ends of its established TCP connections."""
    return {
        fid: {
            c.raddr
            for c in psutil.Process(pid).net_connections("tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.raddr
        }
        for fid, pid in pids.items()
    }


def _one_on_each(server: ServerProcess, make: Callable[[], Client]) -> dict[int, Client]:
    """A client (on a connection of its own) on each frontend: new ones are opened until
    both frontends hold one; the frontend of each is the one whose connections gained it."""
    pids = _frontend_pids(server)
    assert sorted(pids) == [0, 1], pids
    found: dict[int, Client] = {}
    spare = []
    for _ in range(64):
        before = _clients_of(pids)
        c = make()
        c.is_server_live()
        gained = [f for f, ends in _clients_of(pids).items() if ends - before[f]]
        if len(gained) == 1 and gained[0] not in found:
            found[gained[0]] = c
        else:
            spare.append(c)
        if len(found) == 2:
            break
    for c in spare:
        c.close()
    assert sorted(found) == [0, 1], "no connection reached one of the frontends"
    return found


def _own_grpc(server: ServerProcess) -> Client:
    """A gRPC client on a connection of its own (grpc otherwise shares one connection
    between channels to the same target)."""
    return grpcclient.InferenceServerClient(
        server.url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
    )


@pytest.fixture
def grpc_on(server: ServerProcess) -> Iterator[dict[int, Client]]:
    clients = _one_on_each(server, lambda: _own_grpc(server))
    yield clients
    clients[0].unregister_system_shared_memory()
    for c in clients.values():
        c.close()


@pytest.fixture
def http_on(server: ServerProcess) -> Iterator[dict[int, Client]]:
    clients = _one_on_each(server, lambda: httpclient.InferenceServerClient(server.http_url))
    yield clients
    for c in clients.values():
        c.close()


def _infer(c: Client, n: int = 4, ioff: int = 0, inreg: str = "in") -> tuple[str, str]:
    """twice_py on ``n`` floats of ``inreg`` (from ``ioff``) into ``out`` at the same offset;
    ("OK", "") or the error's (status, message)."""
    mod: Any = httpclient if isinstance(c, httpclient.InferenceServerClient) else grpcclient
    i = mod.InferInput("IN", [n], "FP32")
    i.set_shared_memory(inreg, n * 4, ioff)
    o = mod.InferRequestedOutput("OUT")
    o.set_shared_memory("out", n * 4, ioff)
    try:
        c.infer("twice_py", [i], outputs=[o])
    except InferenceServerException as e:
        return str(e.status()), e.message() or ""
    return "OK", ""


def _unregister(c: Client, name: str = "") -> tuple[str, str]:
    try:
        c.unregister_system_shared_memory(name)
    except InferenceServerException as e:
        return str(e.status()), e.message() or ""
    return "OK", ""


def _regions(c: Client) -> list[str]:
    status = c.get_system_shared_memory_status(as_json=True)
    return sorted(status.get("regions", {}))


def test_a_region_registered_through_one_frontend_serves_the_other_at_once(
    grpc_on: dict[int, Client], http_on: dict[int, Client], objects: dict[str, Any]
) -> None:
    """Register through frontend a (gRPC or HTTP, in turn), infer through frontend b at once;
    unregister through a, and b's next call must not find it. Every round, both ways."""
    grpc_on[0].register_system_shared_memory("out", _key("out"), REGION_BYTES)
    wait_for(lambda: _regions(grpc_on[1]) == ["out"], 10, "the output region on both")
    wrong: list[tuple[int, str, object]] = []
    for k in range(ROUNDS):
        a = k % 2
        via = (grpc_on if k % 4 < 2 else http_on)[a]
        name = f"in{k}"
        via.register_system_shared_memory(name, _key("in"), REGION_BYTES)
        got = _infer(grpc_on[1 - a], inreg=name)
        if got != ("OK", ""):
            wrong.append((k, "use after register", got))
        via.unregister_system_shared_memory(name)
        got = _infer(grpc_on[1 - a], inreg=name)
        gone = ("StatusCode.NOT_FOUND", f"Unable to find shared memory region: '{name}'")
        if got != gone:
            wrong.append((k, "use after unregister", got))
    assert wrong == []
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(objects["out"], np.float32, [4]), [0.0, 2.0, 4.0, 6.0]
    )


RACES = 60
"""Rounds of one name registered through both frontends at once."""


def _register(c: Client, name: str, key: str, start: threading.Barrier) -> tuple[str, str]:
    start.wait()
    try:
        c.register_system_shared_memory(name, key, REGION_BYTES)
    except InferenceServerException as e:
        return str(e.status()), e.message() or ""
    return "OK", ""


def test_one_name_registered_through_both_frontends_at_once_lets_exactly_one_through(
    grpc_on: dict[int, Client], objects: dict[str, Any]
) -> None:
    """Each round, frontend 0 registers the name on the ``in`` object and frontend 1 on
    ``out``, released together: one call succeeds, the other gets Triton's ALREADY_EXISTS,
    and both frontends list the winner's object under the name (before the fix both calls
    failed whenever they overlapped)."""
    keys = {0: _key("in"), 1: _key("out")}
    wrong: list[tuple[int, object]] = []
    pool = ThreadPoolExecutor(2)
    for k in range(RACES):
        name = f"race{k}"
        start = threading.Barrier(2)
        calls = {f: pool.submit(_register, grpc_on[f], name, keys[f], start) for f in (0, 1)}
        got = {f: call.result() for f, call in calls.items()}
        taken = ("StatusCode.ALREADY_EXISTS", f"shared memory region '{name}' already in manager")
        winners = [f for f in (0, 1) if got[f] == ("OK", "")]
        if len(winners) != 1 or got[1 - winners[0]] != taken:
            wrong.append((k, got))
            continue
        for f in (0, 1):
            status = grpc_on[f].get_system_shared_memory_status(name, as_json=True)
            if status["regions"][name]["key"] != keys[winners[0]]:
                wrong.append((k, f, status))
        grpc_on[0].unregister_system_shared_memory(name)
    pool.shutdown()
    assert wrong == []


@pytest.mark.parametrize("over", ["grpc", "http"])
def test_a_region_another_frontends_request_uses_cannot_be_unregistered(
    grpc_on: dict[int, Client], http_on: dict[int, Client], objects: dict[str, Any], over: str
) -> None:
    """A request through frontend 1 holds ``in`` and ``out``; through frontend 0, unregister
    one and all get 2.51's INTERNAL refusal and both regions stay on both frontends; once
    the request is answered, the unregister goes through."""
    for name in ("in", "out"):
        grpc_on[1].register_system_shared_memory(name, _key(name), REGION_BYTES)
    shm.set_shared_memory_region(
        objects["in"], [np.array([-SLOW_S, 5, 6, 7], np.float32)], offset=128
    )
    box: dict[str, object] = {}
    flight = threading.Thread(target=lambda: box.setdefault("answer", _infer(grpc_on[1], ioff=128)))
    flight.start()
    time.sleep(SLOW_S / 4)
    via = (grpc_on if over == "grpc" else http_on)[0]
    internal = "StatusCode.INTERNAL" if over == "grpc" else "500"
    try:
        assert _unregister(via, "out") == (
            internal,
            "Cannot unregister shared memory region 'out', it is currently in use.",
        )
        assert _unregister(via) == (
            internal,
            "Failed to unregister the following system shared memory regions: in ,out ,",
        )
        assert [_regions(grpc_on[f]) for f in (0, 1)] == [["in", "out"], ["in", "out"]]
    finally:
        flight.join(timeout=60)
    assert box["answer"] == ("OK", "")
    got = shm.get_contents_as_numpy(objects["out"], np.float32, [64])[32:36]
    np.testing.assert_array_equal(got, [-2 * SLOW_S, 10.0, 12.0, 14.0])
    assert _unregister(via, "out") == ("OK", "")
    assert [_regions(grpc_on[f]) for f in (0, 1)] == [["in"], ["in"]]


def test_a_register_while_a_frontend_restarts_returns_and_its_successor_has_it(
    tmp_path: Path, start_server: Callable[..., ServerProcess], objects: dict[str, Any]
) -> None:
    """Frontend 1 is SIGKILLed; a register through frontend 0 still returns (a peer that
    does not answer is not waited for past ``frontend.shm.peers.APPLY_TIMEOUT_S``), and the
    process restarted in 1's place knows the region before it serves."""
    repo = tmp_path / "repo"
    write_python_model(repo, "twice_py", CONFIG, MODEL)
    server = start_server(
        repo, "--allow-client-shm=true", "--frontend-processes", "2", "--frontend-spare=true"
    )
    wait_for(lambda: "triton-mp serving" in server.log(), 60, "both frontends to listen")
    on = _one_on_each(server, lambda: _own_grpc(server))
    restarts = server.log().count("restarted (restart")
    os.kill(_frontend_pids(server)[1], signal.SIGKILL)
    on[1].close()
    for name in ("in", "out"):
        on[0].register_system_shared_memory(name, _key(name), REGION_BYTES)
    wait_for(lambda: server.log().count("restarted (restart") > restarts, 60, "the restart")
    fresh = _one_on_each(server, lambda: _own_grpc(server))
    try:
        assert _regions(fresh[1]) == ["in", "out"]
        assert _infer(fresh[1]) == ("OK", "")
        assert _unregister(fresh[1]) == ("OK", "")
        assert _regions(on[0]) == []
    finally:
        for c in (on[0], *fresh.values()):
            c.close()


def test_cuda_regions_registered_through_one_frontend_are_on_the_other_at_once(
    tmp_path: Path, start_server: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the test-only fake GPU: a CUDA region registered through frontend a (gRPC or
    HTTP, in turn) is listed, and its name taken, through frontend b at once; unregistered
    through a, b lists nothing."""
    monkeypatch.setenv(FAKE_GPUS_ENV, json.dumps([{"uuid": "GPU-12345678-aaaa"}]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    repo = tmp_path / "repo"
    write_python_model(repo, "twice_py", CONFIG, MODEL)
    server = start_server(repo, "--allow-client-shm=true", "--frontend-processes", "2")
    wait_for(lambda: "triton-mp serving" in server.log(), 60, "both frontends to listen")
    grpc_at = _one_on_each(server, lambda: _own_grpc(server))
    http_at = _one_on_each(server, lambda: httpclient.InferenceServerClient(server.http_url))
    handle = base64.b64encode(bytes(range(64)))
    taken = ("StatusCode.ALREADY_EXISTS", "shared memory region 'g' already in manager")
    try:
        for k in range(20):
            a = k % 2
            via = (grpc_at if k % 4 < 2 else http_at)[a]
            via.register_cuda_shared_memory("g", handle, 0, 128)
            assert list(grpc_at[1 - a].get_cuda_shared_memory_status().regions) == ["g"], k
            try:
                grpc_at[1 - a].register_system_shared_memory("g", _key("in"), REGION_BYTES)
                got = ("OK", "")
            except InferenceServerException as e:
                got = (str(e.status()), e.message() or "")
            assert got == taken, k
            via.unregister_cuda_shared_memory("g" if k % 3 else "")
            assert list(grpc_at[1 - a].get_cuda_shared_memory_status().regions) == [], k
    finally:
        for c in (*grpc_at.values(), *http_at.values()):
            c.close()
