"""Triton's statuses and messages for bad requests, side by side: every case runs against
triton-mp and, where ``.peers/`` has it, the real Triton 2.51 on the same python models,
and both must answer the same status and the same message (upstream core
``infer_request.cc`` ValidateBytesInputs / ValidateCorrelationId, server
``grpc/infer_handler.cc``, core ``tritonserver.cc``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, peers_env
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp._proto import grpc_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

IDENTITY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "%(input)s")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", t.as_numpy())]))
        return out
"""
BYTES_CONFIG = """
name: "bytes_py"
backend: "python"
max_batch_size: 0
input [{ name: "TEXT", data_type: TYPE_STRING, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_STRING, dims: [ -1 ] }]
"""
SEQ_CONFIG = """
name: "seq_py"
backend: "python"
max_batch_size: 1
input [{ name: "INPUT", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
sequence_batching {
  control_input [{
    name: "CORRID"
    control [{ kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_UINT64 }]
  }]
}
"""


def _el(text: bytes) -> bytes:
    return len(text).to_bytes(4, "little") + text


def _bytes_request(
    shape: list[int], raw: bytes, **params: pb.InferParameter
) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="bytes_py", id="m1")
    req.inputs.add(name="TEXT", datatype="BYTES", shape=shape)
    req.raw_input_contents.append(raw)
    for key, value in params.items():
        req.parameters[key].CopyFrom(value)
    return req


def _seq_request(**params: pb.InferParameter) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="seq_py", id="m2")
    req.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
    req.raw_input_contents.append(b"\0\0\x80?")
    for key, value in params.items():
        req.parameters[key].CopyFrom(value)
    return req


