"""Model states in explicit model control, side by side with the real Triton 2.51 (when
``.peers/`` has it): a model that failed to load keeps its failed version through an
unload (RepositoryIndex lists it with its reason, and ``--strict-readiness`` keeps the
server not ready), as core ``InferenceServer::IsReady`` and the model lifecycle do.
"""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, wait_for, wait_queued
from tests.helpers.triton_peer import RealTriton, peers_env

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
        env = peers_env()
        if env is not None:  # NOTE: started before ours is live: side by side
            theirs = RealTriton(env, logs / "triton.log", f"--model-repository={repo}", *flags)
        ours.wait_live()
        urls = {"triton-mp": ours.http_url, "triton-mp-grpc": ours.url}
        if theirs is not None:
            theirs.wait_live()
            urls["triton"] = theirs.http_url
        yield urls
    finally:
        if theirs is not None:
            theirs.stop(wait=False)
        ours.stop()


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


GATED = """
import os
import time
import triton_python_backend_utils as pb_utils

GATE = "GATE_PATH"

class TritonPythonModel:
    def execute(self, requests):
        # NOTE: held until the test opens the gate (creates the file), at most 30 s
        deadline = time.monotonic() + 30
        while not os.path.exists(GATE) and time.monotonic() < deadline:
            time.sleep(0.02)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def gated(gate: Path) -> str:
    """A python model whose execute holds each batch until the file ``gate`` exists (at
    most 30 s): a request stays in flight exactly until the test has seen what it needs,
    instead of for a fixed sleep long enough for a loaded machine."""
    return GATED.replace("GATE_PATH", str(gate))


def test_a_version_draining_during_an_unload_is_unloading(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """While an unloaded model answers what it was running, RepositoryIndex lists its
    version UNLOADING (Triton's lifecycle state), then UNAVAILABLE "unloaded"."""
    repo = tmp_path_factory.mktemp("unloading") / "repo"
    gate = repo.parent / "gate"
    write_python_model(repo, "slow", CONFIG % "slow", gated(gate))
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
        wait_queued(server.url, "slow")  # NOTE: the request is in execute now
        client.unload_model("slow")  # NOTE: it answers at once, as Triton's does
        states = {r[2] for r in _index(server.http_url) if r[1] == "1"}
        gate.touch()
        infer.join(timeout=30)
        assert states == {"UNLOADING"}
        assert "r" in done  # the request in flight was answered
        wait_for(
            lambda: _index(server.http_url) == [("slow", "1", "UNAVAILABLE", False)],
            30,
            "slow UNAVAILABLE once its request was answered",
        )
    finally:
        gate.touch()
        server.stop()


LATEST_ONE = CONFIG % "slow_v" + "version_policy: { latest: { num_versions: 1 } }\n"


def _reload_drain_states(url: str, grpc_url: str, repo: Path, gate: Path) -> dict[str, object]:
    """Hold a request in flight on version 1 of ``slow_v`` (until ``gate`` exists), add
    version 2 and load it (``latest: 1`` retires version 1); meanwhile record the index rows
    of version 1, its ModelReady and the answer to a request naming it; then let the held
    request finish."""
    client = grpcclient.InferenceServerClient(grpc_url)
    inp = grpcclient.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(np.ones(4, np.float32))
    seen: dict[str, object] = {"states": set()}
    try:
        client.load_model("slow_v")

        def held() -> None:
            try:
                seen["r"] = client.infer("slow_v", [inp], model_version="1")
            except InferenceServerException as e:
                seen["r"] = (e.status(), e.message())

        infer = threading.Thread(target=held)
        infer.start()
        held_since = time.monotonic()
        time.sleep(1.0)  # NOTE: the request is in execute now (the real Triton has no QueueStatus)
        shutil.copytree(repo / "slow_v" / "1", repo / "slow_v" / "2")
        load = threading.Thread(target=lambda: client.load_model("slow_v"))
        load.start()
        while infer.is_alive():
            rows = {r[1]: r[2] for r in _index(url) if r[0] == "slow_v"}
            seen["states"].add(rows.get("1", ""))  # type: ignore[attr-defined]
            if rows.get("1") == "UNLOADING" and rows.get("2") == "READY" and "v1" not in seen:
                seen["ready1"] = client.is_model_ready("slow_v", "1")
                seen["server_ready"] = client.is_server_ready()
                try:
                    client.infer("slow_v", [inp], model_version="1")
                    seen["v1"] = "answered"
                except InferenceServerException as e:
                    seen["v1"] = (e.status(), e.message())
            if "v1" in seen or time.monotonic() - held_since > 25:
                gate.touch()
            time.sleep(0.05)
        infer.join(timeout=30)
        load.join(timeout=30)
        # NOTE: Triton ends the unload a moment after the last request let go of version 1
        deadline = time.monotonic() + 10
        while True:
            status, rows = call(url, "POST", "/v2/repository/index")
            seen["after"] = rows
            if time.monotonic() > deadline or "UNLOADING" not in json.dumps(rows):
                break
            time.sleep(0.1)
    finally:
        gate.touch()
        client.close()
    return seen


def test_a_version_retired_by_a_reload_is_unloading_while_its_requests_finish(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Triton's lifecycle: a version a reload retires (``latest: 1``, version 2 added) is
    UNLOADING while its in-flight request finishes, then UNAVAILABLE "unloaded"; meanwhile it
    is not ready, nor is the (strict) server, and a request naming it gets UNAVAILABLE "... is
    not at ready state" (before: UNAVAILABLE "unloaded" at once). Side by side with 2.51.
    NOTE: Triton's load answers once version 2 is ready; triton-mp's after the drain."""
    results = {}
    env = peers_env()
    for which in ("triton-mp", "triton") if env is not None else ("triton-mp",):
        repo = tmp_path_factory.mktemp(f"reload-{which}") / "repo"
        gate = repo.parent / "gate"
        write_python_model(repo, "slow_v", LATEST_ONE, gated(gate))
        flags = ("--model-control-mode=explicit",)
        if which == "triton-mp":
            server: ServerProcess | RealTriton = ServerProcess(repo, repo.parent / "s.log", *flags)
        else:
            assert env is not None
            server = RealTriton(env, repo.parent / "t.log", f"--model-repository={repo}", *flags)
        try:
            server.wait_live()
            results[which] = _reload_drain_states(server.http_url, server.url, repo, gate)
        finally:
            server.stop()
    for which, seen in results.items():
        assert "UNLOADING" in seen["states"], (which, seen)  # type: ignore[operator]
        assert seen["ready1"] is False, which
        # core IsReady (strict readiness): a version not READY whose reason is not "unloaded"
        assert seen["server_ready"] is False, which
        assert seen["v1"] == (
            "StatusCode.UNAVAILABLE",
            "Request for unknown model: 'slow_v' version 1 is not at ready state",
        ), which
        assert isinstance(seen["r"], grpcclient.InferResult), (which, seen["r"])  # answered
        assert seen["after"] == [
            {"name": "slow_v", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
            {"name": "slow_v", "version": "2", "state": "READY"},
        ], which


def test_the_last_answer_of_a_retired_version_is_read_after_its_worker_was_told_to_stop(
    tmp_path: Path,
) -> None:
    """A retired version's worker is stopped on its last ``BatchDone``, which can reach the
    scheduler before the frontend has read the answer (CI saw UNKNOWN "No shared memory
    exists ..." for the in-flight request of this file's reload test). Here the frontend
    is held still (SIGSTOP) across the end of that request: its answer must still be read
    from the worker's arena, which the worker keeps until its readers are done."""
    repo = tmp_path / "repo"
    gate = tmp_path / "gate"
    write_python_model(repo, "slow_v", LATEST_ONE, gated(gate))
    server = ServerProcess(
        repo, tmp_path / "s.log", "--model-control-mode=explicit", "--heartbeat-timeout-secs=120"
    )
    frontend = None
    try:
        server.wait_live()
        client = grpcclient.InferenceServerClient(server.url)
        client.load_model("slow_v")
        inp = grpcclient.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(np.arange(4, dtype=np.float32))
        got: dict[str, object] = {}

        def held() -> None:
            try:
                got["r"] = client.infer("slow_v", [inp], model_version="1").as_numpy("OUTPUT0")
            except InferenceServerException as e:
                got["r"] = (e.status(), e.message())

        infer = threading.Thread(target=held)
        infer.start()
        wait_queued(server.url, "slow_v")  # NOTE: in execute now, until the gate opens
        shutil.copytree(repo / "slow_v" / "1", repo / "slow_v" / "2")
        load = threading.Thread(target=lambda: client.load_model("slow_v"))
        load.start()
        wait_for(
            lambda: (
                {r[1]: r[2] for r in _index(server.http_url) if r[0] == "slow_v"}.get("2")
                == "READY"
            ),
            30,
            "version 2 to be ready",
        )
        (frontend,) = [
            p
            for p in psutil.Process(server.pid).children(recursive=True)
            if p.cmdline() and p.cmdline()[0].startswith("triton-mp: frontend")
        ]
        frontend.send_signal(signal.SIGSTOP)
        gate.touch()
        time.sleep(1.5)  # NOTE: past the answer and its BatchDone
        frontend.send_signal(signal.SIGCONT)
        frontend = None
        infer.join(timeout=30)
        load.join(timeout=30)
        assert not isinstance(got.get("r"), tuple), got
        np.testing.assert_array_equal(got["r"], np.arange(4, dtype=np.float32))
        client.close()
    finally:
        gate.touch()
        if frontend is not None:
            frontend.send_signal(signal.SIGCONT)
        server.stop()
