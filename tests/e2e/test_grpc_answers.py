"""The KServe v2 gRPC data path's answers to unusual requests, side by side with the real
Triton 2.51 (``.peers/``; where it is not installed, triton-mp alone is held to the same
pinned answers). Issue 38: each case differed before.

1. An input of no elements sent without any data is refused (server ``grpc/infer_handler.cc``
   InferGRPCToInput); with an empty raw entry it is served.
2. BF16 tensors reach a python model as pb_utils has them (no numpy form; a DLPack round
   trip) and their raw bytes come back as they were sent (we answered UNIMPLEMENTED).
3. More inputs than ``raw_input_contents`` entries: the first input without one is refused
   by name; surplus entries are ignored.
4. An output requested twice is refused as upstream core main does since PR #493 (Triton
   2.51 answered it once: only triton-mp is held to it).
5. ModelStreamInfer: a request refused before it runs is answered with its id alone
   (``stream_infer_handler.cc`` Process); with the ``triton_grpc_error: true`` header a
   model's error ends the stream with its gRPC status.
6. A stream response the frontend builds itself (an empty final response, a model's error)
   carries the model name and the ``model_version`` string the request sent ("" when none),
   not the version that ran (``StreamInferResponseComplete``).

The sweep of the same code found more of the same kind, pinned at the end: ModelInfer
refuses a decoupled model before reading the request; ``triton_enable_empty_final_response``
must be a ``bool_param``; a tensor's shared-memory window is looked up before the core's
checks; the core checks the requested outputs' names (in sorted order) before any input; a
``contents`` message without elements still counts as typed contents; in a stream, a refused
request of a decoupled model is answered at once, not after the requests before it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.helpers.repos import FP32_PAIR_CONFIG, IDENTITY_PY, write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, peers_env
from triton_mp._proto import grpc_service_pb2 as pb

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SERVICE = "/inference.GRPCInferenceService/"
INVALID = grpc.StatusCode.INVALID_ARGUMENT

ANY_CONFIG = """
name: "any"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1, -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1, -1 ] }]
"""
BF16_CONFIG = """
name: "bf16"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_BF16, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_BF16, dims: [ -1 ] }]
"""
BF16_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            try:
                t.as_numpy()
            except pb_utils.TritonModelException as e:
                refused = str(e)
            else:
                refused = "as_numpy worked"
            if refused != (
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use "
                "to_dlpack() and from_dlpack() instead."
            ):
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(refused)))
                continue
            echo = pb_utils.Tensor.from_dlpack("OUTPUT0", t.to_dlpack())
            out.append(pb_utils.InferenceResponse([echo]))
        return out
"""
FAIL_CONFIG = """
name: "fail"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
"""
FAIL_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if t[0] < 0:
                error = pb_utils.TritonError("negative input")
                out.append(pb_utils.InferenceResponse(error=error))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t)]))
        return out
"""
DECOUPLED_CONFIG = """
name: "dec"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
"""
DECOUPLED_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if t[0] < 0:
                error = pb_utils.TritonError("negative input")
                sender.send(pb_utils.InferenceResponse(error=error))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
"""
SLOW_MODEL = IDENTITY_PY.replace("out = []", "out = []\n        __import__('time').sleep(1.5)")
MODELS = {
    "m": (FP32_PAIR_CONFIG, IDENTITY_PY),
    "any": (ANY_CONFIG, IDENTITY_PY),
    "bf16": (BF16_CONFIG, BF16_MODEL),
    "fail": (FAIL_CONFIG, FAIL_MODEL),
    "dec": (DECOUPLED_CONFIG, DECOUPLED_MODEL),
    "slow": (SLOW_CONFIG, SLOW_MODEL),
}


def _servers(
    tmp_path_factory: pytest.TempPathFactory, models: tuple[str, ...]
) -> Iterator[dict[str, str]]:
    """gRPC addresses: ``triton-mp`` always, ``triton`` when the real Triton is installed,
    both serving ``models`` (of ``MODELS``)."""
    repo = tmp_path_factory.mktemp("grpc_answers") / "repo"
    for name in models:
        write_python_model(repo, name, *MODELS[name])
    explicit = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in models)]
    logs = tmp_path_factory.mktemp("logs")
    # NOTE: client shared memory is on by default in 2.51 (off since 26.04, PR #8721)
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


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Both servers with every model of ``MODELS``."""
    yield from _servers(tmp_path_factory, tuple(MODELS))


@pytest.fixture
def servers_to_break(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Both servers with ``fail`` alone, for one test: Triton 2.51 may die (SIGSEGV) after
    a stream in ``triton_grpc_error`` mode ended with a model's error, a race upstream main
    fixed since (stream_infer_handler.cc, ``grpc_stream_closed_``)."""
    yield from _servers(tmp_path_factory, ("fail",))


