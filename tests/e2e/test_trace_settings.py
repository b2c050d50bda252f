"""Trace settings at run time over HTTP and gRPC, side by side with the real Triton 2.51.

The same sequence of ``/v2[/models/<m>]/trace/setting`` requests (reads, per-model
overrides, ``null`` clears, refused values) and gRPC ``TraceSetting`` calls goes to
triton-mp and to tritonserver from ``.peers/`` (skipped where it is absent); every answer,
status and body, must be the same once the trace file paths are put aside. Then ``count``
and ``log-frequency`` on a live server: the traces land in ``<file>.<k>`` as Triton documents.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from google.protobuf import json_format

from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess, wait_for
from tests.helpers.triton_peer import start_triton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


HTTP_STEPS: list[tuple[str, str, object]] = [
    ("GET", "/v2/trace/setting", None),
    ("GET", "/v2/models/add_sub_py/trace/setting", None),
    ("POST", "/v2/models/add_sub_py/trace/setting", {"trace_rate": "5"}),
    ("POST", "/v2/trace/setting", {"trace_count": "7"}),
    ("GET", "/v2/models/add_sub_py/trace/setting", None),
    ("POST", "/v2/models/add_sub_py/trace/setting", {"trace_rate": None}),
    ("GET", "/v2/models/add_sub_py/trace/setting", None),
    ("POST", "/v2/trace/setting", {"trace_file": "/tmp/elsewhere.json"}),
    ("POST", "/v2/trace/setting", {"trace_level": ["OFF", "TIMESTAMPS"]}),
    ("POST", "/v2/trace/setting", {"trace_level": ["BOGUS"]}),
    ("POST", "/v2/trace/setting", {"trace_rate": "abc"}),
    ("POST", "/v2/trace/setting", {"trace_rate": "99999999999"}),
    ("POST", "/v2/trace/setting", {"trace_rate": "-1"}),
    ("POST", "/v2/trace/setting", {"trace_count": "-5"}),
    ("POST", "/v2/trace/setting", {"log_frequency": "x"}),
    ("POST", "/v2/trace/setting", {"trace_rate": "0"}),
    ("POST", "/v2/trace/setting", {"trace_level": ["OFF"]}),
    ("POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS", "TENSORS"]}),
    ("POST", "/v2/models/add_sub_py/trace/setting", {"log_frequency": "3", "trace_count": "2"}),
    ("GET", "/v2/models/add_sub_py/trace/setting", None),
    ("GET", "/v2/models/nosuch/trace/setting", None),
    ("POST", "/v2/models/nosuch/trace/setting", {}),
    ("PUT", "/v2/trace/setting", None),
    (
        "POST",
        "/v2/trace/setting",
        {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None},
    ),
    ("GET", "/v2/trace/setting", None),
]
GRPC_STEPS: list[tuple[str, dict]] = [
    ("", {}),
    ("add_sub_py", {"trace_rate": "3"}),
    ("add_sub_py", {"trace_rate": None}),
    ("", {"trace_file": "/tmp/y"}),
    ("", {"trace_level": ["OFF", "TIMESTAMPS"]}),
    ("", {"trace_rate": "abc"}),
    ("", {"trace_rate": ["1", "2"]}),
    ("", {"trace_count": "-5"}),
    ("nosuch", {}),
    ("", {"trace_rate": "1", "trace_level": None}),
]


def _flags(trace_file: Path) -> list[str]:
    return [
        "--trace-config",
        f"triton,file={trace_file}",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "rate=1",
    ]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trace_settings_repo")
    shutil.copytree(PROJECT_REPOSITORY / "add_sub_py", root / "add_sub_py")
    return root


@pytest.fixture(scope="module")
def triton(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The real tritonserver 2.51 with the same trace flags: (http, grpc) addresses."""
    tmp = tmp_path_factory.mktemp("triton_trace")
    with start_triton(repo, tmp / "triton.log", *_flags(tmp / "trace.json")) as peer:
        yield peer.http_url, peer.url


