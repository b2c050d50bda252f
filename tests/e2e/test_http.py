"""HTTP/REST end to end: every endpoint through tritonclient.http and raw requests, against gRPC.

One server for most of the module: add_sub (ONNX), bytes_py (BYTES in and out), sleep_py
(one input, sleeps as long as it is told; raw binary requests), a decoupled copy of add_sub
and a model that fails to load (so the server is not ready, as Triton's strict readiness
says). Answers over HTTP are compared with the gRPC answers of the same server; raw
requests (``http.client``) check the JSON and binary forms, headers, and every error body
and status. Servers of their own cover the drain, abandoned requests, two frontends on one
port, ``--allow-http=false`` and a taken port.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import (
    PROJECT_REPOSITORY,
    ServerProcess,
    free_port,
    server_factory,
    wait_for,
)
from triton_mp._proto import model_config_pb2 as mc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BYTES_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [
  { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "LENGTH" data_type: TYPE_INT32 dims: [ -1 ] }
]
"""
BYTES_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()
            upper = np.array([t.upper() for t in text], dtype=np.object_)
            length = np.array([len(t) for t in text], dtype=np.int32)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTH", length)]))
        return out
"""
SLEEP_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
SLEEP_MODEL = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "SECONDS").as_numpy()
            if x.size:
                time.sleep(float(x.max()))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""


def _sleep_repo(repo: Path) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    write_python_model(repo, "sleep_py", SLEEP_CONFIG, SLEEP_MODEL)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = copy_models(tmp_path_factory.mktemp("repo"), "add_sub")
    write_python_model(repo, "bytes_py", BYTES_CONFIG, BYTES_MODEL)
    _sleep_repo(repo)
    shutil.copytree(PROJECT_REPOSITORY / "add_sub", repo / "decoupled_add_sub")
    cfg = (repo / "decoupled_add_sub" / "config.pbtxt").read_text()
    (repo / "decoupled_add_sub" / "config.pbtxt").write_text(
        cfg.replace('name: "add_sub"', "") + "model_transaction_policy { decoupled: true }\n"
    )
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: [\n')
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo, "--allow-client-shm=true")


@pytest.fixture
def hc(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


@pytest.fixture
def gc(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = server.client()
    yield c
    c.close()


class Reply:
    """A raw HTTP answer."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> str:
        assert self.headers.get("content-type") == "application/json", self.headers
        doc = self.json()
        assert list(doc) == ["error"], doc
        return str(doc["error"])


