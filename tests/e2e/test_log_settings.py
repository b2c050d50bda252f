"""Log settings at run time (Triton's ``logging`` extension) over HTTP and gRPC, side by side
with the real Triton 2.51, and applied to the whole server.

The same sequence of ``GET|POST /v2/logging`` requests and tritonclient ``get_log_settings``
/ ``update_log_settings`` calls goes to triton-mp and to tritonserver from ``.peers/``
(skipped where it is absent); every answer (status and body, or gRPC status and text) must be
the same. Then, on a server with two frontends, a verbose level set at one frontend shows in
the scheduler's and the worker's lines of the server log, and every frontend answers the new
settings; turned back off, those lines stop.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format

from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess, wait_for
from tests.helpers.triton_peer import start_triton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HTTP_STEPS: list[tuple[str, object]] = [
    ("GET", None),
    ("POST", {"log_verbose_level": 1}),
    ("POST", {"log_info": "yes"}),
    ("POST", {"log_file": "/tmp/elsewhere.log"}),
    ("POST", {"log_file": None, "log_error": False}),
    ("POST", {"log_format": "json"}),
    ("POST", {"log_format": 7}),
    ("POST", {"log_format": "ISO8601"}),
    ("POST", {"log_format": "default"}),
    ("POST", {"log_warning": False, "log_verbose_level": "3"}),
    ("GET", None),
    ("POST", {"bogus": 1}),
    ("POST", {"log_verbose_level": -1}),
    ("POST", {"log_info": None}),
    ("PUT", None),
    ("POST", {"log_warning": True, "log_error": True, "log_verbose_level": 0}),
    ("GET", None),
]
GRPC_STEPS: list[dict[str, object]] = [
    {},
    {"log_verbose_level": 2},
    {"log_info": None},
    {"log_verbose_level": None},
    {"log_format": None},
    {"log_file": "/tmp/x"},
    {"log_file": None},
    {"log_format": "json"},
    {"log_info": False, "log_format": "bogus"},
    {"log_format": "ISO8601", "log_warning": False},
    {"log_format": "default", "log_info": True, "log_warning": True, "log_verbose_level": 0},
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("log_settings_repo")
    shutil.copytree(PROJECT_REPOSITORY / "add_sub_py", root / "add_sub_py")
    return root


@pytest.fixture(scope="module")
def triton(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The real tritonserver 2.51: (http, grpc) addresses."""
    with start_triton(repo, tmp_path_factory.mktemp("triton_log") / "triton.log") as peer:
        yield peer.http_url, peer.url