def request(
    model: str = "m",
    shape: tuple[int, ...] = (4,),
    raw: tuple[bytes, ...] = (bytes(16),),
    datatype: str = "FP32",
    inputs: tuple[str, ...] = ("INPUT0",),
    outputs: tuple[str, ...] = (),
    version: str = "",
    rid: str = "r38",
) -> pb.ModelInferRequest:
    """A ModelInferRequest: each of ``inputs`` of ``shape``/``datatype``, ``raw`` as the
    ``raw_input_contents`` entries, ``outputs`` requested by name."""
    req = pb.ModelInferRequest(model_name=model, model_version=version, id=rid)
    for name in inputs:
        req.inputs.add(name=name, datatype=datatype, shape=list(shape))
    for name in outputs:
        req.outputs.add(name=name)
    req.raw_input_contents.extend(raw)
    return req


def infer(url: str, req: pb.ModelInferRequest) -> pb.ModelInferResponse | tuple[object, str]:
    """ModelInfer: the response, or the (status code, details) of its refusal."""
    with grpc.insecure_channel(url) as channel:
        rpc = channel.unary_unary(
            SERVICE + "ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        try:
            return rpc(req, timeout=60)  # type: ignore[no-any-return]
        except grpc.RpcError as e:
            return e.code(), e.details()


def stream(
    url: str,
    requests: list[pb.ModelInferRequest],
    expect: int,
    metadata: tuple[tuple[str, str], ...] = (),
) -> tuple[list[pb.ModelStreamInferResponse], tuple[object, str]]:
    """One ModelStreamInfer: send ``requests``, keep the client's side open until ``expect``
    responses came (or the server ended the stream); the responses and the final status."""
    got: list[pb.ModelStreamInferResponse] = []
    enough = threading.Event()

    def outgoing() -> Iterator[pb.ModelInferRequest]:
        yield from requests
        enough.wait(30)

    with grpc.insecure_channel(url) as channel:
        rpc = channel.stream_stream(
            SERVICE + "ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        status: tuple[object, str] = (grpc.StatusCode.OK, "")
        try:
            for response in rpc(outgoing(), timeout=60, metadata=metadata):
                got.append(response)
                if len(got) >= expect:
                    enough.set()
        except grpc.RpcError as e:
            status = (e.code(), e.details())
        finally:
            enough.set()
    return got, status


def _each(servers: dict[str, str], main_only: bool = False) -> Iterator[tuple[str, str]]:
    """Each server to hold to the pinned answers, the real Triton first (its answer is
    the reference); ``main_only``: triton-mp alone (upstream main changed 2.51's)."""
    for name, url in sorted(servers.items(), key=lambda item: item[0] != "triton"):
        if main_only and name == "triton":
            continue
        yield name, url


# ----------------------------------------------------------------- 1. no elements, no data


NO_DATA = "unable to find data for input tensor 'INPUT0' for model 'any' in request."


@pytest.mark.parametrize("shape", [(0, 16), (1, 0)])
def test_an_empty_input_needs_its_empty_raw_entry(
    servers: dict[str, str], shape: tuple[int, int]
) -> None:
    for name, url in _each(servers):
        assert infer(url, request("any", shape, raw=())) == (INVALID, NO_DATA), name
        answer = infer(url, request("any", shape, raw=(b"",)))
        assert isinstance(answer, pb.ModelInferResponse), (name, answer)
        assert [list(o.shape) for o in answer.outputs] == [list(shape)], name
        assert list(answer.raw_output_contents) == [b""], name


# -------------------------------------------------------------------------------- 2. BF16


def test_bf16_raw_bytes_come_back_as_sent(servers: dict[str, str]) -> None:
    data = np.array([0x3F80, 0xC000, 0x7FC0, 0x0001, 0xFFFF], "<u2").tobytes()
    for name, url in _each(servers):
        answer = infer(url, request("bf16", (5,), raw=(data,), datatype="BF16"))
        assert isinstance(answer, pb.ModelInferResponse), (name, answer)
        assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [
            ("OUTPUT0", "BF16", [5])
        ], name
        assert list(answer.raw_output_contents) == [data], name


# ----------------------------------------------------------- 3. inputs vs raw entries count


def test_an_input_without_a_raw_entry_is_named(servers: dict[str, str]) -> None:
    two = request(inputs=("INPUT0", "INPUT1"), raw=(bytes(16),))
    message = "unable to find data for input tensor 'INPUT1' for model 'm' in request."
    # NOTE: before the core's checks: INPUT1's wrong shape is not what is reported.
    bad_shape = request(inputs=("INPUT0", "INPUT1"), raw=(bytes(16),), shape=(5,))
    for name, url in _each(servers):
        assert infer(url, two) == (INVALID, message), name
        assert infer(url, bad_shape) == (INVALID, message), name


def test_surplus_raw_entries_are_ignored(servers: dict[str, str]) -> None:
    first = np.arange(4, dtype=np.float32).tobytes()
    for name, url in _each(servers):
        for _ in range(2):  # NOTE: the second goes triton-mp's known-request way
            answer = infer(url, request(raw=(first, bytes(16), b"x")))
            assert isinstance(answer, pb.ModelInferResponse), (name, answer)
            assert list(answer.raw_output_contents) == [first], name


# --------------------------------------------------------------------- 4. repeated outputs


def test_an_output_requested_twice_is_refused_as_upstream_main(servers: dict[str, str]) -> None:
    message = "[request id: r38] output 'OUTPUT0' already exists in request"
    for name, url in _each(servers, main_only=True):
        assert infer(url, request(outputs=("OUTPUT0", "OUTPUT0"))) == (INVALID, message), name
        # Before the data is looked for.
        assert infer(url, request(outputs=("OUTPUT0", "OUTPUT0"), raw=())) == (
            INVALID,
            message,
        ), name
    if "triton" in servers:
        # Triton 2.51 answers it once (core before PR #493).
        answer = infer(servers["triton"], request(outputs=("OUTPUT0", "OUTPUT0")))
        assert isinstance(answer, pb.ModelInferResponse)
        assert [o.name for o in answer.outputs] == ["OUTPUT0"]


# ------------------------------------------------------------------------ 5. stream errors


def test_a_refused_stream_request_is_answered_with_its_id_alone(
    servers: dict[str, str],
) -> None:
    refused = request(inputs=("INPUT0", "INPUT1"), raw=(bytes(16),), version="1", rid="bad")
    unknown = request("nosuch", rid="gone")
    for name, url in _each(servers):
        got, status = stream(url, [refused, unknown, request(rid="ok")], 3)
        assert status == (grpc.StatusCode.OK, ""), name
        assert [r.error_message for r in got] == [
            "unable to find data for input tensor 'INPUT1' for model 'm' in request.",
            "Request for unknown model: 'nosuch' is not found",
            "",
        ], name
        assert got[0].infer_response == pb.ModelInferResponse(id="bad"), name
        assert got[1].infer_response == pb.ModelInferResponse(id="gone"), name
        assert got[2].infer_response.id == "ok", name


def test_a_model_error_ends_the_stream_with_triton_grpc_error(
    servers_to_break: dict[str, str],
) -> None:
    bad = np.array([-1, 0, 0, 0], np.float32).tobytes()
    header = (("triton_grpc_error", "true"),)
    for name, url in _each(servers_to_break):
        # A refusal before the model runs stays in the stream, with the header too.
        refused = request("fail", raw=(), rid="c")
        got, status = stream(url, [refused, request("fail", rid="d")], 2, header)
        assert [(r.error_message, r.infer_response.id) for r in got] == [
            ("unable to find data for input tensor 'INPUT0' for model 'fail' in request.", "c"),
            ("", "d"),
        ], name
        assert status == (grpc.StatusCode.OK, ""), name
        # NOTE: last: Triton 2.51 may crash after it (servers_to_break).
        got, status = stream(url, [request("fail", raw=(bad,), rid="b")], 1, header)
        assert (got, status) == ([], (grpc.StatusCode.INTERNAL, "negative input")), name
    # triton-mp goes on serving.
    got, status = stream(servers_to_break["triton-mp"], [request("fail", rid="a")], 1, header)
    assert ([r.infer_response.id for r in got], status) == (["a"], (grpc.StatusCode.OK, ""))


# -------------------------------------------------- 6. the request's version in the stream


def _final(value: bool) -> dict[str, pb.InferParameter]:
    return {"triton_final_response": pb.InferParameter(bool_param=value)}


@pytest.mark.parametrize("version", ["", "1"])
def test_stream_responses_built_by_the_frontend_echo_the_requests_version(
    servers: dict[str, str], version: str
) -> None:
    bad = np.array([-1, 0, 0, 0], np.float32).tobytes()
    empty_final = request("dec", version=version, rid="e")
    empty_final.parameters["triton_enable_empty_final_response"].bool_param = True
    failing = request("dec", raw=(bad,), version=version, rid="f")
    failing_plain = request("fail", raw=(bad,), version=version, rid="g")
    for name, url in _each(servers):
        got, status = stream(url, [empty_final], 1)
        assert status == (grpc.StatusCode.OK, ""), name
        assert [(r.error_message, r.infer_response) for r in got] == [
            (
                "",
                pb.ModelInferResponse(
                    model_name="dec", model_version=version, id="e", parameters=_final(True)
                ),
            ),
        ], name
        got, _ = stream(url, [failing], 1)
        assert [(r.error_message, r.infer_response) for r in got] == [
            (
                "negative input",
                pb.ModelInferResponse(
                    model_name="dec", model_version=version, id="f", parameters=_final(False)
                ),
            ),
        ], name
        got, _ = stream(url, [failing_plain], 1)
        assert [(r.error_message, r.infer_response) for r in got] == [
            (
                "negative input",
                pb.ModelInferResponse(
                    model_name="fail", model_version=version, id="g", parameters=_final(True)
                ),
            ),
        ], name


# ------------------------------------------------------------------ the sweep's findings


DECOUPLED = "ModelInfer RPC doesn't support models with decoupled transaction policy"
P = pb.InferParameter


def test_model_infer_refuses_a_decoupled_model_before_reading_the_request(
    servers: dict[str, str],
) -> None:
    unimplemented = (grpc.StatusCode.UNIMPLEMENTED, DECOUPLED)
    bad_parameter = request("dec")
    bad_parameter.parameters["priority"].string_param = "high"
    for name, url in _each(servers):
        assert infer(url, request("dec", raw=())) == unimplemented, name
        assert infer(url, request("dec", datatype="INT32")) == unimplemented, name
        assert infer(url, bad_parameter) == unimplemented, name


def test_the_empty_final_response_flag_must_be_a_bool(servers: dict[str, str]) -> None:
    message = (
        "invalid value type for 'triton_enable_empty_final_response' parameter, expected "
        "bool_param."
    )
    as_string = request(rid="s")
    as_string.parameters["triton_enable_empty_final_response"].string_param = "true"
    for name, url in _each(servers):
        assert infer(url, as_string) == (INVALID, message), name
        got, _ = stream(url, [as_string], 1)
        assert [(r.error_message, r.infer_response) for r in got] == [
            (message, pb.ModelInferResponse(id="s"))
        ], name


def test_a_shared_memory_window_is_looked_up_before_the_cores_checks(
    servers: dict[str, str],
) -> None:
    window = {
        "shared_memory_region": P(string_param="nowhere"),
        "shared_memory_byte_size": P(int64_param=16),
    }
    not_found = (grpc.StatusCode.NOT_FOUND, "Unable to find shared memory region: 'nowhere'")
    wrong_type = request(datatype="INT32", raw=())
    for key, value in window.items():
        wrong_type.inputs[0].parameters[key].CopyFrom(value)
    unknown_output = request(outputs=("NOPE", "OUTPUT0"))
    for key, value in window.items():
        unknown_output.outputs[1].parameters[key].CopyFrom(value)
    for name, url in _each(servers):
        assert infer(url, wrong_type) == not_found, name
        assert infer(url, unknown_output) == not_found, name


def test_unknown_outputs_are_found_before_the_inputs_in_sorted_order(
    servers: dict[str, str],
) -> None:
    req = request(datatype="INT32", outputs=("ZZ", "OUTPUT0", "AA"), raw=())
    req.inputs.add(name="NOPE", datatype="FP32", shape=[4])
    req.raw_input_contents.extend((bytes(16), bytes(16)))
    message = "unexpected inference output 'AA' for model 'm'"
    for name, url in _each(servers):
        assert infer(url, req) == (INVALID, message), name


def test_a_contents_message_without_elements_is_typed_contents(servers: dict[str, str]) -> None:
    beside_raw = request()
    beside_raw.inputs[0].contents.SetInParent()
    alone = request(raw=())
    alone.inputs[0].contents.SetInParent()
    for name, url in _each(servers):
        assert infer(url, beside_raw) == (
            INVALID,
            "contents field must not be specified when using raw_input_contents for 'INPUT0' "
            "for model 'm'",
        ), name
        assert infer(url, alone) == (
            INVALID,
            "[request id: r38] input byte size mismatch for input 'INPUT0' for model 'm'. "
            "Expected 16, got 0",
        ), name


def test_a_decoupled_models_refusal_does_not_wait_its_turn_in_the_stream(
    servers: dict[str, str],
) -> None:
    """stream_infer_handler.cc Process: only a non-decoupled request's response is queued in
    request order; a request whose model it cannot find counts as non-decoupled."""
    slow = request("slow", rid="slow")
    refused = request("dec", raw=(), rid="dec")
    unknown = request("nosuch", rid="nosuch")
    for name, url in _each(servers):
        got, status = stream(url, [slow, unknown, refused], 3)
        assert status == (grpc.StatusCode.OK, ""), name
        assert [r.infer_response.id for r in got] == ["dec", "slow", "nosuch"], name