def _http(
    server: ServerProcess,
    method: str,
    path: str,
    body: bytes | str | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def _parse(doc: Any, message: Any) -> Any:
    """An HTTP JSON answer as the gRPC proto (fails if it is not that message's JSON)."""
    return json_format.ParseDict(doc, message, ignore_unknown_fields=False)


def _add_sub_inputs(mod: Any, a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[Any]:
    out = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        i = mod.InferInput(name, list(x.shape), "FP32")
        if mod is httpclient:
            i.set_data_from_numpy(x, binary_data=binary)
        else:
            i.set_data_from_numpy(x)
        out.append(i)
    return out


def _grpc_error(gc: grpcclient.InferenceServerClient, call: Callable[[], Any]) -> str:
    with pytest.raises(InferenceServerException) as e:
        call()
    return str(e.value.message())


# --------------------------------------------------------------------- health, metadata


def test_health_live_and_ready_follow_grpc(
    server: ServerProcess,
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
) -> None:
    live = _http(server, "GET", "/v2/health/live")
    assert (live.status, live.body) == (200, b"")
    ready = _http(server, "GET", "/v2/health/ready")
    # NOTE: 'broken' failed to load, so the server is not ready (strict readiness).
    assert (ready.status, ready.body) == (400, b"")
    assert hc.is_server_live() == gc.is_server_live() is True
    assert hc.is_server_ready() == gc.is_server_ready() is False


def test_server_metadata_equals_grpc(
    server: ServerProcess, gc: grpcclient.InferenceServerClient
) -> None:
    r = _http(server, "GET", "/v2")
    assert r.status == 200
    assert r.headers["content-type"] == "application/json"
    doc = r.json()
    assert _parse(doc, service_pb2.ServerMetadataResponse()) == gc.get_server_metadata()
    assert "binary_tensor_data" in doc["extensions"]
    assert "statistics" in doc["extensions"]


@pytest.mark.parametrize(
    ("model", "version"), [("add_sub", ""), ("add_sub", "1"), ("bytes_py", ""), ("sleep_py", "")]
)
def test_model_metadata_equals_grpc(
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
    model: str,
    version: str,
) -> None:
    doc = hc.get_model_metadata(model, version)
    assert _parse(doc, service_pb2.ModelMetadataResponse()) == gc.get_model_metadata(model, version)
    if model == "add_sub":
        # NOTE: shapes are JSON numbers, not the strings protobuf's JSON uses for int64.
        assert doc["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}


@pytest.mark.parametrize("model", ["add_sub", "bytes_py", "decoupled_add_sub"])
def test_model_config_is_tritons_json_of_the_grpc_config(
    server: ServerProcess,
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
    model: str,
) -> None:
    doc = hc.get_model_config(model)
    assert _parse(doc, mc.ModelConfig()) == mc.ModelConfig.FromString(
        gc.get_model_config(model).config.SerializeToString()
    )
    if model == "add_sub":
        assert doc["max_batch_size"] == 8
        assert doc["input"][0]["dims"] == [16]
        assert doc["input"][0]["data_type"] == "TYPE_FP32"
        assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 100
        # NOTE: fields left at their defaults are printed too, as Triton does.
        assert doc["platform"] == "onnxruntime_onnx"
        assert doc["input"][0]["optional"] is False
    versioned = _http(server, "GET", f"/v2/models/{model}/versions/1/config")
    assert versioned.json() == doc


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v2/models/add_sub/ready", 200),
        ("/v2/models/add_sub/versions/1/ready", 200),
        ("/v2/models/add_sub/versions/9/ready", 400),
        ("/v2/models/nope/ready", 400),
        ("/v2/models/broken/ready", 400),
    ],
)
def test_model_ready(server: ServerProcess, path: str, status: int) -> None:
    r = _http(server, "GET", path)
    assert r.status == status
    if status == 200:
        assert r.body == b""
    else:
        assert r.error == "Model version not ready"


@pytest.mark.parametrize(
    ("model", "version"), [("add_sub", ""), ("add_sub", "1"), ("add_sub", "9"), ("nope", "")]
)
def test_model_ready_equals_grpc(
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
    model: str,
    version: str,
) -> None:
    assert hc.is_model_ready(model, version) == gc.is_model_ready(model, version)


# ------------------------------------------------------------------------- repository


def test_repository_index_equals_grpc(
    server: ServerProcess,
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
) -> None:
    index = hc.get_model_repository_index()
    grpc_index = gc.get_model_repository_index()
    assert _parse({"models": index}, service_pb2.RepositoryIndexResponse()) == grpc_index
    by_name = {m["name"]: m for m in index}
    assert by_name["add_sub"] == {"name": "add_sub", "version": "1", "state": "READY"}
    assert by_name["broken"]["state"] == "UNAVAILABLE"
    assert "failed to read text proto" in by_name["broken"]["reason"]
    ready = _http(server, "POST", "/v2/repository/index", json.dumps({"ready": True}))
    assert ready.status == 200
    assert {m["name"] for m in ready.json()} == {
        m.name for m in gc.get_model_repository_index().models if m.state == "READY"
    }
    assert "broken" not in {m["name"] for m in ready.json()}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            "{",
            500,
            "failed to parse the request JSON buffer: Missing a name for object member. at 1",
        ),
        ('{"ready": 1}', 400, "Invalid value for 'ready': expected a boolean"),
        ("[1]", 200, ""),
    ],
)
def test_repository_index_refuses_malformed_bodies(
    server: ServerProcess, body: str, status: int, message: str
) -> None:
    # NOTE: JSON RapidJSON refuses is INTERNAL in Triton; upstream main refuses a 'ready'
    # that is no boolean in its own words; JSON that is no object has no 'ready'
    r = _http(server, "POST", "/v2/repository/index", body)
    assert r.status == status
    if message:
        assert r.error == message


