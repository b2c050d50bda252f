"""Security end to end: Triton's restricted protocols (gRPC and HTTP), the client shared
memory policy (owner, this server's own objects, ``--client-shm-prefix``), and the bind
addresses the server logs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import posix_ipc
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.helpers.fault_models import write_faulty_model
from tests.helpers.server import ServerProcess
from tests.helpers.stat_cli import run_stat
from triton_mp.ipc.memory.shm import list_objects

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ADMIN = {"triton-grpc-protocol-admin-key": "admin-value"}


def _inputs(value: float) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return [x]


def _refused(fn: Callable[[], object], key: str) -> None:
    with pytest.raises(InferenceServerException) as e:
        fn()
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert e.value.message() == f"This protocol is restricted, expecting header '{key}'"


def test_restricted_protocols_answer_only_requests_with_the_header(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "echo_py", "none")
    server = start_server(
        repo,
        "--allow-client-shm=true",
        "--grpc-restricted-protocol=shared-memory,model-repository:admin-key=admin-value",
        "--grpc-restricted-protocol=statistics:stats-key=s",
        "--http-restricted-api=model-repository,health:admin-key=admin-value",
        wait=False,
    )
    server.wait_live()
    client = server.client()
    # Open protocols need nothing.
    assert client.is_server_live()
    assert client.get_model_metadata("echo_py").name == "echo_py"
    out = client.infer("echo_py", _inputs(3)).as_numpy("OUTPUT0")
    assert out.tolist() == [3.0]
    # Restricted ones need triton-grpc-protocol-<key>: <value>.
    key = "triton-grpc-protocol-admin-key"
    _refused(lambda: client.get_model_repository_index(), key)
    _refused(lambda: client.get_model_repository_index(headers={"admin-key": "admin-value"}), key)
    _refused(lambda: client.get_model_repository_index(headers={key: "wrong"}), key)
    _refused(lambda: client.get_system_shared_memory_status(), key)
    _refused(lambda: client.unregister_system_shared_memory(), key)
    _refused(lambda: client.get_inference_statistics("echo_py"), "triton-grpc-protocol-stats-key")
    index = client.get_model_repository_index(headers=ADMIN)
    assert [m.name for m in index.models] == ["echo_py"]
    assert client.get_system_shared_memory_status(headers=ADMIN) is not None
    stats = client.get_inference_statistics(
        "echo_py", headers={"triton-grpc-protocol-stats-key": "s"}
    )
    assert stats.model_stats[0].name == "echo_py"
    client.close()
    # triton-mp stat's queue status falls under `statistics` too; --header passes the key.
    url = server.url
    refused = run_stat("--url", url, "--json")
    assert refused.returncode == 1
    assert "triton-grpc-protocol-stats-key" in refused.stderr
    ok = run_stat("--url", url, "--json", "--header", "triton-grpc-protocol-stats-key=s")
    assert ok.returncode == 0, ok.stderr
    assert "echo_py" in ok.stdout

    base = f"http://{server.http_url}"
    r = requests.get(f"{base}/v2/health/ready", timeout=30)
    assert r.status_code == 403
    assert r.json() == {"error": "This API is restricted, expecting header 'admin-key'"}
    r = requests.post(f"{base}/v2/repository/index", timeout=30)
    assert r.status_code == 403
    headers = {"admin-key": "admin-value"}
    assert requests.get(f"{base}/v2/health/ready", headers=headers, timeout=30).status_code == 200
    r = requests.post(f"{base}/v2/repository/index", headers=headers, timeout=30)
    assert r.status_code == 200
    assert r.json()[0]["name"] == "echo_py"
    # Not restricted over HTTP: the two flags are independent.
    assert requests.get(f"{base}/v2/systemsharedmemory/status", timeout=30).status_code == 200
    r = requests.post(
        f"{base}/v2/models/echo_py/infer",
        json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [5]}]},
        timeout=30,
    )
    assert r.status_code == 200
    assert r.json()["outputs"][0]["data"] == [5.0]

    log = server.log()
    assert f"gRPC frontend listening on 127.0.0.1:{server.grpc_port}" in log
    assert f"HTTP frontend listening on 127.0.0.1:{server.http_port}" in log
    assert (
        "gRPC 'model-repository' protocol restricted to header triton-grpc-protocol-admin-key"
        in log
    )
    assert "HTTP 'health' API restricted to header admin-key" in log
    assert "admin-value" not in log, "the secret value is never logged"


def test_a_bad_restriction_flag_stops_the_start_with_tritons_message(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "echo_py", "none")
    server = ServerProcess(repo, tmp_path / "bad.log", "--grpc-restricted-protocol=bogus:k=v")
    try:
        assert server.proc.wait(timeout=60) == 1
        assert "unknown restricted protocol 'bogus'" in server.log()
    finally:
        server.stop()


@contextlib.contextmanager
def _object(key: str, size: int, owner_uid: int | None = None) -> Iterator[None]:
    obj = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=size)
    try:
        if owner_uid is not None:
            os.fchown(obj.fd, owner_uid, -1)
        obj.close_fd()
        yield
    finally:
        posix_ipc.unlink_shared_memory(key)


def test_client_shared_memory_only_maps_what_the_operator_allows(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "echo_py", "none")
    allowed = f"/triton_mp_{os.getpid()}_test_ok_"
    server = start_server(repo, "--allow-client-shm=true", "--client-shm-prefix", allowed)
    client = server.client()
    client.infer("echo_py", _inputs(1.5))  # the frontend's input arena exists now

    def refused(name: str, key: str, why: str) -> None:
        with pytest.raises(InferenceServerException) as e:
            client.register_system_shared_memory(name, key, 64)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert f"Unable to register shared memory region: '{name}' with key '{key}'" in str(
            e.value.message()
        )
        assert why in e.value.message()

    # The server's own input arena: other clients' tensors live there.
    own = "/" + next(n for n in list_objects(str(server.pid)) if f"_{server.pid}_f0p" in n)
    refused("steal", own, "one of this server's own objects")
    outside = f"/triton_mp_{os.getpid()}_test_elsewhere"
    with _object(outside, 64):
        refused("outside", outside, f"does not start with the allowed prefix '{allowed}'")
    if os.geteuid() == 0:
        foreign = f"{allowed}foreign"
        with _object(foreign, 64, owner_uid=4242):
            refused("foreign", foreign, "owned by uid 4242, not by the server's user (uid 0)")

    key = f"{allowed}in"
    handle = shm.create_shared_memory_region("in", key, 4, create_only=True)
    try:
        shm.set_shared_memory_region(handle, [np.array([7], np.float32)])
        client.register_system_shared_memory("in", key, 4)
        x = grpcclient.InferInput("INPUT0", [1], "FP32")
        x.set_shared_memory("in", 4)
        assert client.infer("echo_py", [x]).as_numpy("OUTPUT0").tolist() == [7.0]
        assert [r.name for r in client.get_system_shared_memory_status().regions.values()] == ["in"]
        client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(handle)
    client.close()
