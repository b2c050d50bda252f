"""A frontend killed with -9 under 64 concurrent tritonclient clients comes back in its
place while the other frontend serves (``supervisor.processes.frontend_restart``).

Only the requests on the dead frontend's connections fail (UNAVAILABLE: the connection
dropped), no answer is wrong (each client sends its own values), the new process serves
within 2 s, its predecessor's arenas are gone, ``triton-mp stat``'s data and the metrics
count the restart, and after SIGTERM nothing is left (the fixture checks /dev/shm and the
process group). With one frontend the clients reconnect once it is back.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.fault_models import write_faulty_model
from tests.helpers.server import ServerProcess, wait_for
from triton_mp._proto import admin_pb2, admin_pb2_grpc
from triton_mp.ipc.memory.shm import list_objects

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CLIENTS = 64
RESTART_S = 2.0
"""How soon the new frontend must serve after the kill (the issue's bound)."""
SPARE = "--frontend-spare=true"
"""The test servers' default is no spare (``tests.helpers.server``); these kill frontends."""


def _frontends(server: ServerProcess) -> dict[str, int]:
    """Frontend process title -> pid."""
    out = {}
    for p in psutil.Process(server.pid).children(recursive=True):
        try:
            title = " ".join(p.cmdline()).strip()
        except psutil.Error:
            continue
        if title.startswith("triton-mp: frontend"):
            out[title] = p.pid
    return out


def _private_dirs(pid: int) -> list[Path]:
    """The directories of the unix sockets process ``pid`` listens on (the native gRPC
    server's private socket: none with the Python server alone)."""
    return [
        Path(c.laddr).parent
        for c in psutil.Process(pid).net_connections(kind="unix")
        if isinstance(c.laddr, str) and c.laddr.endswith("python.sock")
    ]


class _Load:
    """``CLIENTS`` threads, each with its own gRPC client (its own connection), inferring
    its own values in a loop; records successes, errors per client and wrong answers."""

    def __init__(self, server: ServerProcess, model: str) -> None:
        self.ok = 0
        self.errors: list[tuple[int, str, str]] = []
        self.wrong: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(server, model, i), daemon=True)
            for i in range(CLIENTS)
        ]
        for t in self._threads:
            t.start()

    def _run(self, server: ServerProcess, model: str, i: int) -> None:
        client = _own_connection(server.url)
        n = 0
        try:
            while not self._stop.is_set():
                n += 1
                value = float(i * 100_000 + n)
                x = grpcclient.InferInput("INPUT0", [1], "FP32")
                x.set_data_from_numpy(np.array([value], np.float32))
                try:
                    out = float(client.infer(model, [x], client_timeout=60).as_numpy("OUTPUT0")[0])
                except InferenceServerException as e:
                    with self._lock:
                        self.errors.append((i, str(e.status()), str(e.message())))
                    time.sleep(0.05)
                    continue
                with self._lock:
                    self.ok += 1
                    if out != value:
                        self.wrong.append((value, out))
        finally:
            client.close()

    def stop_and_join(self, timeout_s: float = 120) -> list[threading.Thread]:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return [t for t in self._threads if t.is_alive()]


def _own_connection(url: str) -> grpcclient.InferenceServerClient:
    """A client on a connection of its own: grpc shares one connection between channels to
    the same target (its global subchannel pool), which would put every client on one
    frontend."""
    return grpcclient.InferenceServerClient(
        url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
    )


def _serves(url: str) -> bool:
    try:
        with grpcclient.InferenceServerClient(url) as c:
            return bool(c.is_server_ready(client_timeout=1))
    except InferenceServerException:
        return False


def _metric(server: ServerProcess, name: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return "\n".join(line for line in text.splitlines() if line.startswith(name))


def _restarts(server: ServerProcess) -> dict[int, int]:
    """Per frontend id, its restarts as ``triton-mp stat`` reads them (admin QueueStatus)."""
    with grpc.insecure_channel(server.url) as channel:
        reply = admin_pb2_grpc.AdminStub(channel).QueueStatus(
            admin_pb2.QueueStatusRequest(), timeout=30
        )
    return dict(reply.frontend_restarts)


def _kill_and_time(server: ServerProcess, title: str) -> tuple[int, int, float]:
    """SIGKILL frontend ``title``; returns its pid, its successor's pid and the seconds
    until the successor's ports are bound (its start handshake, logged)."""
    victim = _frontends(server)[title]
    marker = server.log().count("restarted (restart")
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: server.log().count("restarted (restart") > marker, 60, "the restart to be logged"
    )
    took = time.monotonic() - t0
    wait_for(lambda: _frontends(server).get(title, victim) != victim, 10, "the new process")
    return victim, _frontends(server)[title], took


