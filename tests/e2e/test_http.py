"""HTTP/REST end to end: every endpoint through tritonclient.http and raw requests, against gRPC.

One server for the module (``tests.helpers.http_repo``): add_sub (ONNX), bytes_py (BYTES in
and out), sleep_py (raw binary requests), a decoupled copy of add_sub and a model that fails
to load (so the server is not ready, as Triton's strict readiness says). Answers over HTTP
are compared with the gRPC answers of the same server; raw requests (``http.client``) check
the JSON and binary forms and headers. Errors, shared memory and servers of their own:
test_http_errors.py.
"""

from __future__ import annotations

import gzip
import json

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.helpers.http_repo import add_sub_inputs, as_proto, grpc_error, raw_http
from tests.helpers.server import (
    ServerProcess,
    wait_for,
)
from triton_mp._proto import model_config_pb2 as mc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def server(http_repo_server: ServerProcess) -> ServerProcess:
    """tests/e2e/conftest.py's server of tests.helpers.http_repo's repository."""
    return http_repo_server


# --------------------------------------------------------------------- health, metadata


def test_health_live_and_ready_follow_grpc(
    server: ServerProcess,
    hc: httpclient.InferenceServerClient,
    gc: grpcclient.InferenceServerClient,
) -> None:
    live = raw_http(server, "GET", "/v2/health/live")
    assert (live.status, live.body) == (200, b"")
    ready = raw_http(server, "GET", "/v2/health/ready")
    # NOTE: 'broken' failed to load, so the server is not ready (strict readiness).
    assert (ready.status, ready.body) == (400, b"")
    assert hc.is_server_live() == gc.is_server_live() is True
    assert hc.is_server_ready() == gc.is_server_ready() is False


def test_server_metadata_equals_grpc(
    server: ServerProcess, gc: grpcclient.InferenceServerClient
) -> None:
    r = raw_http(server, "GET", "/v2")
    assert r.status == 200
    assert r.headers["content-type"] == "application/json"
    doc = r.json()
    assert as_proto(doc, service_pb2.ServerMetadataResponse()) == gc.get_server_metadata()
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
    assert as_proto(doc, service_pb2.ModelMetadataResponse()) == gc.get_model_metadata(
        model, version
    )
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
    assert as_proto(doc, mc.ModelConfig()) == mc.ModelConfig.FromString(
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
    versioned = raw_http(server, "GET", f"/v2/models/{model}/versions/1/config")
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
    r = raw_http(server, "GET", path)
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
    assert as_proto({"models": index}, service_pb2.RepositoryIndexResponse()) == grpc_index
    by_name = {m["name"]: m for m in index}
    assert by_name["add_sub"] == {"name": "add_sub", "version": "1", "state": "READY"}
    assert by_name["broken"]["state"] == "UNAVAILABLE"
    assert "failed to read text proto" in by_name["broken"]["reason"]
    ready = raw_http(server, "POST", "/v2/repository/index", json.dumps({"ready": True}))
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
    r = raw_http(server, "POST", "/v2/repository/index", body)
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
    expected = grpc_error(gc, lambda: grpc_call("add_sub"))
    r = raw_http(server, "POST", f"/v2/repository/models/add_sub/{action}")
    assert r.status == 503, r.error
    assert (
        r.error == expected == ("explicit model load / unload is not allowed if polling is enabled")
    )
    http_call = hc.load_model if action == "load" else hc.unload_model
    with pytest.raises(InferenceServerException) as e:
        http_call("add_sub")
    assert e.value.status() == "503"
    named = raw_http(server, "POST", f"/v2/repository/other/models/add_sub/{action}")
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
    hc.infer("add_sub", add_sub_inputs(httpclient, a, a))
    gc.infer("add_sub", add_sub_inputs(grpcclient, a, a))
    # NOTE: a request is booked when the worker's BatchDone reaches the scheduler, a moment
    # after its answer: compare once both transports read the same books.
    wait_for(
        lambda: (
            as_proto(hc.get_inference_statistics("add_sub"), service_pb2.ModelStatisticsResponse())
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
    every = raw_http(server, "GET", "/v2/models/stats").json()
    assert {s["name"] for s in every["model_stats"]} == {
        s.name for s in gc.get_inference_statistics("").model_stats
    }
    versioned = raw_http(server, "GET", "/v2/models/add_sub/versions/1/stats").json()
    assert [s["version"] for s in versioned["model_stats"]] == ["1"]


def test_statistics_of_an_unknown_model(
    server: ServerProcess, gc: grpcclient.InferenceServerClient
) -> None:
    r = raw_http(server, "GET", "/v2/models/nope/stats")
    assert r.status == 400
    assert r.error == grpc_error(gc, lambda: gc.get_inference_statistics("nope"))
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
        "add_sub", add_sub_inputs(httpclient, a, b, binary), outputs=outputs, request_id="r7"
    )
    want = gc.infer("add_sub", add_sub_inputs(grpcclient, a, b))
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
    r = raw_http(server, "POST", "/v2/models/add_sub/infer", json.dumps(body))
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
    r = raw_http(
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
    r = raw_http(server, "POST", "/v2/models/add_sub/infer", json.dumps(body))
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
    doc = raw_http(server, "POST", "/v2/models/bytes_py/infer", json.dumps(body)).json()
    assert {o["name"]: o["data"] for o in doc["outputs"]} == {
        "UPPER": ["AB", "C"],
        "LENGTH": [2, 1],
    }


def test_raw_binary_request(server: ServerProcess) -> None:
    x = np.zeros(5, np.float32)
    r = raw_http(
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
    r = raw_http(
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
        add_sub_inputs(httpclient, a, a),
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
    r = raw_http(
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
    r = raw_http(
        server, "POST", "/v2/models/add_sub/infer", b"notgzip", {"Content-Encoding": "gzip"}
    )
    assert r.status == 400
    assert r.error == (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
        "deduced but got 2 inputs in 'add_sub' model configuration"
    )
    assert "Unhandled exception" not in server.log()


def test_an_unknown_content_encoding_is_unsupported(server: ServerProcess) -> None:
    r = raw_http(
        server, "POST", "/v2/models/add_sub/infer", b"xx", {"Content-Encoding": "compress"}
    )
    assert r.status == 501
    assert r.error == "Unsupported compression type"
    assert r.headers["accept-encoding"] == "gzip, deflate"


def test_a_body_over_the_input_size_limit_is_refused(server: ServerProcess) -> None:
    # NOTE: 64 MiB is tritonserver's --http-max-input-size default.
    r = raw_http(
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