@pytest.mark.parametrize("action", ["load", "unload"])
def test_load_and_unload_answer_as_grpc_does(
    server: ServerProcess,
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
    action: str,
) -> None:
    grpc_call = gc.load_model if action == "load" else gc.unload_model
    expected = _grpc_error(gc, lambda: grpc_call("add_sub"))
    r = _http(server, "POST", f"/v2/repository/models/add_sub/{action}")
    assert r.status == 503, r.error
    assert (
        r.error == expected == ("explicit model load / unload is not allowed if polling is enabled")
    )
    http_call = hc.load_model if action == "load" else hc.unload_model
    with pytest.raises(InferenceServerException) as e:
        http_call("add_sub")
    assert e.value.status() == "503"
    named = _http(server, "POST", f"/v2/repository/other/models/add_sub/{action}")
    assert named.status == 501
    assert named.error == "'repository_name' specification is not supported"
    with grpc.insecure_channel(server.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        rpc = stub.RepositoryModelLoad if action == "load" else stub.RepositoryModelUnload
        request_type = (
            service_pb2.RepositoryModelLoadRequest
            if action == "load"
            else service_pb2.RepositoryModelUnloadRequest
        )
        with pytest.raises(grpc.RpcError) as rpc_error:
            rpc(request_type(repository_name="other", model_name="add_sub"), timeout=30)
    assert rpc_error.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert rpc_error.value.details() == named.error


# ------------------------------------------------------------------------- statistics


def test_statistics_equal_grpc(
    server: ServerProcess,
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
) -> None:
    a = np.ones((2, 16), np.float32)
    hc.infer("add_sub", _add_sub_inputs(httpclient, a, a))
    gc.infer("add_sub", _add_sub_inputs(grpcclient, a, a))
    # NOTE: a request is booked when the worker's BatchDone reaches the scheduler, a moment
    # after its answer: compare once both transports read the same books.
    wait_for(
        lambda: (
            _parse(hc.get_inference_statistics("add_sub"), service_pb2.ModelStatisticsResponse())
            == gc.get_inference_statistics("add_sub")
        ),
        10,
        "HTTP and gRPC statistics to agree",
    )
    doc = hc.get_inference_statistics("add_sub")
    one = doc["model_stats"][0]
    assert one["name"] == "add_sub"
    assert one["version"] == "1"
    assert isinstance(one["inference_count"], int)
    assert one["inference_count"] >= 4
    assert isinstance(one["inference_stats"]["success"]["count"], int)
    assert one["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}
    assert {"batch_size", "compute_input", "compute_infer", "compute_output"} <= set(
        one["batch_stats"][0]
    )
    every = _http(server, "GET", "/v2/models/stats").json()
    assert {s["name"] for s in every["model_stats"]} == {
        s.name for s in gc.get_inference_statistics("").model_stats
    }
    versioned = _http(server, "GET", "/v2/models/add_sub/versions/1/stats").json()
    assert [s["version"] for s in versioned["model_stats"]] == ["1"]


def test_statistics_of_an_unknown_model(
    server: ServerProcess, gc: grpcclient.InferenceServerClient
) -> None:
    r = _http(server, "GET", "/v2/models/nope/stats")
    assert r.status == 400
    assert r.error == _grpc_error(gc, lambda: gc.get_inference_statistics("nope"))
    assert r.error == "requested model 'nope' is not available"


# -------------------------------------------------------------------------- inference


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_through_tritonclient_http_equals_grpc(
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
    binary: bool,
) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 16)).astype(np.float32)
    b = rng.standard_normal((3, 16)).astype(np.float32)
    outputs = [
        httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")
    ]
    got = hc.infer(
        "add_sub", _add_sub_inputs(httpclient, a, b, binary), outputs=outputs, request_id="r7"
    )
    want = gc.infer("add_sub", _add_sub_inputs(grpcclient, a, b))
    for name in ("OUTPUT0", "OUTPUT1"):
        np.testing.assert_array_equal(got.as_numpy(name), want.as_numpy(name))
    resp = got.get_response()
    assert resp["id"] == "r7"
    assert resp["model_name"] == "add_sub"
    assert resp["model_version"] == "1"
    first = resp["outputs"][0]
    assert first["shape"] == [3, 16]
    if binary:
        assert first["parameters"] == {"binary_data_size": 3 * 16 * 4}
    else:
        assert "parameters" not in first
        assert len(first["data"]) == 48