START = pb.InferParameter(bool_param=True)
WHERE = "for inference input 'TEXT' for model 'bytes_py'"
CASES: dict[str, tuple[pb.ModelInferRequest, grpc.StatusCode, str]] = {
    "too few strings": (
        _bytes_request([2], _el(b"ab")),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"[request id: m1] expected 2 string elements {WHERE}, got 1",
    ),
    "too many strings": (
        _bytes_request([1], _el(b"a") + _el(b"b")),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"[request id: m1] unexpected number of string elements 2 {WHERE}, expecting 1",
    ),
    "cut length prefix": (
        _bytes_request([1], b"\x01"),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"[request id: m1] incomplete string length indicator {WHERE}, expecting 4 bytes but "
        "only 1 bytes available. Please make sure the string length indicator is in one buffer.",
    ),
    "negative priority": (
        _bytes_request([1], _el(b"a"), priority=pb.InferParameter(int64_param=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid value for 'priority', expected value >= 0.",
    ),
    "priority of the wrong type": (
        _bytes_request([1], _el(b"a"), priority=pb.InferParameter(string_param="high")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
    ),
    "timeout of the wrong type": (
        _bytes_request([1], _el(b"a"), timeout=pb.InferParameter(uint64_param=5)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid value type for 'timeout' parameter, expected int64_param.",
    ),
    "string ID for a UINT64 CORRID": (
        _seq_request(sequence_id=pb.InferParameter(string_param="abc"), sequence_start=START),
        grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: m2] sequence batching control 'CORRID' data-type is 'BYTES', but model "
        "'seq_py' expects 'UINT64'",
    ),
    "string ID over 128 characters": (
        _seq_request(sequence_id=pb.InferParameter(string_param="x" * 129), sequence_start=START),
        grpc.StatusCode.UNIMPLEMENTED,
        "string correlation ID cannot be longer than 128 characters",
    ),
    "no correlation ID": (
        _seq_request(sequence_start=START),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inference request to model 'seq_py' must specify a non-zero or non-empty correlation ID",
    ),
    "no START flag": (
        _seq_request(sequence_id=pb.InferParameter(int64_param=4242)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inference request for sequence 4242 to model 'seq_py' must specify the START flag on "
        "the first request of the sequence",
    ),
}
UPSTREAM_MAIN_ONLY = {"string ID for a UINT64 CORRID"}
"""Cases where upstream main refuses what Triton 2.51 let through (ValidateCorrelationId
came later): only triton-mp is held to them."""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("messages") / "repo"
    write_python_model(repo, "bytes_py", BYTES_CONFIG, IDENTITY % {"input": "TEXT"})
    write_python_model(repo, "seq_py", SEQ_CONFIG, IDENTITY % {"input": "INPUT"})
    return repo


@pytest.fixture(scope="module")
def servers(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """gRPC URLs: ``triton-mp`` always, ``triton`` when the real Triton is installed."""
    logs = tmp_path_factory.mktemp("logs")
    ours = ServerProcess(repo, logs / "ours.log", "--allow-client-shm=true")
    theirs: RealTriton | None = None
    try:
        env = peers_env()
        if env is not None:  # NOTE: started before ours is live: side by side
            theirs = RealTriton(env, logs / "triton.log", f"--model-repository={repo}")
        ours.wait_live()
        urls = {"triton-mp": ours.url}
        if theirs is not None:
            theirs.wait_live()
            urls["triton"] = theirs.url
        yield urls
    finally:
        if theirs is not None:
            theirs.stop(wait=False)
        ours.stop()


def _answer(url: str, req: pb.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.ModelInfer(req, timeout=30)
        except grpc.RpcError as e:
            return e.code(), e.details()
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("case", list(CASES))
def test_bad_requests_get_tritons_status_and_message(servers: dict[str, str], case: str) -> None:
    req, code, message = CASES[case]
    for name, url in servers.items():
        if name == "triton" and case in UPSTREAM_MAIN_ONLY:
            continue
        assert _answer(url, req) == (code, message), name


def test_the_server_keeps_serving(servers: dict[str, str]) -> None:
    for name, url in servers.items():
        assert _answer(url, _bytes_request([2], _el(b"a") + _el(b"b"))) == (
            grpc.StatusCode.OK,
            "",
        ), name


def _register(url: str, name: str, key: str, byte_size: int, offset: int = 0) -> tuple:
    req = pb.SystemSharedMemoryRegisterRequest(
        name=name, key=key, byte_size=byte_size, offset=offset
    )
    with grpc.insecure_channel(url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.SystemSharedMemoryRegister(req, timeout=30)
        except grpc.RpcError as e:
            return e.code(), e.details()
        stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name=name))
    return grpc.StatusCode.OK, ""


def test_system_shared_memory_registration_errors(servers: dict[str, str]) -> None:
    key = f"/fidelity_msgs_{os.getpid()}"
    missing = f"/fidelity_msgs_{os.getpid()}_missing"
    region = shm.create_shared_memory_region("msgs", key, 64)
    try:
        for name, url in servers.items():
            assert _register(url, "a", missing, 8) == (
                grpc.StatusCode.INTERNAL,
                f"Unable to open shared memory region: '{missing}'",
            ), name
            for byte_size, offset in ((128, 0), (32, 48)):
                assert _register(url, "b", key, byte_size, offset) == (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "failed to register shared memory region 'b': invalid args",
                ), name
            assert _register(url, "c", key, 64) == (grpc.StatusCode.OK, ""), name
    finally:
        shm.destroy_shared_memory_region(region)


VERSION_CONFIG = """
name: "ver_py"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
version_policy: { latest: { num_versions: 1 } }
"""


def _ver_request(version: str) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="ver_py", model_version=version)
    req.inputs.add(name="INPUT", datatype="FP32", shape=[1])
    req.raw_input_contents.append(b"\0\0\x80?")
    return req


def _version_answers(url: str) -> tuple[list[tuple[str, str, str, str]], dict[str, tuple]]:
    """(RepositoryIndex rows of ``ver_py``, per version asked: (status, message))."""
    answers = {}
    with grpc.insecure_channel(url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
        for version in ("1", "2", "3"):
            try:
                stub.ModelInfer(_ver_request(version), timeout=30)
                answers[version] = (grpc.StatusCode.OK, "")
            except grpc.RpcError as e:
                answers[version] = (e.code(), e.details())
    rows = sorted(
        (m.name, m.version, m.state, m.reason) for m in index.models if m.name == "ver_py"
    )
    return rows, answers


def test_a_replaced_version_is_unavailable_as_in_triton(tmp_path: Path) -> None:
    """Version 2 loaded under ``latest: 1`` replaces version 1: Triton keeps version 1 as
    UNAVAILABLE "unloaded" and answers a request naming it UNAVAILABLE "... is not at ready
    state" (core ``model_lifecycle.cc`` GetModel); an unknown version stays NOT_FOUND.
    Triton lists version 1 as UNLOADING for a moment after the load returned; triton-mp
    answers the load once the old version stopped."""
    repo = tmp_path / "repo"
    write_python_model(repo, "ver_py", VERSION_CONFIG, IDENTITY % {"input": "INPUT"})
    flags = ("--model-control-mode=explicit", "--load-model=ver_py")
    ours = ServerProcess(repo, tmp_path / "ours.log", *flags)
    theirs: RealTriton | None = None
    try:
        env = peers_env()
        if env is not None:  # NOTE: started before ours is live: side by side
            theirs = RealTriton(env, tmp_path / "triton.log", f"--model-repository={repo}", *flags)
        ours.wait_live()
        servers = {"triton-mp": ours}
        if theirs is not None:
            theirs.wait_live()
            servers["triton"] = theirs
        (repo / "ver_py" / "2").mkdir()
        (repo / "ver_py" / "2" / "model.py").write_text((repo / "ver_py/1/model.py").read_text())
        got = {}
        for name, server in servers.items():
            client = grpcclient.InferenceServerClient(server.url)
            try:
                client.load_model("ver_py")
            finally:
                client.close()
            got[name] = _version_answers(server.url)
            deadline = time.monotonic() + 30
            # NOTE: Triton unloads the old version after the load returned (UNLOADING first).
            while got[name][0][0][2] == "UNLOADING" and time.monotonic() < deadline:
                time.sleep(0.1)
                got[name] = _version_answers(server.url)
        rows, answers = got["triton-mp"]
        assert rows == [("ver_py", "1", "UNAVAILABLE", "unloaded"), ("ver_py", "2", "READY", "")]
        assert answers == {
            "1": (
                grpc.StatusCode.UNAVAILABLE,
                "Request for unknown model: 'ver_py' version 1 is not at ready state",
            ),
            "2": (grpc.StatusCode.OK, ""),
            "3": (
                grpc.StatusCode.NOT_FOUND,
                "Request for unknown model: 'ver_py' version 3 is not found",
            ),
        }
        if "triton" in got:
            assert got["triton"] == got["triton-mp"]
        # After an unload, Triton keeps the versions UNAVAILABLE "unloaded" too.
        for name, server in servers.items():
            client = grpcclient.InferenceServerClient(server.url)
            try:
                client.unload_model("ver_py")
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and any(
                    row[2] == "UNLOADING" for row in _version_answers(server.url)[0]
                ):
                    time.sleep(0.1)
            finally:
                client.close()
            got[name] = _version_answers(server.url) + (_answer(server.url, _ver_request("")),)
        rows, answers, latest = got["triton-mp"]
        assert rows == [
            ("ver_py", "1", "UNAVAILABLE", "unloaded"),
            ("ver_py", "2", "UNAVAILABLE", "unloaded"),
        ]
        not_ready = "Request for unknown model: 'ver_py' version {} is not at ready state"
        assert answers == {
            "1": (grpc.StatusCode.UNAVAILABLE, not_ready.format(1)),
            "2": (grpc.StatusCode.UNAVAILABLE, not_ready.format(2)),
            "3": (
                grpc.StatusCode.NOT_FOUND,
                "Request for unknown model: 'ver_py' version 3 is not found",
            ),
        }
        assert latest == (
            grpc.StatusCode.NOT_FOUND,
            "Request for unknown model: 'ver_py' has no available versions",
        )
        if "triton" in got:
            assert got["triton"] == got["triton-mp"]
    finally:
        if theirs is not None:
            theirs.stop(wait=False)
        ours.stop()