def test_kill_9_of_one_of_two_frontends_under_64_clients(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "load_py", "none", count=2, sleep_ms=5)
    server = start_server(repo, "--frontend-processes", "2", SPARE)
    sid = str(server.pid)
    # NOTE: live means one frontend listens; the load must reach both.
    wait_for(lambda: "triton-mp serving" in server.log(), 60, "both frontends to listen")
    load = _Load(server, "load_py")
    wait_for(lambda: load.ok >= 300, 120, "the load to get going")
    victim_conns = {
        c.raddr.port
        for c in psutil.Process(_frontends(server)["triton-mp: frontend 1"]).net_connections()
        if c.status == psutil.CONN_ESTABLISHED and c.raddr
    }
    assert victim_conns, "SO_REUSEPORT gave frontend 1 no client"
    victim, fresh, took = _kill_and_time(server, "triton-mp: frontend 1")
    assert took <= RESTART_S, f"the new frontend was ready after {took:.2f} s"
    ok_at_restart = load.ok
    wait_for(lambda: load.ok >= ok_at_restart + 500, 120, "more answers after the restart")
    # The new process serves clients of its own (new connections spread over both).
    extra = [_own_connection(server.url) for _ in range(16)]
    try:
        for c in extra:
            assert c.is_server_ready()
        conns = [
            c
            for c in psutil.Process(fresh).net_connections()
            if c.status == psutil.CONN_ESTABLISHED and c.raddr
        ]
        assert conns, "no client connection reached the restarted frontend"
    finally:
        for c in extra:
            c.close()
    hung = load.stop_and_join()
    assert not hung, f"{len(hung)} clients never got an answer"
    assert not load.wrong, load.wrong[:5]
    # Only requests on the dead frontend's connections failed: once per such client, with
    # the dropped connection's UNAVAILABLE; the others never saw an error.
    failing = {i for i, _, _ in load.errors}
    assert len(failing) <= len(victim_conns), (len(failing), len(victim_conns), load.errors[:5])
    assert len(load.errors) == len(failing), load.errors
    for _, status, message in load.errors:
        assert status == "StatusCode.UNAVAILABLE", (status, message)
    print(f"restart took {took:.2f} s; {len(load.errors)} requests failed of {load.ok}")
    assert _restarts(server) == {0: 0, 1: 1}
    counted = _metric(server, "triton_mp_frontend_restarts_total")
    assert 'triton_mp_frontend_restarts_total{frontend="0"} 0' in counted.splitlines(), counted
    assert 'triton_mp_frontend_restarts_total{frontend="1"} 1' in counted.splitlines(), counted
    with server.client() as client:
        assert client.is_server_ready()
    # The dead process's input arenas are unlinked; the new one has its own.
    assert not [n for n in list_objects(sid) if f"f1p{victim}_" in n]


def test_kill_9_of_the_only_frontend_clients_reconnect(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "load_py", "none", count=2, sleep_ms=5)
    server = start_server(repo, SPARE)
    sid = str(server.pid)
    load = _Load(server, "load_py")
    wait_for(lambda: load.ok >= 300, 120, "the load to get going")
    private = _private_dirs(_frontends(server)["triton-mp: frontend 0"])
    victim, _, took = _kill_and_time(server, "triton-mp: frontend 0")
    assert took <= RESTART_S, f"the new frontend was ready after {took:.2f} s"
    ok_at_restart = load.ok
    wait_for(lambda: load.ok >= ok_at_restart + 500, 120, "answers after the restart")
    hung = load.stop_and_join()
    assert not hung, f"{len(hung)} clients never got an answer"
    assert not load.wrong, load.wrong[:5]
    # Every client lost its connection: its request in flight failed, and while no
    # frontend listened its retries were refused; then it reconnected.
    for _, status, message in load.errors:
        assert status == "StatusCode.UNAVAILABLE", (status, message)
    print(f"restart took {took:.2f} s; {len(load.errors)} requests failed of {load.ok}")
    assert _serves(server.url)
    assert _restarts(server) == {0: 1}
    counted = _metric(server, "triton_mp_frontend_restarts_total")
    assert 'triton_mp_frontend_restarts_total{frontend="0"} 1' in counted.splitlines(), counted
    assert not [n for n in list_objects(sid) if f"f0p{victim}_" in n]
    # The dead process's native gRPC socket directory is removed too (by its pid).
    assert not [d for d in private if d.exists()], private


def test_the_restarted_frontend_knows_the_client_shared_memory_registered_before(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    import tritonclient.utils.shared_memory as shm

    repo = tmp_path / "repo"
    write_faulty_model(repo, "load_py", "none")
    server = start_server(repo, "--frontend-processes", "2", "--allow-client-shm=true", SPARE)
    wait_for(lambda: "triton-mp serving" in server.log(), 60, "both frontends to listen")
    key = f"/triton_mp_test_{os.getpid()}_restart_in"
    handle = shm.create_shared_memory_region("in", key, 4, create_only=True)
    try:
        shm.set_shared_memory_region(handle, [np.array([7.5], np.float32)])
        with _own_connection(server.url) as c:
            c.register_system_shared_memory("in", key, 4)
        _kill_and_time(server, "triton-mp: frontend 1")
        fresh = _frontends(server)["triton-mp: frontend 1"]
        clients = [_own_connection(server.url) for _ in range(16)]
        try:
            for c in clients:
                # Whichever frontend the connection reached knows the region and serves it.
                assert list(c.get_system_shared_memory_status().regions) == ["in"]
                x = grpcclient.InferInput("INPUT0", [1], "FP32")
                x.set_shared_memory("in", 4)
                assert float(c.infer("load_py", [x]).as_numpy("OUTPUT0")[0]) == 7.5
            reached = [
                p
                for p in psutil.Process(fresh).net_connections()
                if p.status == psutil.CONN_ESTABLISHED and p.raddr
            ]
            assert reached, "no connection reached the restarted frontend"
            clients[0].unregister_system_shared_memory("in")
        finally:
            for c in clients:
                c.close()
    finally:
        shm.destroy_shared_memory_region(handle)
