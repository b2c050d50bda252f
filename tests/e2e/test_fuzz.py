"""Protocol fuzzing: malformed ModelInferRequests over raw gRPC stubs and malformed HTTP
inference bodies, against one running server.

Every request must get an answer (a response or a status from ``ALLOWED_GRPC`` /
``ALLOWED_HTTP``: never UNKNOWN, INTERNAL or a timeout), and after the run the server must
still serve a normal request with no process of it having died.

Bounded in CI: ``FUZZ_EXAMPLES`` (200) examples per transport with ``derandomize=True``, so
every run sends the same requests. Longer local runs draw fresh random examples::

    TRITON_MP_FUZZ_EXAMPLES=20000 python -m pytest tests/e2e/test_fuzz.py -q
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import grpc
import hypothesis.strategies as st
import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings

from tests.helpers.fault_models import write_faulty_model
from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import ServerProcess, server_factory
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp._proto import grpc_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

FUZZ_EXAMPLES = int(os.environ.get("TRITON_MP_FUZZ_EXAMPLES", "200"))
LONG_MODE = "TRITON_MP_FUZZ_EXAMPLES" in os.environ
FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    derandomize=not LONG_MODE,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ALLOWED_GRPC = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ALREADY_EXISTS,
}
"""What a malformed request may get. UNKNOWN (an unhandled exception in a handler),
INTERNAL (a validation hole the backend tripped on) or DEADLINE_EXCEEDED (no answer) fail."""

ALLOWED_HTTP = {200, 400, 404, 413, 501, 503}
TRITON_JSON_WORDS = (
    "attempt to access",
    "attempt to get members for non-object",
    "Shape does not match true shape of 'data' field",
    "failed to parse the request JSON buffer: ",
)
"""Triton's INTERNAL (500) answers to malformed JSON members (``json_tensors.access_error``)
and to a body that is not JSON (RapidJSON's message and offset, 8653e77)."""

OUTCOMES: dict[str, int] = {}
"""Status -> count over the run, printed at the end (``-s``) to see how deep the fuzz went."""

MODELS = ("add_sub", "echo_py", "bytes_py", "", "missing")
NAMES = ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1", "", "x" * 300, "IN\x00PUT0")
DATATYPES = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "BF16", "FP32", "FP64", "BYTES", "", "fp32", "FLOAT", "TYPE_FP32",
)  # fmt: skip
ELEMENT_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2,
                 "BF16": 2, "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8,
                 "FP64": 8}  # fmt: skip
PARAM_KEYS = (
    "priority", "timeout", "sequence_id", "sequence_start", "sequence_end",
    "binary_data_output", "binary_data", "binary_data_size", "classification",
    "shared_memory_region", "shared_memory_offset", "shared_memory_byte_size",
    "triton_", "headers", "",
)  # fmt: skip
BIG = 2**62

dims = st.one_of(
    st.integers(0, 20),
    st.sampled_from([-1, -2, -(2**63), 2**31, 2**40, BIG, 2**63 - 1, 16]),
)
shapes = st.lists(dims, max_size=5)
scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)


def _param(value: object) -> pb.InferParameter:
    p = pb.InferParameter()
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        if value >= 2**63:
            p.uint64_param = value
        else:
            p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)
    return p


parameters = st.dictionaries(
    st.sampled_from(PARAM_KEYS) | st.text(max_size=12), scalars, max_size=4
)


