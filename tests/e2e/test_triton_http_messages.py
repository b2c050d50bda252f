"""Triton's HTTP statuses and messages for bad requests, side by side: every case runs
against triton-mp and, where ``.peers/`` has it, the real Triton 2.51 on the same python
models; both must answer the same HTTP status and the same JSON ``error`` (server
``http_server.cc``, core ``infer_request.cc`` / ``tritonserver.cc``). Cases marked
``MAIN_ONLY`` follow upstream main where it changed after 2.51; only triton-mp is held to
them.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import socket
import urllib.request
from collections.abc import Iterator

import pytest

from tests.helpers.http_error_cases import (
    BYTES_CONFIG,
    INT32_CONFIG,
    MODEL_CASES,
    RID,
    Case,
    M,
    fp32,
)
from tests.helpers.http_error_cases_wire import MAIN_ONLY, SHM_IN, WIRE_CASES
from tests.helpers.repos import FP32_PAIR_CONFIG, IDENTITY_PY, write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, peers_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CASES = {**MODEL_CASES, **WIRE_CASES}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """HTTP addresses: ``triton-mp`` always, ``triton`` when the real Triton is installed."""
    repo = tmp_path_factory.mktemp("http_messages") / "repo"
    write_python_model(repo, "m", FP32_PAIR_CONFIG, IDENTITY_PY)
    write_python_model(repo, "b", BYTES_CONFIG, IDENTITY_PY)
    write_python_model(repo, "i", INT32_CONFIG, IDENTITY_PY)
    write_python_model(repo, "unparsable", 'name: "unparsable"\nthis is { not pbtxt\n', IDENTITY_PY)
    explicit = ("--model-control-mode=explicit", "--load-model=m", "--load-model=b")
    explicit += ("--load-model=i",)
    logs = tmp_path_factory.mktemp("logs")
    trace = [
        f"--trace-config=triton,file={logs / 'trace.json'}",
        "--trace-config=log-frequency=7",
    ]
    ours = ServerProcess(repo, logs / "ours.log", "--allow-client-shm=true", *explicit, *trace)
    theirs: RealTriton | None = None
    try:
        env = peers_env()
        if env is not None:  # NOTE: started before ours is live: side by side
            theirs = RealTriton(
                env, logs / "triton.log", f"--model-repository={repo}", *explicit, *trace
            )
        ours.wait_live()
        urls = {"triton-mp": ours.http_url}
        if theirs is not None:
            theirs.wait_live()
            urls["triton"] = theirs.http_url
        yield urls
    finally:
        if theirs is not None:
            theirs.stop(wait=False)
        ours.stop()


def call(url: str, case: Case) -> tuple[int, str]:
    """The HTTP status and the ``error`` of the JSON body ("" when there is none)."""
    host, port = url.split(":")
    body = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(case.method, case.path, body=body, headers=case.headers)
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    try:
        return r.status, json.loads(data).get("error", "")
    except (ValueError, AttributeError):
        return r.status, ""


@pytest.mark.parametrize("name", list(CASES))
def test_bad_http_requests_get_tritons_status_and_message(
    servers: dict[str, str], name: str
) -> None:
    case = CASES[name]
    for server, url in servers.items():
        if server == "triton" and name in MAIN_ONLY:
            continue
        assert call(url, case) == (case.status, case.error), server


def test_the_server_keeps_serving(servers: dict[str, str]) -> None:
    ok = Case("POST", M, {"inputs": [fp32()]}, 200, "")
    for server, url in servers.items():
        assert call(url, ok) == (200, ""), server


SERVED = {
    "input parameters that are no object": {"inputs": [fp32(parameters=5)]},
    "output parameters that are no object": {
        "inputs": [fp32()],
        "outputs": [{"name": "OUTPUT0", "parameters": 5}],
    },
    "a custom parameter with a fraction": {"inputs": [fp32()], "parameters": {"p": 1.5}},
    "a custom parameter past int64": {"inputs": [fp32()], "parameters": {"p": 2**64 - 1}},
}
"""Bodies 2.51 serves (TritonJson finds no member in a non-object; a number that is no
int64 is a double parameter)."""


@pytest.mark.parametrize("name", list(SERVED))
def test_what_triton_serves_is_served(servers: dict[str, str], name: str) -> None:
    ok = Case("POST", M, SERVED[name], 200, "")
    for server, url in servers.items():
        assert call(url, ok) == (200, ""), server


def _trace_setting(url: str, body: object = None) -> tuple[int, dict[str, object]]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        if body is None:
            conn.request("GET", "/v2/trace/setting")
        else:
            conn.request("POST", "/v2/trace/setting", body=json.dumps(body).encode())
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_trace_settings_triton_lets_through(servers: dict[str, str]) -> None:
    """Triton (2.51 and main's HandleTrace / SetGlobalTraceArgs) ignores a global
    ``log-frequency`` and an unknown level, and reads ``log_frequency`` with ``std::stoi``
    into a uint32 (-5 becomes 4294967291); both servers answer alike."""
    for server, url in servers.items():
        status, setting = _trace_setting(url)
        assert (status, setting["log_frequency"], setting["trace_level"]) == (200, "0", ["OFF"])
        status, setting = _trace_setting(url, {"trace_level": ["BOGUS"]})
        assert (status, setting["trace_level"]) == (200, ["OFF"]), server
        status, setting = _trace_setting(url, {"log_frequency": "-5"})
        assert (status, setting["log_frequency"]) == (200, "4294967291"), server
        status, setting = _trace_setting(url, {"log_frequency": "99999999999"})
        assert (status, setting) == (
            400,
            {
                "error": "Unable to parse 'log_frequency', value is out of range [ 0, "
                "4294967295 ], got: 99999999999"
            },
        ), server
        assert _trace_setting(url, {"log_frequency": "0"})[0] == 200


def _raw(url: str, head: bytes, body_parts: list[bytes]) -> tuple[int, str, bytes]:
    """Send ``head`` and ``body_parts`` on a raw socket; the status, the JSON error and what
    followed the response (b"" when the server closed the connection)."""
    host, port = url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        try:
            for part in body_parts:
                s.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # NOTE: the server may stop reading once it has refused the body
        data = b""
        while True:
            try:
                more = s.recv(65536)
            except ConnectionResetError:
                break
            if not more:
                break
            data += more
    head_text, _, rest = data.partition(b"\r\n\r\n")
    status = int(head_text.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head_text.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return status, json.loads(rest[:length]).get("error", ""), rest[length:]


def test_a_chunked_body_of_too_many_chunks_is_refused(servers: dict[str, str]) -> None:
    """Server PR #8770 (upstream main, 2026; 2.51 predates it): more than 65536 non-empty
    chunks answers 400 and closes the connection."""
    url = servers["triton-mp"]
    head = f"POST {M} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    chunks = [b"1\r\n \r\n" * 65537, b"0\r\n\r\n"]
    status, error, _ = _raw(url, head, chunks)
    assert (status, error) == (
        400,
        "Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or "
        "larger HTTP chunks.",
    )
    # 65536 chunks are fine (here: a JSON body cut into them)
    body = json.dumps({"inputs": [fp32()]}).encode()
    body += b" " * (65536 - len(body))
    parts = [b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body))]
    status, error, _ = _raw(
        url,
        head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"),
        [b"".join(parts), b"0\r\n\r\n"],
    )
    assert (status, error) == (200, "")


def test_a_body_that_inflates_past_the_limit_is_refused(servers: dict[str, str]) -> None:
    """Server PR #8570 (upstream main; 2.51 predates it): --http-max-input-size bounds the
    inflated body too."""
    bomb = gzip.compress(b" " * (64 * 2**20 + 10))
    case = Case("POST", M, bomb, 400, "", {"Content-Encoding": "gzip"})
    assert call(servers["triton-mp"], case) == (
        400,
        "Decompressed data size exceeds the maximum allowed value of 67108864 bytes. Use "
        "--http-max-input-size to increase the limit.",
    )


def test_a_region_without_a_size_is_an_empty_window(servers: dict[str, str]) -> None:
    """HTTP leaves ``shared_memory_byte_size`` at 0. Upstream main's GetMemoryInfo (PR #8335,
    2025) takes that empty window, so the core refuses the input's byte size and the output
    does not fit; 2.51's end check (``offset + byte_size - 1``, unsigned) refused the window
    itself ("Invalid offset + byte size ..."): only triton-mp is held to main here."""
    key = f"/tmp_http_messages_{os.getpid()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    url = servers["triton-mp"]
    try:
        os.ftruncate(fd, 64)
        register = Case(
            "POST",
            "/v2/systemsharedmemory/region/sized/register",
            {"key": key, "byte_size": 64},
            200,
            "",
        )
        assert call(url, register) == (200, "")
        body = {"inputs": [{**SHM_IN, "parameters": {"shared_memory_region": "sized"}}]}
        assert call(url, Case("POST", M, body, 400, "")) == (
            400,
            f"{RID}input byte size mismatch for input 'INPUT0' for model 'm'. Expected 16, got 0",
        )
        body = {
            "inputs": [fp32()],
            "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "sized"}}],
        }
        assert call(url, Case("POST", M, body, 500, "")) == (
            500,
            "shared memory size specified with the request for output 'OUTPUT0' (0 bytes) "
            "should be at least 16 bytes to hold the results",
        )
        unregister = Case("POST", "/v2/systemsharedmemory/region/sized/unregister", b"", 200, "")
        assert call(url, unregister) == (200, "")
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")


NUMBERS = b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [%s]}]}'


@pytest.mark.parametrize(
    "body",
    [
        NUMBERS % b"NaN, -Inf, Infinity, -Infinity",
        NUMBERS % b"-NaN, Inf, 1e-400, 2",
        b"\xef\xbb\xbf" + NUMBERS % b"1, 2, 3, 4",
        NUMBERS % b"1, 2, 3, 4" + b"\x00 anything",
    ],
    ids=["NaN and Infinity", "-NaN, Inf", "a byte-order mark", "bytes after a NUL"],
)
def test_json_rapidjson_reads_is_served(servers: dict[str, str], body: bytes) -> None:
    """TritonJson parses with kParseNanAndInfFlag and writes with kWriteNanAndInfFlag;
    RapidJSON skips a UTF-8 byte-order mark and stops at a NUL: both servers answer 200
    with the same data (``NaN``, ``Infinity`` and ``-Infinity`` written as such)."""
    answers = {}
    for server, url in servers.items():
        host, port = url.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("POST", M, body=body)
            r = conn.getresponse()
            answers[server] = (r.status, repr(json.loads(r.read())["outputs"][0]["data"]))
        finally:
            conn.close()
    assert answers["triton-mp"][0] == 200
    assert len(set(answers.values())) == 1, answers


def test_server_metadata_lists_tritons_extensions_but_cuda_shared_memory(
    servers: dict[str, str],
) -> None:
    """GET /v2: the extensions 2.51 lists, in its order, less ``cuda_shared_memory``, which
    triton-mp registers but does not serve in requests yet."""
    tritons = [
        "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
        "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
        "binary_tensor_data", "parameters", "statistics", "trace", "logging",
    ]  # fmt: skip
    for server, url in servers.items():
        with urllib.request.urlopen(f"http://{url}/v2", timeout=30) as r:
            extensions = json.loads(r.read())["extensions"]
        expected = tritons if server == "triton" else [e for e in tritons if "cuda" not in e]
        assert extensions == expected, server
