"""Model states in explicit model control, side by side with the real Triton 2.51 (when
``.peers/`` has it): a model that failed to load keeps its failed version through an
unload (RepositoryIndex lists it with its reason, and ``--strict-readiness`` keeps the
server not ready), as core ``InferenceServer::IsReady`` and the model lifecycle do.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import write_python_model
from tests.server import ServerProcess
from tests.triton_peer import RealTriton, peers_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

FAILS = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("boom")

    def execute(self, requests):
        return []
"""
CONFIG = """
name: "%s"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """HTTP addresses: ``triton-mp`` always, ``triton`` when the real Triton is installed."""
    repo = tmp_path_factory.mktemp("states") / "repo"
    write_python_model(repo, "fails", CONFIG % "fails", FAILS)
    logs = tmp_path_factory.mktemp("logs")
    flags = ("--model-control-mode=explicit", "--strict-readiness=true")
    ours = ServerProcess(repo, logs / "ours.log", *flags)
    theirs: RealTriton | None = None
    try:
        ours.wait_live()
        urls = {"triton-mp": ours.http_url, "triton-mp-grpc": ours.url}
        env = peers_env()
        if env is not None:
            theirs = RealTriton(env, logs / "triton.log", f"--model-repository={repo}", *flags)
            theirs.wait_live()
            urls["triton"] = theirs.http_url
        yield urls
    finally:
        ours.stop()
        if theirs is not None:
            theirs.stop()


def _grpc_url(servers: dict[str, str]) -> str:
    return servers["triton-mp-grpc"]


def _http(servers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in servers.items() if not k.endswith("-grpc")}


def call(url: str, method: str, path: str) -> tuple[int, object]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=b"")
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    return r.status, json.loads(data) if data else None


def _index(url: str) -> list[tuple[str, str, str, bool]]:
    """(name, version, state, whether the reason mentions the load error) per row."""
    status, rows = call(url, "POST", "/v2/repository/index")
    assert status == 200
    assert isinstance(rows, list)
    return [
        (r["name"], r.get("version", ""), r.get("state", ""), "boom" in r.get("reason", ""))
        for r in rows
    ]


def test_unloading_a_model_that_failed_keeps_the_server_not_ready(
    servers: dict[str, str],
) -> None:
    for server, url in _http(servers).items():
        assert call(url, "GET", "/v2/health/ready")[0] == 200, server
        status, body = call(url, "POST", "/v2/repository/models/fails/load")
        assert status == 400, server  # Triton: INVALID_ARG
        assert isinstance(body, dict)
        assert body["error"].startswith(
            "load failed for model 'fails': version 1 is at UNAVAILABLE state: "
        ), server
        assert body["error"].endswith(";\n"), server
        assert call(url, "GET", "/v2/health/ready")[0] == 400, server
        assert _index(url) == [("fails", "1", "UNAVAILABLE", True)], server
        assert call(url, "POST", "/v2/repository/models/fails/unload")[0] == 200, server
        # core IsReady: a version not READY for a reason other than "unloaded" is not ready
        assert call(url, "GET", "/v2/health/ready")[0] == 400, server
        assert _index(url) == [("fails", "1", "UNAVAILABLE", True)], server
        assert call(url, "GET", "/v2/models/fails/ready")[0] == 400, server


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a/b", "invalid model name 'a/b', model name must not contain path traversal characters"),
        ("..", "invalid model name '..', model name must not contain path traversal characters"),
        (" ", "Model name cannot be empty. Please enter a valid name to deploy."),
    ],
)
def test_a_load_names_one_model_directory(servers: dict[str, str], name: str, message: str) -> None:
    """core ``ValidateModelName`` (upstream main, 2026; 2.51 predates it): triton-mp only."""
    client = grpcclient.InferenceServerClient(_grpc_url(servers))
    with pytest.raises(InferenceServerException) as e:
        client.load_model(name)
    assert (e.value.status(), e.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)


def test_load_files_stay_within_the_model_directory(
    servers: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """core LocalizeRepoAgent (upstream main, 2026): a ``file:`` path that leaves the model
    directory once normalised is refused; one that stays inside (even written absolute)
    is fine."""
    client = grpcclient.InferenceServerClient(_grpc_url(servers))
    config = json.dumps({"backend": "python", "max_batch_size": 0})
    with pytest.raises(InferenceServerException) as e:
        client.load_model("fails", config=config, files={"file:1/../../evil.py": b"x"})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message().startswith(
        "Invalid file parameter 'file:1/../../evil.py' with normalized path '"
    )
    assert e.value.message().endswith("/evil.py' must stay within model directory.")
    assert "/fails/" not in e.value.message()
    # inside: the load goes on (and fails in the model's own initialize, as before)
    with pytest.raises(InferenceServerException) as e2:
        client.load_model("fails", config=config, files={"file:/1/model.py": FAILS.encode()})
    assert "load failed for model 'fails'" in e2.value.message()


SLOW = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(4)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def test_a_version_draining_during_an_unload_is_unloading(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """While an unloaded model answers what it was running, RepositoryIndex lists its
    version UNLOADING (Triton's lifecycle state), then UNAVAILABLE "unloaded"."""
    repo = tmp_path_factory.mktemp("unloading") / "repo"
    write_python_model(repo, "slow", CONFIG % "slow", SLOW)
    server = ServerProcess(
        repo, repo.parent / "ours.log", "--model-control-mode=explicit", "--load-model=slow"
    )
    try:
        server.wait_live()
        client = server.client()
        inp = grpcclient.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(np.ones(4, np.float32))
        done: dict[str, object] = {}
        infer = threading.Thread(target=lambda: done.update(r=client.infer("slow", [inp])))
        infer.start()
        time.sleep(1.0)  # NOTE: the request is in execute now
        unload = threading.Thread(target=lambda: client.unload_model("slow"))
        unload.start()
        states: set[str] = set()
        deadline = time.monotonic() + 15
        while unload.is_alive() and time.monotonic() < deadline:
            states |= {r[2] for r in _index(server.http_url) if r[1] == "1"}
            time.sleep(0.1)
        unload.join(timeout=30)
        infer.join(timeout=30)
        assert "UNLOADING" in states
        assert _index(server.http_url) == [("slow", "1", "UNAVAILABLE", False)]
        assert "r" in done  # the request in flight was answered
    finally:
        server.stop()
