"""HTTP/REST end to end, errors: every bad request's status and Triton's JSON body, the
validation messages against gRPC's, system shared memory over HTTP, and the servers of their
own (two frontends on one port and their drain, abandoned requests, ``--allow-http=false``, a
taken port). Same repository as test_http.py (``tests.helpers.http_repo``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.helpers.http_repo import (
    add_sub_inputs,
    grpc_error,
    raw_http,
    sleep_repo,
)
from tests.helpers.repos import copy_models
from tests.helpers.server import (
    ServerProcess,
    free_port,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def server(http_repo_server: ServerProcess) -> ServerProcess:
    """tests/e2e/conftest.py's server of tests.helpers.http_repo's repository."""
    return http_repo_server


# ------------------------------------------------------------------------------ errors


def _json_infer(inputs: list[dict[str, Any]], **extra: Any) -> str:
    return json.dumps({"inputs": inputs, **extra})


ONES = [1.0] * 16
GOOD = [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ONES},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": ONES},
]

ERRORS = [
    # (method, path, body, headers, status, message or prefix + "...")
    ("GET", "/v2/nothing", None, {}, 404, "Not Found"),
    ("GET", "/v2/models/add_sub/versions/x", None, {}, 404, "Not Found"),
    ("GET", "/v2/health", None, {}, 404, "Not Found"),
    ("POST", "/v2", None, {}, 405, "Method Not Allowed"),
    ("POST", "/v2/health/ready", None, {}, 405, "Method Not Allowed"),
    ("GET", "/v2/models/add_sub/infer", None, {}, 405, "Method Not Allowed"),
    ("PUT", "/v2/models/add_sub", None, {}, 405, "Method Not Allowed"),
    ("GET", "/v2/repository/index", None, {}, 405, "Method Not Allowed"),
    ("POST", "/v2/models/stats", None, {}, 405, "Method Not Allowed"),
    ("POST", "/v2/systemsharedmemory/status", None, {}, 405, "Method Not Allowed"),
    ("GET", "/v2/systemsharedmemory/register", None, {}, 405, "Method Not Allowed"),
    ("GET", "/v2/models/nope", None, {}, 404, "Request for unknown model: 'nope' is not found"),
    (
        "GET",
        "/v2/models/add_sub/versions/9",
        None,
        {},
        404,
        "Request for unknown model: 'add_sub' version 9 is not found",
    ),
    (
        "GET",
        "/v2/models/broken/config",
        None,
        {},
        404,
        "Request for unknown model: 'broken' has no available versions",
    ),
    (
        "POST",
        "/v2/models/nope/infer",
        _json_infer(GOOD),
        {},
        404,
        "Request for unknown model: 'nope' is not found",
    ),
    (
        "POST",
        "/v2/models/decoupled_add_sub/infer",
        _json_infer(GOOD),
        {},
        501,
        "HTTP end point doesn't support models with decoupled transaction policy",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        _json_infer([GOOD[0], {**GOOD[1], "name": "INPUT9"}]),
        {},
        400,
        "unexpected inference input 'INPUT9' for model 'add_sub'",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        _json_infer([GOOD[0], {**GOOD[1], "datatype": "FP64"}]),
        {},
        400,
        "[request id: <id_unknown>] inference input 'INPUT1' data-type is 'FP64', but model "
        "'add_sub' expects 'FP32'",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        # NOTE: [16] reads as a batch of 16, and Triton's core checks the batch size before any
        # shape (2.51 answers exactly this for add_sub_py, checked by hand on 2026-12-06)
        _json_infer([{**t, "shape": [16]} for t in GOOD]),
        {},
        400,
        "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'add_sub'",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        _json_infer([GOOD[0]], id="q"),
        {},
        400,
        "[request id: q] expected 2 inputs but got 1 inputs for model 'add_sub'...",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        _json_infer(GOOD, outputs=[{"name": "OUTPUT7"}]),
        {},
        400,
        "unexpected inference output 'OUTPUT7' for model 'add_sub'",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        _json_infer([GOOD[0], {**GOOD[1], "datatype": "FP16"}]),
        {},
        400,
        "receiving FP16 data via JSON is not supported. Please use the binary data format for "
        "input INPUT1",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        _json_infer([GOOD[0], {**GOOD[1], "data": ONES[:3]}]),
        {},
        500,  # NOTE: Triton's status for it (test_triton_http_messages runs it side by side)
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        '{"inputs": [',
        {},
        500,
        "failed to parse the request JSON buffer: Invalid value. at 12",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        _json_infer(GOOD, parameters={"triton_x": True}),
        {},
        400,
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
        "specified.",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        _json_infer(GOOD),
        {"Inference-Header-Content-Length": "abc"},
        400,
        "Unable to parse Inference-Header-Content-Length, got: abc",
    ),
    (
        "POST",
        "/v2/models/add_sub/infer",
        _json_infer(GOOD),
        {"Inference-Header-Content-Length": "999999"},
        400,
        f"inference header size should be in range (0, {len(_json_infer(GOOD))}), got: 999999",
    ),
    (
        "POST",
        "/v2/models/add_sub/generate",
        "{}",
        {},
        501,
        "the generate extension is not supported by triton-mp",
    ),
    (
        "POST",
        "/v2/trace/setting",
        '{"trace_file": "/tmp/x"}',
        {},
        501,
        "trace file location can not be updated through network protocol",
    ),
    (
        "POST",
        "/v2/models/add_sub/trace/setting",
        '{"trace_level": ["OFF", "TIMESTAMPS"]}',
        {},
        400,
        "Expect only one trace level 'OFF' is specified",
    ),
    (
        "POST",
        "/v2/logging",
        '{"log_file": "/tmp/x"}',
        {},
        501,
        "log file location can not be updated through network protocol",
    ),
    (
        "POST",
        "/v2/logging",
        '{"log_format": "json"}',
        {},
        503,
        "invalid argument for --log_format, got: json",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "message"),
    ERRORS,
    ids=[f"{e[0]} {e[1]} {e[4]} {e[5][:30]}" for e in ERRORS],
)
def test_errors_have_tritons_status_and_json_body(
    server: ServerProcess,
    method: str,
    path: str,
    body: str | None,
    headers: dict[str, str],
    status: int,
    message: str,
) -> None:
    r = raw_http(server, method, path, body, headers)
    assert r.status == status, r.body
    if message.endswith("..."):
        assert r.error.startswith(message[:-3])
    else:
        assert r.error == message


def test_validation_messages_equal_grpc(
    server: ServerProcess, gc: grpcclient.InferenceServerClient
) -> None:
    """The shared validator answers both transports with the same message."""
    a = np.ones((1, 16), np.float32)
    g = add_sub_inputs(grpcclient, a, a)[:1]
    grpc_msg = grpc_error(gc, lambda: gc.infer("add_sub", g))
    r = raw_http(server, "POST", "/v2/models/add_sub/infer", _json_infer([GOOD[0]]))
    assert r.error == grpc_msg
    big = add_sub_inputs(grpcclient, np.ones((9, 16), np.float32), np.ones((9, 16), np.float32))
    grpc_msg = grpc_error(gc, lambda: gc.infer("add_sub", big))
    nine = [{**t, "shape": [9, 16], "data": [1.0] * 144} for t in GOOD]
    r = raw_http(server, "POST", "/v2/models/add_sub/infer", _json_infer(nine))
    assert (r.status, r.error) == (400, grpc_msg)
    assert grpc_msg.endswith("inference request batch-size must be <= 8 for 'add_sub'")


# ----------------------------------------------------------------- system shared memory


def _key(tag: str) -> str:
    return f"/triton_mp_{os.getpid()}_test_{tag}"


@pytest.fixture
def regions() -> Iterator[Callable[[str, int], shm.SharedMemoryRegion]]:
    made: list[shm.SharedMemoryRegion] = []

    def make(tag: str, byte_size: int) -> shm.SharedMemoryRegion:
        handle = shm.create_shared_memory_region(tag, _key(tag), byte_size, create_only=True)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def test_system_shared_memory_over_http(
    server: ServerProcess,
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
    regions: Callable[[str, int], shm.SharedMemoryRegion],
) -> None:
    a = np.arange(16, dtype=np.float32)[None]
    b = np.full((1, 16), 2, np.float32)
    inp = regions("http_in", 128)
    out = regions("http_out", 128)
    shm.set_shared_memory_region(inp, [a, b])
    hc.register_system_shared_memory("in", _key("http_in"), 128)
    r = raw_http(
        server,
        "POST",
        "/v2/systemsharedmemory/region/out/register",
        json.dumps({"key": _key("http_out"), "offset": 0, "byte_size": 128}),
    )
    assert (r.status, r.body) == (200, b"")
    try:
        status = hc.get_system_shared_memory_status()
        assert sorted(status, key=lambda s: s["name"]) == [
            {"name": "in", "key": _key("http_in"), "offset": 0, "byte_size": 128},
            {"name": "out", "key": _key("http_out"), "offset": 0, "byte_size": 128},
        ]
        grpc_status = gc.get_system_shared_memory_status()
        assert {n: (s.key, s.byte_size) for n, s in grpc_status.regions.items()} == {
            s["name"]: (s["key"], s["byte_size"]) for s in status
        }
        one = raw_http(server, "GET", "/v2/systemsharedmemory/region/out/status")
        assert [s["name"] for s in one.json()] == ["out"]

        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("in", 64)
        inputs[1].set_shared_memory("in", 64, offset=64)
        outputs = [httpclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("out", 64)
        outputs[1].set_shared_memory("out", 64, offset=64)
        res = hc.infer("add_sub", inputs, outputs=outputs)
        assert res.get_response()["outputs"] == [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 16]},
        ]
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out, np.float32, [1, 16]), a + b)
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(out, np.float32, [1, 16], offset=64), a - b
        )
        # One JSON input and one in shared memory, the outputs in the answer.
        mixed = {
            "inputs": [
                {**GOOD[0], "data": a.tolist()},
                {
                    "name": "INPUT1",
                    "shape": [1, 16],
                    "datatype": "FP32",
                    "parameters": {
                        "shared_memory_region": "in",
                        "shared_memory_offset": 64,
                        "shared_memory_byte_size": 64,
                    },
                },
            ]
        }
        doc = raw_http(server, "POST", "/v2/models/add_sub/infer", json.dumps(mixed)).json()
        assert doc["outputs"][0]["data"] == (a + b).reshape(-1).tolist()
    finally:
        r = raw_http(server, "POST", "/v2/systemsharedmemory/region/out/unregister")
        assert r.status == 200
        hc.unregister_system_shared_memory()
    assert hc.get_system_shared_memory_status() == []
    assert not gc.get_system_shared_memory_status().regions


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        (
            "/v2/systemsharedmemory/register",
            {"key": "/k", "byte_size": 8},
            400,
            "'region name' is necessary to register system shared memory region",
        ),
        (
            "/v2/systemsharedmemory/region/r/register",
            {"byte_size": 8},
            400,
            "Shared memory register request has no 'key' field",
        ),
        (
            "/v2/systemsharedmemory/region/r/register",
            {"key": "/k"},
            400,
            "Shared memory register request has no 'byte_size' field",
        ),
        (
            "/v2/systemsharedmemory/region/r/register",
            {"key": "/k", "byte_size": -8},
            500,
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            "/v2/systemsharedmemory/region/r/register",
            {"key": 5, "byte_size": 8},
            500,
            "attempt to access JSON non-string as string",
        ),
        (
            "/v2/systemsharedmemory/region/r/register",
            {"key": "/triton_mp_no_such_object", "byte_size": 8},
            500,  # INTERNAL, as server shared_memory_manager.cc
            "Unable to open shared memory region: '/triton_mp_no_such_object'",
        ),
    ],
)
def test_shared_memory_register_errors(
    server: ServerProcess, path: str, body: dict[str, Any], status: int, message: str
) -> None:
    r = raw_http(server, "POST", path, json.dumps(body))
    assert r.status == status
    if message.endswith("..."):
        assert r.error.startswith(message[:-3])
    else:
        assert r.error == message


def test_shared_memory_status_and_duplicates(
    server: ServerProcess,
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
    regions: Callable[[str, int], shm.SharedMemoryRegion],
) -> None:
    r = raw_http(server, "GET", "/v2/systemsharedmemory/region/nope/status")
    assert r.status == 404
    assert r.error == grpc_error(gc, lambda: gc.get_system_shared_memory_status("nope"))
    regions("http_dup", 64)
    hc.register_system_shared_memory("dup", _key("http_dup"), 64)
    try:
        again = raw_http(
            server,
            "POST",
            "/v2/systemsharedmemory/region/dup/register",
            json.dumps({"key": _key("http_dup"), "byte_size": 64}),
        )
        assert again.status == 400  # NOTE: ALREADY_EXISTS maps to 400, as in Triton.
        assert again.error == "shared memory region 'dup' already in manager"
    finally:
        hc.unregister_system_shared_memory("dup")


# ----------------------------------------------------------- servers of their own


def _sleep_body(seconds: float) -> str:
    return json.dumps(
        {"inputs": [{"name": "SECONDS", "shape": [1], "datatype": "FP32", "data": [seconds]}]}
    )


def test_two_frontends_share_the_port_and_drain_like_grpc(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(
        sleep_repo(tmp_path / "repo"),
        "--frontend-processes",
        "2",
        "--exit-timeout-secs",
        "60",
        "--log-verbose",
        "1",
    )
    assert raw_http(server, "GET", "/v2/health/ready").status == 200
    # NOTE: each connection lands on either frontend (SO_REUSEPORT); all are answered.
    for _ in range(12):
        r = raw_http(server, "POST", "/v2/models/sleep_py/infer", _sleep_body(0))
        assert r.status == 200
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(raw_http, server, "POST", "/v2/models/sleep_py/infer", _sleep_body(3))
        wait_for(
            lambda: server.log().count("accepted for 'sleep_py'") == 13, 30, "the long request"
        )
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: server.log().count("draining:") == 2, 30, "both frontends to drain")
        assert raw_http(server, "GET", "/v2/health/live").status == 200
        assert raw_http(server, "GET", "/v2/health/ready").status == 400
        refused = raw_http(server, "POST", "/v2/models/sleep_py/infer", _sleep_body(0))
        assert refused.status == 503
        assert refused.error == (
            "Server is stopping, scheduler for model has stopped accepting new inference requests"
        )
        done = long.result(timeout=60)
    assert done.status == 200
    assert done.json()["outputs"][0]["data"] == [3.0]
    assert server.proc.wait(timeout=60) == 0


def test_requests_whose_http_client_went_away_are_not_run(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(sleep_repo(tmp_path / "repo"), "--log-verbose", "1")

    def count() -> int:
        doc = raw_http(server, "GET", "/v2/models/sleep_py/stats").json()
        return int(doc["model_stats"][0]["inference_count"])

    def gives_up() -> None:
        with pytest.raises((TimeoutError, socket.timeout)):
            raw_http(server, "POST", "/v2/models/sleep_py/infer", _sleep_body(0), timeout_s=0.3)

    before = count()
    with ThreadPoolExecutor(5) as pool:
        long = pool.submit(raw_http, server, "POST", "/v2/models/sleep_py/infer", _sleep_body(2))
        wait_for(lambda: "accepted for 'sleep_py'" in server.log(), 30, "the long request")
        # These queue behind it (one instance) and are abandoned long before it ends.
        quitters = [pool.submit(gives_up) for _ in range(4)]
        for q in quitters:
            q.result(timeout=30)
        assert long.result(timeout=60).status == 200
    assert raw_http(server, "POST", "/v2/models/sleep_py/infer", _sleep_body(0)).status == 200
    # NOTE: one instance runs in order, so once the last request is booked, any abandoned
    # one that ran would be booked too.
    wait_for(lambda: count() - before >= 2, 30, "the last request to be booked")
    assert count() - before == 2, "the abandoned requests must not have run"


def test_allow_http_false_serves_grpc_only(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(copy_models(tmp_path / "repo", "add_sub"), "--allow-http", "false")
    client = server.client()
    assert client.is_server_ready()
    client.close()
    with pytest.raises(ConnectionRefusedError):
        raw_http(server, "GET", "/v2/health/live")


def test_a_taken_http_port_stops_the_start(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        server = start_server(
            copy_models(tmp_path / "repo", "add_sub"), "--http-port", str(port), wait=False
        )
        assert server.proc.wait(timeout=60) == 1
    assert f"failed to start HTTP service: Socket '127.0.0.1:{port}' already in use" in (
        server.log()
    )