def _bytes_tensor(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


@st.composite
def valid_inputs(draw: st.DrawFn, model: str) -> list[tuple[str, str, list[int], bytes]]:
    """Inputs a model accepts: (name, datatype, shape, raw bytes)."""
    if model == "add_sub":
        b = draw(st.integers(1, 8))
        return [
            (n, "FP32", [b, 16], np.ones((b, 16), np.float32).tobytes())
            for n in ("INPUT0", "INPUT1")
        ]
    if model == "bytes_py":
        b, n = draw(st.integers(1, 4)), draw(st.integers(0, 4))
        items = draw(st.lists(st.binary(max_size=6), min_size=b * n, max_size=b * n))
        return [("INPUT0", "BYTES", [b, n], _bytes_tensor(items))]
    n = draw(st.integers(0, 300))
    return [("INPUT0", "FP32", [n], np.zeros(n, np.float32).tobytes())]


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    """A valid request for one of the models, then 0-3 mutations of its fields (so most
    requests get past the first checks and exercise the deeper ones)."""
    model = draw(st.sampled_from(MODELS[:3]))
    inputs = [list(t) for t in draw(valid_inputs(model))]
    req = pb.ModelInferRequest(model_name=model)
    typed = False
    mutations = draw(
        st.lists(
            st.sampled_from(
                [
                    "model", "version", "request_params", "name", "datatype", "shape",
                    "drop_input", "dup_input", "raw_size", "typed", "extra_raw", "input_params",
                    "shm", "outputs", "id",
                ]
            ),
            max_size=3,
        )
    )  # fmt: skip
    for m in mutations:
        i = draw(st.integers(0, max(len(inputs) - 1, 0)))
        if m == "model":
            req.model_name = draw(st.sampled_from(MODELS) | st.text(max_size=20))
        elif m == "version":
            req.model_version = draw(st.sampled_from(["1", "2", "0", "-1", "abc", str(BIG)]))
        elif m == "id":
            req.id = draw(st.text(max_size=40))
        elif m == "request_params":
            for k, v in draw(parameters).items():
                req.parameters[k].CopyFrom(_param(v))
        elif not inputs:
            continue
        elif m == "name":
            inputs[i][0] = draw(st.sampled_from(NAMES) | st.text(max_size=10))
        elif m == "datatype":
            inputs[i][1] = draw(st.sampled_from(DATATYPES))
        elif m == "shape":
            shape = list(inputs[i][2])
            if shape and draw(st.booleans()):
                shape[draw(st.integers(0, len(shape) - 1))] = draw(dims)
            else:
                shape = draw(shapes)
            inputs[i][2] = shape
        elif m == "drop_input":
            inputs.pop(i)
        elif m == "dup_input":
            inputs.append(list(inputs[i]))
        elif m == "raw_size":
            data = inputs[i][3]
            cut = draw(st.integers(-8, 8))
            inputs[i][3] = data[:cut] if cut < 0 else data + bytes(cut)
        elif m == "typed":
            typed = True
        elif m == "extra_raw":
            req.raw_input_contents.append(draw(st.binary(max_size=16)))
        elif m in ("input_params", "shm"):
            inputs[i].append(m)
        elif m == "outputs":
            for _ in range(draw(st.integers(1, 3))):
                out = req.outputs.add(name=draw(st.sampled_from(NAMES)))
                for k, v in draw(parameters).items():
                    out.parameters[k].CopyFrom(_param(v))
    extra_raw = list(req.raw_input_contents)
    del req.raw_input_contents[:]
    for name, datatype, shape, data, *flags in inputs:
        t = req.inputs.add(name=name, datatype=datatype, shape=shape)
        if "input_params" in flags:
            for k, v in draw(parameters).items():
                t.parameters[k].CopyFrom(_param(v))
        if "shm" in flags:
            t.parameters["shared_memory_region"].string_param = draw(
                st.sampled_from(["", "nope", "x" * 200])
            )
            for k in ("shared_memory_offset", "shared_memory_byte_size"):
                if draw(st.booleans()):
                    t.parameters[k].CopyFrom(_param(draw(scalars)))
            continue
        if typed:
            n = draw(st.integers(0, 40))
            kind = draw(st.sampled_from(["fp32", "int64", "bytes", "bool"]))
            if kind == "fp32":
                t.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=n)))
            elif kind == "int64":
                ints = st.integers(-(2**63), 2**63 - 1)
                t.contents.int64_contents.extend(draw(st.lists(ints, max_size=n)))
            elif kind == "bytes":
                t.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=8), max_size=n)))
            else:
                t.contents.bool_contents.extend(draw(st.lists(st.booleans(), max_size=n)))
        else:
            req.raw_input_contents.append(data)
    req.raw_input_contents.extend(extra_raw)
    return req


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = copy_models(tmp_path_factory.mktemp("fuzz") / "repo", "add_sub")
    write_fuzz_models(repo)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


BYTES_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def write_fuzz_models(repo: Path) -> None:
    """Write the python models ``infer_requests`` names besides add_sub into ``repo``:
    ``echo_py`` (any FP32 shape back) and ``bytes_py`` (BYTES back, dynamic batching)."""
    write_faulty_model(repo, "echo_py", "none", dims="-1")
    write_python_model(
        repo,
        "bytes_py",
        'backend: "python"\nmax_batch_size: 4\n'
        'input [{ name: "INPUT0", data_type: TYPE_STRING, dims: [-1] }]\n'
        'output [{ name: "OUTPUT0", data_type: TYPE_STRING, dims: [-1] }]\n'
        "dynamic_batching {}\n",
        BYTES_MODEL,
    )


def _still_serving(server: ServerProcess) -> None:
    print("fuzz outcomes:", dict(sorted(OUTCOMES.items())))
    client = server.client()
    try:
        import tritonclient.grpc as grpcclient

        inputs = []
        for name in ("INPUT0", "INPUT1"):
            i = grpcclient.InferInput(name, [1, 16], "FP32")
            i.set_data_from_numpy(np.ones((1, 16), np.float32))
            inputs.append(i)
        out = client.infer("add_sub", inputs, client_timeout=60).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, np.full((1, 16), 2, np.float32))
        assert client.is_server_ready()
    finally:
        client.close()
    assert server.proc.poll() is None
    assert "died with exit code" not in server.log(), server.log()