def test_infer_a_json_request_gets_a_json_answer(server: ServerProcess) -> None:
    a = [[float(i) for i in range(16)]]
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
        ]
    }
    r = _http(server, "POST", "/v2/models/add_sub/infer", json.dumps(body))
    assert r.status == 200
    assert r.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in r.headers
    doc = r.json()
    assert list(doc) == ["model_name", "model_version", "outputs"]
    assert doc["outputs"][0] == {
        "name": "OUTPUT0",
        "datatype": "FP32",
        "shape": [1, 16],
        "data": [float(i + 1) for i in range(16)],
    }
    assert doc["outputs"][1]["data"] == [float(i - 1) for i in range(16)]


def test_infer_binary_inputs_and_outputs_by_hand(server: ServerProcess) -> None:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, np.float32)
    header = json.dumps(
        {
            "id": "bin",
            "inputs": [
                {
                    "name": n,
                    "shape": [2, 16],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 128},
                }
                for n in ("INPUT0", "INPUT1")
            ],
            "outputs": [
                {"name": "OUTPUT1", "parameters": {"binary_data": True}},
                {"name": "OUTPUT0", "parameters": {"binary_data": False}},
            ],
        }
    ).encode()
    r = _http(
        server,
        "POST",
        "/v2/models/add_sub/versions/1/infer",
        header + a.tobytes() + b.tobytes(),
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status == 200, r.body
    assert r.headers["content-type"] == "application/octet-stream"
    n = int(r.headers["inference-header-content-length"])
    doc = json.loads(r.body[:n])
    assert doc["id"] == "bin"
    assert [o["name"] for o in doc["outputs"]] == ["OUTPUT1", "OUTPUT0"]
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 128}
    np.testing.assert_array_equal(np.frombuffer(r.body[n:], np.float32).reshape(2, 16), a - b)
    assert doc["outputs"][1]["data"] == (a + b).reshape(-1).tolist()


def test_binary_data_output_makes_unlisted_outputs_binary(server: ServerProcess) -> None:
    body = {
        "parameters": {"binary_data_output": True},
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}
            for n in ("INPUT0", "INPUT1")
        ],
    }
    r = _http(server, "POST", "/v2/models/add_sub/infer", json.dumps(body))
    n = int(r.headers["inference-header-content-length"])
    assert [o["parameters"] for o in json.loads(r.body[:n])["outputs"]] == [
        {"binary_data_size": 64},
        {"binary_data_size": 64},
    ]
    assert np.frombuffer(r.body[n:], np.float32).tolist() == [4.0] * 16 + [0.0] * 16


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_tensors(
    hc: httpclient.InferenceServerClient, gc: grpcclient.InferenceServerClient, binary: bool
) -> None:
    text = np.array([b"abc", b"", "h\u00e9".encode()], dtype=np.object_)
    i = httpclient.InferInput("TEXT", [3], "BYTES")
    i.set_data_from_numpy(text, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("UPPER", "LENGTH")]
    got = hc.infer("bytes_py", [i], outputs=outputs)
    g = grpcclient.InferInput("TEXT", [3], "BYTES")
    g.set_data_from_numpy(text)
    want = gc.infer("bytes_py", [g])
    np.testing.assert_array_equal(got.as_numpy("LENGTH"), want.as_numpy("LENGTH"))
    upper = [u if isinstance(u, bytes) else u.encode() for u in got.as_numpy("UPPER").tolist()]
    assert upper == want.as_numpy("UPPER").tolist()
    # NOTE: bytes.upper() leaves non-ASCII bytes alone.
    assert want.as_numpy("UPPER").tolist() == [b"ABC", b"", "H\u00e9".encode()]


