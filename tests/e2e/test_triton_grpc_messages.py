"""Triton's gRPC statuses and messages for bad requests, side by side: every case runs
against triton-mp and, where ``.peers/`` has it, the real Triton 2.51 on the same python
models; both must answer the same status code and details (server ``grpc/infer_handler.cc``,
``grpc/grpc_utils.h``, ``grpc/grpc_server.cc``, core ``infer_request.cc``; grpc C++ itself
for a message that does not parse). Cases marked ``MAIN_ONLY`` follow upstream main where it
changed after 2.51; only triton-mp is held to them. The HTTP counterpart is
tests/e2e/test_triton_http_messages.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import NamedTuple

import grpc
import pytest
from google.protobuf.message import Message

from tests.e2e.test_triton_http_messages import BYTES_CONFIG
from tests.helpers.repos import FP32_PAIR_CONFIG, IDENTITY_PY, write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, peers_env
from triton_mp._proto import grpc_service_pb2 as pb

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

P = pb.InferParameter
SERVICE = "/inference.GRPCInferenceService/"


def infer(
    inputs: dict[str, P] | None = None,
    outputs: dict[str, P] | None = None,
    datatype: str = "FP32",
    shape: tuple[int, ...] = (4,),
) -> pb.ModelInferRequest:
    """A ModelInferRequest for model ``m`` (INPUT0 FP32 [4]); ``inputs`` / ``outputs``: the
    tensor parameters of INPUT0 / OUTPUT0 (raw bytes are sent only without ``inputs``)."""
    req = pb.ModelInferRequest(model_name="m", id="g1")
    tensor = req.inputs.add(name="INPUT0", datatype=datatype, shape=list(shape))
    for key, value in (inputs or {}).items():
        tensor.parameters[key].CopyFrom(value)
    if outputs is not None:
        out = req.outputs.add(name="OUTPUT0")
        for key, value in outputs.items():
            out.parameters[key].CopyFrom(value)
    if not inputs:
        req.raw_input_contents.append(bytes(16))
    return req


class Case(NamedTuple):
    method: str
    request: Message | bytes
    code: grpc.StatusCode
    details: str


INVALID = grpc.StatusCode.INVALID_ARGUMENT
REGION = {"shared_memory_region": P(string_param="nowhere")}
SIZE = {"shared_memory_byte_size": P(int64_param=16)}
MUST = "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter"
CASES: dict[str, Case] = {
    # grpc_utils.h ParseSharedMemoryParams, before the core's checks (no request id)
    "an input in a region without a size": Case(
        "ModelInfer", infer(REGION), INVALID, f"{MUST} for tensor 'INPUT0'"
    ),
    "an input in a region without a size, of a wrong shape": Case(
        "ModelInfer", infer(REGION, shape=(5,)), INVALID, f"{MUST} for tensor 'INPUT0'"
    ),
    "an output in a region without a size": Case(
        "ModelInfer", infer(outputs=REGION), INVALID, f"{MUST} for tensor 'OUTPUT0'"
    ),
    "a region that is not a string": Case(
        "ModelInfer",
        infer({"shared_memory_region": P(int64_param=3), **SIZE}),
        INVALID,
        "invalid value type for 'shared_memory_region' parameter for tensor 'INPUT0', expected "
        "string_param.",
    ),
    "an offset without a region": Case(
        "ModelInfer",
        infer({"shared_memory_offset": P(int64_param=3)}),
        INVALID,
        "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter "
        "for tensor 'INPUT0'",
    ),
    "an output size without a region": Case(
        "ModelInfer",
        infer(outputs=SIZE),
        INVALID,
        "'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
        "parameter for tensor 'OUTPUT0'",
    ),
    "an offset that is not int64": Case(
        "ModelInfer",
        infer({**REGION, "shared_memory_offset": P(uint64_param=3), **SIZE}),
        INVALID,
        "invalid value type for 'shared_memory_offset' parameter for tensor 'INPUT0', expected "
        "int64_param.",
    ),
    "a size that is not int64": Case(
        "ModelInfer",
        infer({**REGION, "shared_memory_byte_size": P(uint64_param=16)}),
        INVALID,
        "invalid value type for 'shared_memory_byte_size' parameter for tensor 'INPUT0', "
        "expected int64_param.",
    ),
    "a negative size (unsigned in Triton): the region is looked up": Case(
        "ModelInfer",
        infer({**REGION, "shared_memory_byte_size": P(int64_param=-1)}),
        grpc.StatusCode.NOT_FOUND,
        "Unable to find shared memory region: 'nowhere'",
    ),
}
CASES.update(
    {
        # core Normalize: the datatype as TRITONSERVER_StringToDataType parsed it
        f"the datatype {datatype!r}": Case(
            "ModelInfer",
            infer(datatype=datatype),
            INVALID,
            "[request id: g1] inference input 'INPUT0' data-type is '<invalid>', but model 'm' "
            "expects 'FP32'",
        )
        for datatype in ("INT33", "fp32", "")
    }
)
RP = pb.ModelRepositoryParameter
STOL = "(details: stol), version should be an integral value > 0"
CASES.update(
    {
        # grpc_server.cc RepositoryModelLoad / RepositoryModelUnload / RepositoryIndex
        "a load with an unknown parameter": Case(
            "RepositoryModelLoad",
            pb.RepositoryModelLoadRequest(model_name="m", parameters={"foo": RP(string_param="x")}),
            INVALID,
            "unrecognized load parameter 'foo'.",
        ),
        "a load whose config is not a string": Case(
            "RepositoryModelLoad",
            pb.RepositoryModelLoadRequest(model_name="m", parameters={"config": RP(int64_param=3)}),
            INVALID,
            "invalid value type for load parameter 'config', expected string_param.",
        ),
        "a load whose file is not bytes": Case(
            "RepositoryModelLoad",
            pb.RepositoryModelLoadRequest(
                model_name="m", parameters={"file:1/model.py": RP(string_param="x")}
            ),
            INVALID,
            "invalid value type for load parameter 'file:1/model.py', expected bytes_param.",
        ),
        "a load whose config does not parse": Case(
            "RepositoryModelLoad",
            pb.RepositoryModelLoadRequest(
                model_name="m", parameters={"config": RP(string_param='{"backend": 5}')}
            ),
            grpc.StatusCode.INTERNAL,
            "failed to load 'm', failed to poll from model repository",
        ),
        "an unload whose unload_dependents is not a boolean": Case(
            "RepositoryModelUnload",
            pb.RepositoryModelUnloadRequest(
                model_name="zz", parameters={"unload_dependents": RP(string_param="x")}
            ),
            INVALID,
            "invalid value type for 'unload_dependents' parameter, expected bool_param.",
        ),
        "an index of a named repository": Case(
            "RepositoryIndex",
            pb.RepositoryIndexRequest(repository_name="x"),
            grpc.StatusCode.UNIMPLEMENTED,
            "'repository_name' specification is not supported",
        ),
        # common.cc GetModelVersionFromString: std::stol
        "ModelReady of version 'abc'": Case(
            "ModelReady",
            pb.ModelReadyRequest(name="m", version="abc"),
            INVALID,
            f"failed to get model version from specified version string 'abc' {STOL}",
        ),
        "ModelMetadata of version past int64": Case(
            "ModelMetadata",
            pb.ModelMetadataRequest(name="m", version="99999999999999999999"),
            INVALID,
            "failed to get model version from specified version string '99999999999999999999' "
            f"{STOL}",
        ),
        "ModelStatistics of version -1": Case(
            "ModelStatistics",
            pb.ModelStatisticsRequest(name="m", version="-1"),
            INVALID,
            "invalid model version specified '-1' , version should be an integral value > 0",
        ),
        "ModelInfer of version 'x'": Case(
            "ModelInfer",
            pb.ModelInferRequest(model_name="m", model_version="x"),
            INVALID,
            f"failed to get model version from specified version string 'x' {STOL}",
        ),
        "ModelStatistics of a version without a model (every model's)": Case(
            "ModelStatistics", pb.ModelStatisticsRequest(version="1"), grpc.StatusCode.OK, ""
        ),
        "ModelStatistics of version 'x' without a model": Case(
            "ModelStatistics",
            pb.ModelStatisticsRequest(version="x"),
            INVALID,
            f"failed to get model version from specified version string 'x' {STOL}",
        ),
        "ModelConfig of version '1x' (stol reads 1)": Case(
            "ModelConfig", pb.ModelConfigRequest(name="m", version="1x"), grpc.StatusCode.OK, ""
        ),
        # shared_memory_manager.cc: the gRPC register does not check the name
        "a system register without a name": Case(
            "SystemSharedMemoryRegister",
            pb.SystemSharedMemoryRegisterRequest(name="", key="/no_such_key_zz", byte_size=4),
            grpc.StatusCode.INTERNAL,
            "Unable to open shared memory region: '/no_such_key_zz'",
        ),
    }
)


def typed(field: str, values: list[object], datatype: str = "FP32") -> pb.ModelInferRequest:
    """A request for ``m`` whose INPUT0 sends ``values`` in the typed ``field``."""
    req = pb.ModelInferRequest(model_name="m", id="g1")
    tensor = req.inputs.add(name="INPUT0", datatype=datatype, shape=[4])
    getattr(tensor.contents, field).extend(values)
    return req


def _with_raw(req: pb.ModelInferRequest) -> pb.ModelInferRequest:
    req.raw_input_contents.append(bytes(16))
    return req


def _in_shm(req: pb.ModelInferRequest) -> pb.ModelInferRequest:
    for key, value in {**REGION, **SIZE}.items():
        req.inputs[0].parameters[key].CopyFrom(value)
    return req


EXPLICIT = "unexpected explicit tensor data for input tensor 'INPUT0' for model 'm'"
CASES.update(
    {
        # infer_handler.cc InferGRPCToInput / InferGRPCToInputHelper, then core's byte size
        "typed contents of another type": Case(
            "ModelInfer",
            typed("int_contents", [1, 2, 3, 4]),
            INVALID,
            f"{EXPLICIT} of type 'INT32', expected datatype 'FP32'",
        ),
        "typed contents for an unknown datatype": Case(
            "ModelInfer",
            typed("fp32_contents", [1, 2, 3, 4], "INT33"),
            INVALID,
            f"{EXPLICIT} of type 'FP32', expected datatype '<invalid>'",
        ),
        "typed contents in two fields": Case(
            "ModelInfer",
            (lambda r: (r.inputs[0].contents.fp64_contents.append(1.0), r)[1])(
                typed("fp32_contents", [1, 2, 3, 4])
            ),
            INVALID,
            f"{EXPLICIT}, binary data was already supplied.",
        ),
        "too few typed elements": Case(
            "ModelInfer",
            typed("fp32_contents", [1, 2, 3]),
            INVALID,
            "[request id: g1] input byte size mismatch for input 'INPUT0' for model 'm'. "
            "Expected 16, got 12",
        ),
        "typed contents and raw_input_contents": Case(
            "ModelInfer",
            _with_raw(typed("fp32_contents", [1, 2, 3, 4])),
            INVALID,
            "contents field must not be specified when using raw_input_contents for 'INPUT0' "
            "for model 'm'",
        ),
        "typed contents and shared memory": Case(
            "ModelInfer",
            _in_shm(typed("fp32_contents", [1, 2, 3, 4])),
            INVALID,
            "unexpected 'content' provided when using shared memory for input tensor 'INPUT0' "
            "for model 'm'",
        ),
        "a negative dimension other than -1": Case(
            "ModelInfer",
            infer(shape=(-4,)),
            INVALID,
            "[request id: g1] unexpected shape for input 'INPUT0' for model 'm'. Expected [4], "
            "got [-4]. ",
        ),
    }
)
CASES.update(
    {
        # grpc_utils.cc ParseClassificationParams, infer_handler.h InferAllocatorPayload
        "a classification that is not int64": Case(
            "ModelInfer",
            infer(outputs={"classification": P(string_param="2")}),
            INVALID,
            "invalid value type for 'classification' parameter, expected int64_param",
        ),
        "a classification of 0": Case(
            "ModelInfer",
            infer(outputs={"classification": P(int64_param=0)}),
            INVALID,
            "invalid value for 'classification' parameter, expected >= 0",
        ),
        "a classification into shared memory": Case(
            "ModelInfer",
            infer(outputs={**REGION, **SIZE, "classification": P(int64_param=1)}),
            INVALID,
            "output can't set both 'shared_memory_region' and 'classification'",
        ),
        # infer_handler.cc SetInferenceRequestMetadata: a parameter with no value set
        "a request parameter without a value": Case(
            "ModelInfer",
            (lambda r: (r.parameters["foo"].CopyFrom(P()), r)[1])(infer()),
            INVALID,
            "invalid value type for 'foo' parameter, expected int64_param, bool_param, or "
            "string_param.",
        ),
    }
)
UNARY = [
    m.name
    for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    if not m.client_streaming
]
CASES.update(
    {
        # grpc C++ (server_interface.h): a unary request that does not parse
        f"{method} with {data!r}": Case(
            method, data, grpc.StatusCode.INTERNAL, "Unable to parse request"
        )
        for method in UNARY
        for data in (b"\xff\xff\xff", b"\x0a\x05ab")
    }
)
MAIN_ONLY: set[str] = set()
"""Cases where upstream main answers otherwise than Triton 2.51: only triton-mp is held."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """gRPC addresses: ``triton-mp`` always, ``triton`` when the real Triton is installed."""
    repo = tmp_path_factory.mktemp("grpc_messages") / "repo"
    write_python_model(repo, "m", FP32_PAIR_CONFIG, IDENTITY_PY)
    write_python_model(repo, "b", BYTES_CONFIG, IDENTITY_PY)
    explicit = ("--model-control-mode=explicit", "--load-model=m", "--load-model=b")
    logs = tmp_path_factory.mktemp("logs")
    ours = ServerProcess(repo, logs / "ours.log", "--allow-client-shm=true", *explicit)
    theirs: RealTriton | None = None
    try:
        env = peers_env()
        if env is not None:  # NOTE: started before ours is live: side by side
            theirs = RealTriton(env, logs / "triton.log", f"--model-repository={repo}", *explicit)
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


def call(url: str, method: str, request: Message | bytes) -> tuple[grpc.StatusCode, str]:
    """One unary call with ``request`` (a message, or bytes sent as they are)."""
    data = request if isinstance(request, bytes) else request.SerializeToString()
    with grpc.insecure_channel(url) as channel:
        rpc = channel.unary_unary(SERVICE + method)
        try:
            rpc(data, timeout=30)
        except grpc.RpcError as e:
            return e.code(), e.details()
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("name", list(CASES))
def test_bad_grpc_requests_get_tritons_status_and_message(
    servers: dict[str, str], name: str
) -> None:
    case = CASES[name]
    for server, url in servers.items():
        if server == "triton" and name in MAIN_ONLY:
            continue
        assert call(url, case.method, case.request) == (case.code, case.details), server


def test_the_server_keeps_serving(servers: dict[str, str]) -> None:
    for server, url in servers.items():
        assert call(url, "ModelInfer", infer()) == (grpc.StatusCode.OK, ""), server


def _stream(url: str, messages: list[bytes]) -> tuple[list[str], float]:
    """Send ``messages`` on one ModelStreamInfer and keep the client's side open 5 s; the
    ids of the responses and the seconds until the server ended the stream (with OK)."""

    def requests() -> Iterator[bytes]:
        yield from messages
        time.sleep(5)

    with grpc.insecure_channel(url) as channel:
        rpc = channel.stream_stream(
            SERVICE + "ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        start = time.monotonic()
        ids = [r.infer_response.id or r.error_message for r in rpc(requests(), timeout=30)]
        return ids, time.monotonic() - start


def test_a_stream_ends_at_a_message_that_does_not_parse(servers: dict[str, str]) -> None:
    """Triton's stream handler stops reading when a read fails (grpc C++ reports a message
    that does not parse as a failed read): the requests before it are answered, the ones
    after it are not, and the stream ends with OK without waiting for the client."""
    first, last = infer(), infer()
    first.id, last.id = "before", "after"
    messages = [first.SerializeToString(), b"\xff\xff", last.SerializeToString()]
    for server, url in servers.items():
        ids, seconds = _stream(url, messages)
        assert ids == ["before"], server
        assert seconds < 4, server


def test_an_output_region_too_small_is_internal(servers: dict[str, str]) -> None:
    """The response allocator's refusal (infer_handler.cc / http_server.cc ResponseAlloc)
    is INTERNAL in Triton."""
    key = f"/tmp_grpc_messages_{os.getpid()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 64)
        for server, url in servers.items():
            register = pb.SystemSharedMemoryRegisterRequest(name="small", key=key, byte_size=64)
            assert call(url, "SystemSharedMemoryRegister", register)[0] == grpc.StatusCode.OK
            req = infer(
                outputs={
                    "shared_memory_region": P(string_param="small"),
                    "shared_memory_byte_size": P(int64_param=8),
                }
            )
            assert call(url, "ModelInfer", req) == (
                grpc.StatusCode.INTERNAL,
                "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) "
                "should be at least 16 bytes to hold the results",
            ), server
            unregister = pb.SystemSharedMemoryUnregisterRequest(name="small")
            assert call(url, "SystemSharedMemoryUnregister", unregister)[0] == grpc.StatusCode.OK
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")
