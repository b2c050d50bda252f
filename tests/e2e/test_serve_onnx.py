"""End to end: ``triton-mp start`` on a repository with ONNX models, driven by tritonclient.

One server for the module: add_sub (explicit config), add_sub_auto (no config.pbtxt: the
config is auto-completed from the ONNX graph), and two models that fail to load (a syntax
error in config.pbtxt; a config naming another model). Every request below goes through the
real process tree: gRPC frontend -> shm rings -> scheduler -> worker -> frontend.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess, counted, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ADD_SUB_ONNX = PROJECT_REPOSITORY / "add_sub" / "1" / "model.onnx"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(PROJECT_REPOSITORY / "add_sub", repo / "add_sub")
    (repo / "add_sub_auto" / "1").mkdir(parents=True)
    shutil.copy(ADD_SUB_ONNX, repo / "add_sub_auto" / "1" / "model.onnx")
    for v in (1, 2, 3):
        (repo / "add_sub_versions" / str(v)).mkdir(parents=True)
        shutil.copy(ADD_SUB_ONNX, repo / "add_sub_versions" / str(v) / "model.onnx")
    (repo / "add_sub_versions" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        "version_policy: { specific: { versions: [1, 3] } }\n"
        "instance_group [{ count: 1, kind: KIND_CPU }]\n"
    )
    for name, change in (
        ("wrong_dtype", ("TYPE_FP32", "TYPE_INT32")),
        ("wrong_dims", ("[ 16 ]", "[ 8 ]")),
    ):
        shutil.copytree(PROJECT_REPOSITORY / "add_sub", repo / name)
        cfg = (repo / name / "config.pbtxt").read_text().replace('name: "add_sub"', "")
        (repo / name / "config.pbtxt").write_text(cfg.replace(*change))
    (repo / "broken_syntax" / "1").mkdir(parents=True)
    shutil.copy(ADD_SUB_ONNX, repo / "broken_syntax" / "1" / "model.onnx")
    (repo / "broken_syntax" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: [\n'
    )
    (repo / "wrong_name" / "1").mkdir(parents=True)
    shutil.copy(ADD_SUB_ONNX, repo / "wrong_name" / "1" / "model.onnx")
    (repo / "wrong_name" / "config.pbtxt").write_text('name: "other"\nbackend: "onnxruntime"\n')
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = server.client()
    yield c
    c.close()


@pytest.fixture
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(server.url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _inputs(a: np.ndarray, b: np.ndarray, dtype: str = "FP32") -> list[grpcclient.InferInput]:
    i0 = grpcclient.InferInput("INPUT0", list(a.shape), dtype)
    i0.set_data_from_numpy(a)
    i1 = grpcclient.InferInput("INPUT1", list(b.shape), dtype)
    i1.set_data_from_numpy(b)
    return [i0, i1]


def _direct(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(ADD_SUB_ONNX), providers=["CPUExecutionProvider"])
    return sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})


def test_health_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    # NOTE: two models failed to load, so strict readiness (Triton's default) says no.
    assert not client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "triton"
    assert "statistics" in meta.extensions


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_outputs_equal_direct_onnxruntime(
    client: grpcclient.InferenceServerClient, batch: int
) -> None:
    rng = np.random.default_rng(batch)
    a = rng.standard_normal((batch, 16), dtype=np.float32)
    b = rng.standard_normal((batch, 16), dtype=np.float32)
    res = client.infer("add_sub", _inputs(a, b), request_id=f"r{batch}")
    want0, want1 = _direct(a, b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), want0)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), want1)
    response = res.get_response()
    assert response.id == f"r{batch}"
    assert response.model_version == "1"


def test_requested_output_subset(client: grpcclient.InferenceServerClient) -> None:
    a = np.full((2, 16), 5, np.float32)
    b = np.full((2, 16), 2, np.float32)
    res = client.infer(
        "add_sub", _inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")]
    )
    assert [o.name for o in res.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    assert res.as_numpy("OUTPUT0") is None


def test_typed_contents(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    req = service_pb2.ModelInferRequest(model_name="add_sub")
    for name, values in (("INPUT0", range(16)), ("INPUT1", [1.5] * 16)):
        t = req.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        t.contents.fp32_contents.extend(float(v) for v in values)
    resp = stub.ModelInfer(req)
    assert [o.name for o in resp.outputs] == ["OUTPUT0", "OUTPUT1"]
    sum_ = np.frombuffer(resp.raw_output_contents[0], np.float32)
    np.testing.assert_array_equal(sum_, np.arange(16, dtype=np.float32) + 1.5)


def test_auto_completed_config(client: grpcclient.InferenceServerClient) -> None:
    cfg = client.get_model_config("add_sub_auto", as_json=True)["config"]
    assert cfg["max_batch_size"] == 4
    assert "dynamic_batching" in cfg
    assert {i["name"] for i in cfg["input"]} == {"INPUT0", "INPUT1"}
    assert [int(d) for d in cfg["input"][0]["dims"]] == [16]
    a = np.ones((4, 16), np.float32)
    res = client.infer("add_sub_auto", _inputs(a, a))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + a)


def test_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    md = client.get_model_metadata("add_sub")
    assert md.platform == "onnxruntime_onnx"
    assert list(md.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [
        ("INPUT0", "FP32", [-1, 16]),
        ("INPUT1", "FP32", [-1, 16]),
    ]


def test_failed_models_are_reported_and_others_serve(
    client: grpcclient.InferenceServerClient,
) -> None:
    assert client.is_model_ready("add_sub")
    assert not client.is_model_ready("broken_syntax")
    assert not client.is_model_ready("wrong_name")
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["add_sub"].state == "READY"
    assert index["broken_syntax"].state == "UNAVAILABLE"
    assert "config.pbtxt" in index["broken_syntax"].reason
    assert index["wrong_name"].state == "UNAVAILABLE"
    assert "directory name must equal model name" in index["wrong_name"].reason
    a = np.ones((1, 16), np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("broken_syntax", _inputs(a, a))
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert "has no available versions" in e.value.message()


def _bad(
    client: grpcclient.InferenceServerClient, model: str, inputs, **kw
) -> InferenceServerException:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, inputs, **kw)
    return e.value


def test_errors_have_tritons_status_and_message(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), np.float32)
    err = _bad(client, "nope", _inputs(a, a))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'nope' is not found"

    err = _bad(client, "add_sub", _inputs(a, a), model_version="7")
    assert err.status() == "StatusCode.NOT_FOUND"
    assert "'add_sub' version 7 is not found" in err.message()

    err = _bad(client, "add_sub", _inputs(a.astype(np.float64), a.astype(np.float64), "FP64"))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert (
        # NOTE: both inputs are FP64; Triton's core meets INPUT1 first (its unordered_map's
        # order, frontend.validation.inputs): 2.51 names INPUT1 for add_sub_py the same way
        "inference input 'INPUT1' data-type is 'FP64', but model 'add_sub' expects 'FP32'"
        in err.message()
    )

    short = np.ones((1, 15), np.float32)
    err = _bad(client, "add_sub", _inputs(short, short))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert (
        # NOTE: both inputs short: INPUT1 first, as above (tests/e2e/test_r12_input_order.py)
        "unexpected shape for input 'INPUT1' for model 'add_sub'. Expected [-1,16], got [1,15]"
        in err.message()
    )

    big = np.ones((9, 16), np.float32)
    err = _bad(client, "add_sub", _inputs(big, big))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "inference request batch-size must be <= 8 for 'add_sub'" in err.message()

    err = _bad(client, "add_sub", _inputs(a, a)[:1], request_id="abc")
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message().startswith(
        "[request id: abc] expected 2 inputs but got 1 inputs for model 'add_sub'"
    )
    assert "missing required input(s) ['INPUT1']" in err.message()

    extra = grpcclient.InferInput("INPUT9", [1, 16], "FP32")
    extra.set_data_from_numpy(a)
    err = _bad(client, "add_sub", _inputs(a, a) + [extra])
    # NOTE: Triton checks the count first and lists the inputs in its unordered_map order.
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "expected 2 inputs but got 3 inputs for model 'add_sub'" in err.message()
    assert "Got input(s) ['INPUT9','INPUT1','INPUT0']" in err.message()

    err = _bad(client, "add_sub", _inputs(a, a), outputs=[grpcclient.InferRequestedOutput("NOPE")])
    assert err.message() == "unexpected inference output 'NOPE' for model 'add_sub'"

    two = np.ones((2, 16), np.float32)
    err = _bad(client, "add_sub", [_inputs(a, a)[0], _inputs(two, two)[1]])
    # NOTE: Triton takes the batch size from INPUT1 (met first) and finds INPUT0 off it
    assert "input 'INPUT0' batch size does not match other inputs for 'add_sub'" in err.message()


def test_byte_size_and_data_errors(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    def request() -> service_pb2.ModelInferRequest:
        req = service_pb2.ModelInferRequest(model_name="add_sub")
        req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
        req.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16])
        return req

    req = request()
    req.raw_input_contents.extend([b"\0" * 64, b"\0" * 60])
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 64, got 60"
        in e.value.details()
    )

    req = request()
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        e.value.details()
        == "unable to find data for input tensor 'INPUT0' for model 'add_sub' in request."
    )

    req = request()
    req.inputs[0].contents.fp32_contents.extend([1.0] * 16)
    req.raw_input_contents.extend([b"\0" * 64, b"\0" * 64])
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "contents field must not be specified when using raw_input_contents" in e.value.details()

    req = request()
    req.inputs[0].shape[:] = [1, -1]  # NOTE: only -1 is "not specified" (core Normalize)
    req.raw_input_contents.extend([b"\0" * 64, b"\0" * 64])
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req)
    assert "All input dimensions should be specified for input 'INPUT0'" in e.value.details()


def test_server_keeps_serving_after_bad_requests(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), np.float32)
    for _ in range(3):
        _bad(client, "add_sub", _inputs(a.astype(np.float64), a.astype(np.float64), "FP64"))
    res = client.infer("add_sub", _inputs(a, a))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + a)


def test_statistics_count_inferences(client: grpcclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
    a = np.ones((3, 16), np.float32)
    for _ in range(4):
        client.infer("add_sub", _inputs(a, a))
    after = counted(
        lambda: client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0],
        lambda st: int(st.get("execution_count", 0)) - int(before.get("execution_count", 0)) >= 4,
        "4 executions counted",
    )
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 12
    assert int(after["execution_count"]) - int(before.get("execution_count", 0)) == 4
    ok = after["inference_stats"]["success"]
    assert int(ok["count"]) >= 4
    assert int(ok["ns"]) > 0
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert int(after["inference_stats"][phase]["count"]) == int(ok["count"])
    sizes = {int(b["batch_size"]) for b in after["batch_stats"]}
    assert 3 in sizes
    all_stats = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in all_stats} >= {"add_sub", "add_sub_auto"}


def test_version_policy_specific_serves_exactly_the_listed_versions(
    client: grpcclient.InferenceServerClient,
) -> None:
    assert client.is_model_ready("add_sub_versions", "1")
    assert not client.is_model_ready("add_sub_versions", "2")
    assert client.is_model_ready("add_sub_versions", "3")
    assert list(client.get_model_metadata("add_sub_versions").versions) == ["1", "3"]
    a = np.ones((1, 16), np.float32)
    res = client.infer("add_sub_versions", _inputs(a, a), model_version="1")
    assert res.get_response().model_version == "1"
    res = client.infer("add_sub_versions", _inputs(a, a))
    assert res.get_response().model_version == "3", "no version given means the latest"
    err = _bad(client, "add_sub_versions", _inputs(a, a), model_version="2")
    assert err.status() == "StatusCode.NOT_FOUND"
    assert "'add_sub_versions' version 2 is not found" in err.message()
    index = [
        (m.name, m.version, m.state)
        for m in client.get_model_repository_index().models
        if m.name == "add_sub_versions"
    ]
    assert index == [("add_sub_versions", "1", "READY"), ("add_sub_versions", "3", "READY")]


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("wrong_dtype", "configuration expects datatype TYPE_INT32 for input 'INPUT0'"),
        ("wrong_dims", "input 'INPUT0' dims [-1, 8] (batch dimension included)"),
    ],
)
def test_a_config_that_contradicts_the_onnx_model_fails_to_load(
    client: grpcclient.InferenceServerClient, model: str, reason: str
) -> None:
    assert not client.is_model_ready(model)
    index = {(m.name, m.version): m for m in client.get_model_repository_index().models}
    entry = index[(model, "1")]
    assert entry.state == "UNAVAILABLE"
    assert reason in entry.reason


def test_protocol_corner_cases_match_triton(
    client: grpcclient.InferenceServerClient, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    a = np.ones((1, 16), np.float32)
    # An output requested twice is refused, as upstream core main (#493) does; 2.51 answered
    # it once (tests/e2e/test_grpc_answers.py pins both servers).
    outs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT0")]
    err = _bad(client, "add_sub", _inputs(a, a), outputs=outs)
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "output 'OUTPUT0' already exists in request" in err.message()
    # Batch size 0 is refused.
    empty = np.ones((0, 16), np.float32)
    err = _bad(client, "add_sub", _inputs(empty, empty))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "batch-size must be >= 1" in err.message()
    # Version strings that are not versions are INVALID_ARGUMENT, also for ModelReady.
    for version in ("abc", "99999999999999999999"):
        with pytest.raises(InferenceServerException) as e:
            client.is_model_ready("add_sub", version)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    # Statistics of an unknown model.
    with pytest.raises(InferenceServerException) as e:
        client.get_inference_statistics("nope")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "requested model 'nope' is not available" in e.value.message()
    # Surplus raw_input_contents are ignored, as Triton does.
    req = service_pb2.ModelInferRequest(model_name="add_sub")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    req.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16])
    req.raw_input_contents.extend([a.tobytes(), a.tobytes(), b"surplus"])
    resp = stub.ModelInfer(req)
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], np.float32), 2.0)
    # ModelStreamInfer: one response per request; a bad one gets error_message and the
    # stream goes on.
    bad = service_pb2.ModelInferRequest(model_name="nope", id="bad")
    req.id = "good"
    first, second = stub.ModelStreamInfer(iter([bad, req]))
    assert first.error_message == "Request for unknown model: 'nope' is not found"
    assert first.infer_response.id == "bad"
    assert second.error_message == ""
    assert second.infer_response.id == "good"
    np.testing.assert_array_equal(
        np.frombuffer(second.infer_response.raw_output_contents[0], np.float32), 2.0
    )
    # LogSettings is served (tests/e2e/test_log_settings.py); a log_file change is refused
    # with Triton's UNIMPLEMENTED and message, not a stack trace.
    assert stub.LogSettings(service_pb2.LogSettingsRequest()).settings["log_info"].bool_param
    req = service_pb2.LogSettingsRequest()
    req.settings["log_file"].string_param = "/tmp/x"
    with pytest.raises(grpc.RpcError) as rpc:
        stub.LogSettings(req)
    assert rpc.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert rpc.value.details() == "log file location can not be updated through network protocol"