def test_bytes_tensors_as_json_strings_by_hand(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "TEXT", "shape": [2], "datatype": "BYTES", "data": ["ab", "c"]}]}
    doc = _http(server, "POST", "/v2/models/bytes_py/infer", json.dumps(body)).json()
    assert {o["name"]: o["data"] for o in doc["outputs"]} == {
        "UPPER": ["AB", "C"],
        "LENGTH": [2, 1],
    }


def test_raw_binary_request(server: ServerProcess) -> None:
    x = np.zeros(5, np.float32)
    r = _http(
        server,
        "POST",
        "/v2/models/sleep_py/infer",
        x.tobytes(),
        {"Inference-Header-Content-Length": "0"},
    )
    assert r.status == 200, r.body
    n = int(r.headers["inference-header-content-length"])
    doc = json.loads(r.body[:n])
    assert doc["outputs"] == [
        {
            "name": "OUT",
            "datatype": "FP32",
            "shape": [5],
            "parameters": {"binary_data_size": 20},
        }
    ]
    assert r.body[n:] == x.tobytes()


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "add_sub",
            "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
            "deduced but got 2 inputs in 'add_sub' model configuration",
        ),
        (
            "bytes_py",
            "[request id: <id_unknown>] For BYTE datatype raw input 'TEXT', the model must have "
            "input shape [1]",
        ),
    ],
)
def test_raw_binary_request_rules(server: ServerProcess, model: str, message: str) -> None:
    r = _http(
        server,
        "POST",
        f"/v2/models/{model}/infer",
        b"\0" * 64,
        {"Inference-Header-Content-Length": "0"},
    )
    assert r.status == 400
    assert r.error == message


@pytest.mark.parametrize(
    ("request_coding", "response_coding"), [("gzip", "deflate"), ("deflate", "gzip")]
)
def test_compressed_requests_and_answers(
    hc: httpclient.InferenceServerClient, request_coding: str, response_coding: str
) -> None:
    a = np.arange(16, dtype=np.float32)[None]
    res = hc.infer(
        "add_sub",
        _add_sub_inputs(httpclient, a, a),
        request_compression_algorithm=request_coding,
        response_compression_algorithm=response_coding,
    )
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), 2 * a)


def test_a_gzip_answer_by_hand(server: ServerProcess) -> None:
    body = {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    r = _http(
        server,
        "POST",
        "/v2/models/add_sub/infer",
        gzip.compress(json.dumps(body).encode()),
        {"Content-Encoding": "gzip", "Accept-Encoding": "deflate;q=0.5, gzip"},
    )
    assert r.status == 200
    assert r.headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(r.body))["outputs"][0]["data"] == [2.0] * 16


def test_a_corrupt_gzip_body_is_a_bad_request(server: ServerProcess) -> None:
    """As Triton's DecompressData: nothing inflates, so it is a raw request of zero bytes."""
    r = _http(server, "POST", "/v2/models/add_sub/infer", b"notgzip", {"Content-Encoding": "gzip"})
    assert r.status == 400
    assert r.error == (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
        "deduced but got 2 inputs in 'add_sub' model configuration"
    )
    assert "Unhandled exception" not in server.log()