@pytest.fixture(scope="module")
def ours(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("ours_trace")
    server = ServerProcess(repo, tmp / "server.log", *_flags(tmp / "trace.json"))
    try:
        server.wait_live()
        yield server
    finally:
        server.stop()


def _normal(body: object) -> object:
    """Put the trace file path aside (each server has its own)."""
    if isinstance(body, dict) and "trace_file" in body:
        return {**body, "trace_file": "<file>"}
    return body


def _http_answers(http: str) -> list[tuple[int, object]]:
    out = []
    for method, path, body in HTTP_STEPS:
        data = None if body is None else json.dumps(body)
        r = requests.request(method, f"http://{http}{path}", data=data, timeout=10)
        out.append((r.status_code, _normal(r.json())))
    return out


def _grpc_answers(url: str) -> list[object]:
    client = grpcclient.InferenceServerClient(url)
    out: list[object] = []
    try:
        for model, settings in GRPC_STEPS:
            try:
                if settings:
                    r = client.update_trace_settings(model_name=model, settings=settings)
                else:
                    r = client.get_trace_settings(model_name=model)
                out.append(_normal(json_format.MessageToDict(r)["settings"]))
            except grpcclient.InferenceServerException as e:
                out.append((e.status(), e.message()))
        out.append("trace" in client.get_server_metadata().extensions)
    finally:
        client.close()
    return out


def _normal_grpc(answers: list[object]) -> list[object]:
    return [
        {k: ({"value": ["<file>"]} if k == "trace_file" else v) for k, v in a.items()}
        if isinstance(a, dict)
        else a
        for a in answers
    ]


def test_http_settings_answer_as_triton_does(ours: ServerProcess, triton: tuple[str, str]) -> None:
    mine = _http_answers(ours.http_url)
    theirs = _http_answers(triton[0])
    for step, a, b in zip(HTTP_STEPS, mine, theirs, strict=True):
        assert a == b, step


def test_grpc_settings_answer_as_triton_does(ours: ServerProcess, triton: tuple[str, str]) -> None:
    mine = _normal_grpc(_grpc_answers(ours.url))
    theirs = _normal_grpc(_grpc_answers(triton[1]))
    for step, a, b in zip([*GRPC_STEPS, "metadata"], mine, theirs, strict=True):
        assert a == b, step


def _infer(client: grpcclient.InferenceServerClient, n: int) -> None:
    x = np.ones((1, 16), np.float32)
    for i in range(n):
        ins = [
            grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
            grpcclient.InferInput("INPUT1", [1, 16], "FP32"),
        ]
        for t in ins:
            t.set_data_from_numpy(x)
        client.infer("add_sub_py", ins, request_id=str(i))


def test_rate_count_and_log_frequency_on_a_live_server(repo: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "t.json"
    server = ServerProcess(
        repo,
        tmp_path / "server.log",
        "--trace-config",
        f"triton,file={trace_file}",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "rate=2",
        "--trace-config",
        "triton,log-frequency=2",
    )
    try:
        server.wait_live()
        client = server.client()
        _infer(client, 8)  # every 2nd: requests 1, 3, 5, 7 -> two files of two traces
        # NOTE: a trace is written once its call ended in the server, just after the client
        # got its answer.
        wait_for(lambda: (tmp_path / "t.json.1").exists(), 10, "the second trace file")
        files = sorted(tmp_path.glob("t.json.*"))
        assert [f.name for f in files] == ["t.json.0", "t.json.1"]
        ids = [
            o["request_id"] for f in files for o in json.loads(f.read_text()) if "model_name" in o
        ]
        assert ids == ["1", "3", "5", "7"]
        # a count of 1 for the model: one more trace, written at once to the next file
        client.update_trace_settings(
            model_name="add_sub_py", settings={"trace_count": "1", "trace_rate": "1"}
        )
        _infer(client, 3)
        wait_for(lambda: (tmp_path / "t.json.2").exists(), 10, "the third trace file")
        last = json.loads((tmp_path / "t.json.2").read_text())
        assert [o["request_id"] for o in last if "model_name" in o] == ["0"]
        assert client.get_trace_settings(model_name="add_sub_py").settings["trace_count"].value == [
            "0"
        ]
        client.close()
    finally:
        assert server.stop() == 0
    assert not trace_file.exists()  # nothing left for the shutdown write


def test_restricted_trace_protocol(repo: Path, tmp_path: Path) -> None:
    """``trace`` as a restricted category: TraceSetting and /trace/setting need the header;
    inference does not."""
    server = ServerProcess(
        repo,
        tmp_path / "server.log",
        *_flags(tmp_path / "t.json"),
        "--grpc-restricted-protocol=trace:tk=tv",
        "--http-restricted-api=trace:tk=tv",
    )
    try:
        server.wait_live()
        client = server.client()
        with pytest.raises(grpcclient.InferenceServerException) as e:
            client.get_trace_settings()
        assert e.value.status() == "StatusCode.UNAVAILABLE"
        assert e.value.message() == (
            "This protocol is restricted, expecting header 'triton-grpc-protocol-tk'"
        )
        ok = client.get_trace_settings(headers={"triton-grpc-protocol-tk": "tv"})
        assert list(ok.settings["trace_rate"].value) == ["1"]
        _infer(client, 1)
        client.close()
        base = f"http://{server.http_url}/v2/trace/setting"
        r = requests.post(base, data='{"trace_rate": "2"}', timeout=10)
        assert r.status_code == 403
        assert r.json() == {"error": "This API is restricted, expecting header 'tk'"}
        r = requests.post(base, data='{"trace_rate": "2"}', headers={"tk": "tv"}, timeout=10)
        assert r.json()["trace_rate"] == "2"
    finally:
        assert server.stop() == 0


def test_settings_are_the_servers_whichever_frontend_answers(repo: Path, tmp_path: Path) -> None:
    """With two frontend processes sharing the ports, an update made on one is applied by
    the other (``TraceSettingUpdate`` on the peer rings): every later read agrees."""
    server = ServerProcess(
        repo, tmp_path / "server.log", *_flags(tmp_path / "t.json"), "--frontend-processes", "2"
    )
    try:
        server.wait_live()
        base = f"http://{server.http_url}/v2"
        r = requests.post(
            f"{base}/models/add_sub_py/trace/setting", data='{"trace_rate": "7"}', timeout=10
        )
        assert r.json()["trace_rate"] == "7"
        r = requests.post(f"{base}/trace/setting", data='{"trace_count": "9"}', timeout=10)
        assert r.json()["trace_count"] == "9"

        def both() -> bool:
            # NOTE: a new connection each time: SO_REUSEPORT spreads them over the frontends.
            answers = {
                (
                    requests.get(f"{base}/models/add_sub_py/trace/setting", timeout=10).json()[
                        "trace_rate"
                    ],
                    requests.get(f"{base}/trace/setting", timeout=10).json()["trace_count"],
                )
                for _ in range(16)
            }
            return answers == {("7", "9")}

        wait_for(both, 10, "every frontend to apply the update")
        pids = {
            requests.get(f"{base}/trace/setting", timeout=10).headers.get("Server")
            for _ in range(4)
        }
        assert pids  # (the answer carries no frontend id; the agreement above is the check)
    finally:
        assert server.stop() == 0