def test_grpc_model_infer_fuzz(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        @FUZZ_SETTINGS
        @given(req=infer_requests())
        def one(req: pb.ModelInferRequest) -> None:
            try:
                stub.ModelInfer(req, timeout=60)
                outcome = ("OK", "answered")
            except grpc.RpcError as e:
                outcome = (e.code(), e.details())  # type: ignore[attr-defined]
            OUTCOMES[str(outcome[0])] = OUTCOMES.get(str(outcome[0]), 0) + 1
            assert outcome[0] == "OK" or outcome[0] in ALLOWED_GRPC, (outcome, req)
            assert outcome[1], (outcome, req)

        one()
    _still_serving(server)


json_values = st.recursive(
    st.none() | scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def http_bodies(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    """A valid JSON or binary-extension body for one model, then 0-3 mutations."""
    model = draw(st.sampled_from(MODELS[:3]))
    binary_mode = draw(st.booleans())
    tensors: list[dict[str, object]] = []
    chunks: list[bytes] = []
    for name, datatype, shape, data in draw(valid_inputs(model)):
        t: dict[str, object] = {"name": name, "datatype": datatype, "shape": shape}
        if binary_mode:
            t["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        elif datatype == "BYTES":
            t["data"] = ["a"] * int(np.prod(shape))
        else:
            t["data"] = np.frombuffer(data, np.float32).tolist()
        tensors.append(t)
    doc: dict[str, object] = {"inputs": tensors}
    header_len: object = "exact"
    replacement: object = doc
    mutations = draw(
        st.lists(
            st.sampled_from(
                [
                    "model", "field", "drop", "data", "size", "chunk", "outputs", "params",
                    "doc", "header_len", "junk",
                ]
            ),
            max_size=3,
        )
    )  # fmt: skip
    for m in mutations:
        i = draw(st.integers(0, max(len(tensors) - 1, 0)))
        if m == "model":
            model = draw(st.sampled_from(MODELS[3:]) | st.text(alphabet="abc_", max_size=8))
        elif m == "outputs":
            doc["outputs"] = draw(json_values)
        elif m == "params":
            doc["parameters"] = draw(json_values)
        elif m == "doc":
            replacement = draw(json_values)
        elif m == "header_len":
            header_len = draw(st.sampled_from([0, -5, 3, BIG, "x"]))
        elif m == "junk":
            chunks.append(draw(st.binary(max_size=32)))
        elif not tensors:
            continue
        elif m == "field":
            key = draw(st.sampled_from(["name", "datatype", "shape"]))
            tensors[i][key] = draw(
                st.sampled_from([None, 7, "x", [], [-1], [BIG], ["1"], "FP32", "BYTES"])
            )
        elif m == "drop":
            tensors.pop(i)
        elif m == "data":
            tensors[i]["data"] = draw(json_values)
        elif m == "size" and binary_mode:
            size = draw(st.sampled_from([-1, 0, 1, BIG, "12", None]))
            tensors[i]["parameters"] = {"binary_data_size": size}
        elif m == "chunk" and chunks:
            cut = draw(st.integers(-8, 8))
            chunks[-1] = chunks[-1][:cut] if cut < 0 else chunks[-1] + bytes(cut)
    header = json.dumps(replacement).encode()
    headers = {"Content-Type": "application/json"}
    if binary_mode or header_len != "exact":
        headers["Inference-Header-Content-Length"] = str(
            len(header) if header_len == "exact" else header_len
        )
    return model, header + b"".join(chunks), headers


def test_http_infer_fuzz(server: ServerProcess) -> None:
    session = requests.Session()

    @FUZZ_SETTINGS
    @given(case=http_bodies())
    def one(case: tuple[str, bytes, dict[str, str]]) -> None:
        model, body, headers = case
        r = session.post(
            f"http://{server.http_url}/v2/models/{model}/infer",
            data=body,
            headers=headers,
            timeout=60,
        )
        OUTCOMES[f"HTTP {r.status_code}"] = OUTCOMES.get(f"HTTP {r.status_code}", 0) + 1
        # NOTE: Triton answers a JSON member missing or of the wrong type with 500 and
        # TritonJson's words; any other 500 is a validation hole.
        triton_json = r.status_code == 500 and any(w in r.text for w in TRITON_JSON_WORDS)
        assert r.status_code in ALLOWED_HTTP or triton_json, (r.status_code, r.text, body[:300])
        if r.status_code != 200:
            assert "error" in r.json(), r.text

    one()
    session.close()
    _still_serving(server)