def test_an_unknown_content_encoding_is_unsupported(server: ServerProcess) -> None:
    r = _http(server, "POST", "/v2/models/add_sub/infer", b"xx", {"Content-Encoding": "compress"})
    assert r.status == 501
    assert r.error == "Unsupported compression type"
    assert r.headers["accept-encoding"] == "gzip, deflate"


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
        _json_infer([{**t, "shape": [16]} for t in GOOD]),
        {},
        400,
        "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. "
        "Expected [-1,16], got [16]...",
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
    r = _http(server, method, path, body, headers)
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
    g = _add_sub_inputs(grpcclient, a, a)[:1]
    grpc_msg = _grpc_error(gc, lambda: gc.infer("add_sub", g))
    r = _http(server, "POST", "/v2/models/add_sub/infer", _json_infer([GOOD[0]]))
    assert r.error == grpc_msg
    big = _add_sub_inputs(grpcclient, np.ones((9, 16), np.float32), np.ones((9, 16), np.float32))
    grpc_msg = _grpc_error(gc, lambda: gc.infer("add_sub", big))
    nine = [{**t, "shape": [9, 16], "data": [1.0] * 144} for t in GOOD]
    r = _http(server, "POST", "/v2/models/add_sub/infer", _json_infer(nine))
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
    r = _http(
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
        one = _http(server, "GET", "/v2/systemsharedmemory/region/out/status")
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
        doc = _http(server, "POST", "/v2/models/add_sub/infer", json.dumps(mixed)).json()
        assert doc["outputs"][0]["data"] == (a + b).reshape(-1).tolist()
    finally:
        r = _http(server, "POST", "/v2/systemsharedmemory/region/out/unregister")
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
    r = _http(server, "POST", path, json.dumps(body))
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
    r = _http(server, "GET", "/v2/systemsharedmemory/region/nope/status")
    assert r.status == 404
    assert r.error == _grpc_error(gc, lambda: gc.get_system_shared_memory_status("nope"))
    regions("http_dup", 64)
    hc.register_system_shared_memory("dup", _key("http_dup"), 64)
    try:
        again = _http(
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
        _sleep_repo(tmp_path / "repo"),
        "--frontend-processes",
        "2",
        "--exit-timeout-secs",
        "60",
        "--log-verbose",
        "1",
    )
    assert _http(server, "GET", "/v2/health/ready").status == 200
    # NOTE: each connection lands on either frontend (SO_REUSEPORT); all are answered.
    for _ in range(12):
        r = _http(server, "POST", "/v2/models/sleep_py/infer", _sleep_body(0))
        assert r.status == 200
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(_http, server, "POST", "/v2/models/sleep_py/infer", _sleep_body(3))
        wait_for(
            lambda: server.log().count("accepted for 'sleep_py'") == 13, 30, "the long request"
        )
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: server.log().count("draining:") == 2, 30, "both frontends to drain")
        assert _http(server, "GET", "/v2/health/live").status == 200
        assert _http(server, "GET", "/v2/health/ready").status == 400
        refused = _http(server, "POST", "/v2/models/sleep_py/infer", _sleep_body(0))
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
    server = start_server(_sleep_repo(tmp_path / "repo"), "--log-verbose", "1")

    def count() -> int:
        doc = _http(server, "GET", "/v2/models/sleep_py/stats").json()
        return int(doc["model_stats"][0]["inference_count"])

    def gives_up() -> None:
        with pytest.raises((TimeoutError, socket.timeout)):
            _http(server, "POST", "/v2/models/sleep_py/infer", _sleep_body(0), timeout_s=0.3)

    before = count()
    with ThreadPoolExecutor(5) as pool:
        long = pool.submit(_http, server, "POST", "/v2/models/sleep_py/infer", _sleep_body(2))
        wait_for(lambda: "accepted for 'sleep_py'" in server.log(), 30, "the long request")
        # These queue behind it (one instance) and are abandoned long before it ends.
        quitters = [pool.submit(gives_up) for _ in range(4)]
        for q in quitters:
            q.result(timeout=30)
        assert long.result(timeout=60).status == 200
    assert _http(server, "POST", "/v2/models/sleep_py/infer", _sleep_body(0)).status == 200
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
        _http(server, "GET", "/v2/health/live")


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


def test_a_body_over_the_input_size_limit_is_refused(server: ServerProcess) -> None:
    # NOTE: 64 MiB is tritonserver's --http-max-input-size default.
    r = _http(
        server,
        "POST",
        "/v2/models/add_sub/infer",
        b"\0" * (64 * 2**20 + 1),
        {"Inference-Header-Content-Length": "2"},
    )
    assert r.status == 400  # NOTE: Triton's EVBufferToJson words (server PR #8432)
    assert r.error == (
        "request JSON size of 67108865 bytes exceeds the maximum allowed input size of "
        "67108864 bytes. Use --http-max-input-size to increase the limit."
    )