@pytest.fixture(scope="module")
def ours(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("ours_log")
    server = ServerProcess(repo, tmp / "server.log", "--frontend-processes", "2")
    try:
        server.wait_live()
        yield server
    finally:
        server.stop()


def _http_answers(http: str) -> list[tuple[int, object]]:
    out = []
    for method, body in HTTP_STEPS:
        data = None if body is None else json.dumps(body)
        r = requests.request(method, f"http://{http}/v2/logging", data=data, timeout=10)
        out.append((r.status_code, r.json()))
    return out


def _grpc_answers(url: str) -> list[object]:
    client = grpcclient.InferenceServerClient(url)
    out: list[object] = []
    try:
        for settings in GRPC_STEPS:
            try:
                if settings:
                    r = client.update_log_settings(settings=settings)
                else:
                    r = client.get_log_settings()
                out.append(json_format.MessageToDict(r)["settings"])
            except grpcclient.InferenceServerException as e:
                out.append((e.status(), e.message()))
        out.append("logging" in client.get_server_metadata().extensions)
    finally:
        client.close()
    return out


def test_http_answers_as_triton_does(ours: ServerProcess, triton: tuple[str, str]) -> None:
    mine = _http_answers(ours.http_url)
    theirs = _http_answers(triton[0])
    for step, a, b in zip(HTTP_STEPS, mine, theirs, strict=True):
        assert a == b, step


def test_grpc_answers_as_triton_does(ours: ServerProcess, triton: tuple[str, str]) -> None:
    mine = _grpc_answers(ours.url)
    theirs = _grpc_answers(triton[1])
    for step, a, b in zip([*GRPC_STEPS, "metadata"], mine, theirs, strict=True):
        assert a == b, step


def test_http_client_reads_and_updates(ours: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(ours.http_url)
    try:
        assert client.update_log_settings({"log_verbose_level": 4})["log_verbose_level"] == 4
        assert client.get_log_settings()["log_verbose_level"] == 4
        with pytest.raises(httpclient.InferenceServerException, match="log file location"):
            client.update_log_settings({"log_file": "x.log"})
        assert client.update_log_settings({"log_verbose_level": 0})["log_verbose_level"] == 0
    finally:
        client.close()


def _infer(client: grpcclient.InferenceServerClient, n: int) -> None:
    x = np.ones((1, 16), np.float32)
    for _ in range(n):
        ins = [
            grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
            grpcclient.InferInput("INPUT1", [1, 16], "FP32"),
        ]
        for t in ins:
            t.set_data_from_numpy(x)
        client.infer("add_sub_py", ins)


def _lines(log: str, role: str, words: str) -> list[str]:
    return [line for line in log.splitlines() if f"role={role}" in line and words in line]


def test_verbose_level_reaches_every_process(ours: ServerProcess) -> None:
    client = ours.client()
    try:
        _infer(client, 2)
        assert not _lines(ours.log(), "worker", "started:")  # verbose 0: no batch detail
        client.update_log_settings(settings={"log_verbose_level": 1})
        # every frontend answers the new level (fresh connections reach either one)
        for _ in range(8):
            r = requests.get(f"http://{ours.http_url}/v2/logging", timeout=10)
            assert r.json()["log_verbose_level"] == 1
        _infer(client, 3)
        wait_for(lambda: len(_lines(ours.log(), "worker", "started:")) >= 3, 10, "worker lines")
        assert len(_lines(ours.log(), "scheduler", "batch size")) >= 3
        client.update_log_settings(settings={"log_verbose_level": 0, "log_info": False})
        for _ in range(8):
            r = requests.get(f"http://{ours.http_url}/v2/logging", timeout=10)
            assert r.json()["log_verbose_level"] == 0
            assert r.json()["log_info"] is False
        log = ours.log()
        worker, scheduler = (
            _lines(log, "worker", "started:"),
            _lines(log, "scheduler", "batch size"),
        )
        _infer(client, 3)
        # NOTE: the update reached the scheduler and the worker before these requests did
        # (the frontend sent it before answering; each ring keeps its order).
        log = ours.log()
        assert _lines(log, "worker", "started:") == worker
        assert _lines(log, "scheduler", "batch size") == scheduler
    finally:
        client.update_log_settings(settings={"log_info": True})
        client.close()


def test_start_up_flags_set_the_settings(repo: Path, tmp_path: Path) -> None:
    """``--log-info=false --log-verbose=1 --log-format=ISO8601``: answered as Triton answers
    them, and no INFO line from any process; then info turned on at run time brings them
    back."""
    flags = ("--log-info=false", "--log-verbose=1", "--log-format=ISO8601")
    with start_triton(repo, tmp_path / "triton.log", *flags) as peer:
        theirs = requests.get(f"http://{peer.http_url}/v2/logging", timeout=10).json()
    server = ServerProcess(repo, tmp_path / "server.log", *flags)
    try:
        server.wait_live()
        mine = requests.get(f"http://{server.http_url}/v2/logging", timeout=10).json()
        assert mine == theirs
        assert mine["log_info"] is False
        client = server.client()
        _infer(client, 1)
        wait_for(lambda: bool(_lines(server.log(), "worker", "started:")), 10, "a debug line")
        assert not [line for line in server.log().splitlines() if "[info" in line]
        client.update_log_settings(settings={"log_info": True})
        client.close()
    finally:
        server.stop()
    # the shutdown lines (supervisor, scheduler, workers) are INFO again
    roles = {r for r in ("supervisor", "scheduler", "worker") if _lines(server.log(), r, "[info")}
    assert roles == {"supervisor", "scheduler", "worker"}


def _worker_pids(log: str) -> set[str]:
    return {
        part[4:]
        for line in _lines(log, "worker", "loading model")
        for part in line.split()
        if part.startswith("pid=")
    }


def test_a_restarted_worker_starts_with_the_clients_settings(repo: Path, tmp_path: Path) -> None:
    """Info turned off by a client, then the worker killed: the supervisor starts the new
    one with info off, so even its load lines (before the scheduler talks to it) are not
    written; the per-batch lines of the verbose level the client set are."""
    server = ServerProcess(repo, tmp_path / "server.log")
    try:
        server.wait_live()
        client = server.client()
        (old,) = _worker_pids(server.log())
        client.update_log_settings(settings={"log_info": False, "log_verbose_level": 1})
        os.kill(int(old), signal.SIGKILL)
        start = len(_lines(server.log(), "worker", "started:"))

        def served() -> bool:
            try:
                _infer(client, 1)
            except grpcclient.InferenceServerException:
                return False
            return len(_lines(server.log(), "worker", "started:")) > start

        wait_for(served, 60, "the restarted worker")
        assert _worker_pids(server.log()) == {old}  # the new one wrote no INFO line
        client.close()
    finally:
        server.stop()


def test_log_file_takes_every_process_log_as_tritons_does(repo: Path, tmp_path: Path) -> None:
    """``--log-file``: ``log_file`` answers the path, as 2.51 does, and the lines of every
    process (supervisor, frontend, scheduler, worker) go to the end of that file, not to the
    console; a file that cannot be opened leaves the log on the console and ``log_file`` ""
    (2.51: the same, silently; we warn once)."""
    theirs = {}
    for case, path in (("file", tmp_path / "triton_file.log"), ("bad", tmp_path / "no/dir.log")):
        with start_triton(repo, tmp_path / f"triton_{case}.log", f"--log-file={path}") as peer:
            theirs[case] = requests.get(f"http://{peer.http_url}/v2/logging", timeout=10).json()
    assert theirs["file"]["log_file"] == str(tmp_path / "triton_file.log")
    assert theirs["bad"]["log_file"] == ""

    target = tmp_path / "ours_file.log"
    target.write_text("a line from before\n")  # appended to, as std::ios::app
    server = ServerProcess(
        repo, tmp_path / "console.log", f"--log-file={target}", "--log-verbose", "1"
    )
    try:
        server.wait_live()
        mine = requests.get(f"http://{server.http_url}/v2/logging", timeout=10).json()
        assert mine == {**theirs["file"], "log_verbose_level": 1, "log_file": str(target)}
        client = server.client()
        _infer(client, 1)
        client.close()
        wait_for(lambda: bool(_lines(target.read_text(), "worker", "started:")), 10, "a line")
    finally:
        server.stop()
    text = target.read_text()
    assert text.startswith("a line from before\n")
    for role in ("supervisor", "frontend", "scheduler", "worker"):
        assert _lines(text, role, "["), role
        assert not _lines(server.log(), role, "["), role

    bad = ServerProcess(repo, tmp_path / "bad_console.log", f"--log-file={tmp_path}/no/dir.log")
    try:
        bad.wait_live()
        mine = requests.get(f"http://{bad.http_url}/v2/logging", timeout=10).json()
        assert mine == theirs["bad"]
    finally:
        bad.stop()
    assert "failed to open log file" in bad.log()
    assert _lines(bad.log(), "scheduler", "[info")
