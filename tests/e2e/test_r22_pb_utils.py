"""What a python model's ``pb_utils`` objects are, side by side with the real Triton 2.51
(``.peers/``; where it is not installed, triton-mp alone is held to 2.51's answers, pinned
here). Each case runs against both servers of tests/e2e/conftest.py's shared pair, over
gRPC and HTTP (tritonclient).

1. ``pb_utils.Tensor(name, array)`` refuses a numpy dtype Triton has no datatype for when
   the tensor is made, raising ``TritonModelException("NumPy dtype is not supported.")``
   (2.51's ``triton_python_backend_utils.numpy_to_triton_type`` gives None for it; pb_stub's
   ``PbTensor`` raises): a non-native byte order (``>f4``: its bytes are not FP32's), complex,
   datetime, void and ``str`` (``U``) arrays. A model can catch it (2.51's exception has no
   ``message()``: ``str(e)`` is the message in both). triton-mp took them, then
   sent a big-endian array's raw bytes labelled FP32 (a wrong answer) and failed the others
   while writing the answer, where no model can catch it.
2. ``request.requested_output_names()`` is a ``set`` (pybind's form of pb_stub's
   ``std::set<std::string>``): set operations on it work. triton-mp gave a list.

And a difference kept (docs/differences.md), pinned:

3. ``request.inputs()`` lists a request's inputs in core's order: the request's
   ``inputs_`` map (an ``unordered_map``) filled by walking ``original_inputs_`` (another
   one, filled in the order the client sent them), so names that share a hash bucket are
   regrouped (``common.unordered.iteration_order`` twice). triton-mp lists them as sent.
4. ``request.parameters()`` is the same JSON object in both, written differently: 2.51's
   TritonJson is compact with UTF-8 as is (``{"a":1,"é":"ü"}``), triton-mp's is Python's
   ``json.dumps`` (``{"a": 1, "\\u00e9": "\\u00fc"}``); ``json.loads`` reads both alike.
5. A response whose ``output_tensors`` name one output twice: 2.51 answers both tensors
   under that name (over gRPC tritonclient then fails to read it); triton-mp answers the
   last one alone.
6. ``pb_utils.Tensor`` of a numpy masked array: 2.51's raises AttributeError ("'numpy.ndarray'
   object has no attribute 'c_contiguous'"); triton-mp takes its data.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of
from triton_mp.common.unordered import iteration_order

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DTYPES_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

ARRAYS = {
    "big-endian FP32": lambda: np.arange(3, dtype=">f4"),
    "big-endian INT64": lambda: np.arange(3, dtype=">i8"),
    "complex64": lambda: np.zeros(3, dtype=np.complex64),
    "datetime64": lambda: np.zeros(3, dtype="datetime64[s]"),
    "void": lambda: np.zeros(3, dtype="V4"),
    "str": lambda: np.array(["a", "bc"]),
    "native FP32": lambda: np.arange(3, dtype="<f4"),
    "bytes_": lambda: np.array([b"a", b"bc"]),
    "object": lambda: np.array([b"a", b"bc"], dtype=np.object_),
    "bool": lambda: np.array([True, False]),
    "masked": lambda: np.ma.masked_array(np.arange(3, dtype=np.float32)),
}


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            case = pb_utils.get_input_tensor_by_name(r, "CASE").as_numpy()[0].decode()
            try:
                pb_utils.Tensor("T", ARRAYS[case]())
                said = "made"
            except pb_utils.TritonModelException as e:
                said = "refused: " + str(e)
            except Exception as e:
                said = f"failed: {type(e).__name__}: {e}"
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SAID", np.array([said.encode()], dtype=np.object_))]))
        return out
"""
DTYPES_CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "CASE", data_type: TYPE_STRING, dims: [ 1 ] }]
output [{ name: "SAID", data_type: TYPE_STRING, dims: [ 1 ] }]
"""

SEEN_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            names = r.requested_output_names()
            try:
                but_seen = sorted(names - {"SEEN"})
            except TypeError as e:
                but_seen = str(e)
            seen = {
                "parameters": r.parameters(),
                "outputs type": type(names).__name__,
                "outputs": sorted(names),
                "outputs but SEEN": but_seen,
                "inputs": [t.name() for t in r.inputs()],
            }
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SEEN", np.array([json.dumps(seen).encode()], dtype=np.object_))]))
        return out
"""
INPUT_NAMES = ("IN_I8", "IN_U64", "IN_BYTES", "IN_BOOL", "IN_FP16")
SEEN_CONFIG = (
    'backend: "python"\nmax_batch_size: 0\ninput [\n'
    + ",\n".join(
        f'  {{ name: "{n}", data_type: TYPE_INT8, dims: [ 1 ], optional: true }}'
        for n in INPUT_NAMES
    )
    + '\n]\noutput [\n  { name: "SEEN", data_type: TYPE_STRING, dims: [ 1 ] },\n'
    + '  { name: "OTHER", data_type: TYPE_INT8, dims: [ 1 ] }\n]\n'
)

TWICE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.arange(3, dtype=np.int8)),
                pb_utils.Tensor("OUT", np.arange(4, dtype=np.int8)),
            ])
            for _ in requests
        ]
"""
TWICE_CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "IN_I8", data_type: TYPE_INT8, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_INT8, dims: [ -1 ] }]
"""

SIDE_BY_SIDE_MODELS = {
    "r22_dtypes": PythonModel(DTYPES_CONFIG, DTYPES_MODEL),
    "r22_seen": PythonModel(SEEN_CONFIG, SEEN_MODEL),
    "r22_twice": PythonModel(TWICE_CONFIG, TWICE_MODEL),
}
"""tests/e2e/conftest.py's ``shared_side_by_side`` serves them."""

SERVERS = pytest.mark.parametrize("which", ["triton-mp", "triton"])
PROTOCOLS = pytest.mark.parametrize("client", [grpcclient, httpclient], ids=["grpc", "http"])


@pytest.fixture(scope="module")
def urls(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> Callable[[str], tuple[str, str]]:
    """(gRPC, HTTP) of ``triton-mp`` or ``triton`` (the latter skips when not installed)."""
    return lambda which: urls_of(shared_side_by_side, which)


def _infer(client_module: object, url: str, model: str, inputs: dict[str, np.ndarray]) -> object:
    """One request over ``client_module`` (tritonclient.grpc or .http); its result."""
    module: object = client_module
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    try:
        built = []
        for name, arr in inputs.items():
            dtype = "BYTES" if arr.dtype == np.object_ else "INT8"
            inp = module.InferInput(name, list(arr.shape), dtype)  # type: ignore[attr-defined]
            inp.set_data_from_numpy(arr)
            built.append(inp)
        return client.infer(model, built)
    finally:
        client.close()


def _url(urls: Callable[[str], tuple[str, str]], which: str, client: object) -> str:
    grpc_url, http_url = urls(which)
    return grpc_url if client is grpcclient else http_url


REFUSED = "refused: NumPy dtype is not supported."


@SERVERS
@PROTOCOLS
@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("big-endian FP32", REFUSED),
        ("big-endian INT64", REFUSED),
        ("complex64", REFUSED),
        ("datetime64", REFUSED),
        ("void", REFUSED),
        ("str", REFUSED),
        ("native FP32", "made"),
        ("bytes_", "made"),
        ("object", "made"),
        ("bool", "made"),
        ("masked", "made"),
    ],
)
def test_a_tensor_of_a_dtype_triton_lacks_is_refused_when_made(
    which: str,
    client: object,
    case: str,
    said: str,
    urls: Callable[[str], tuple[str, str]],
) -> None:
    result = _infer(
        client,
        _url(urls, which, client),
        "r22_dtypes",
        {"CASE": np.array([case.encode()], dtype=np.object_)},
    )
    if case == "masked" and which == "triton":
        # NOTE: differences.md: 2.51's pb_utils reads a flag numpy's masked arrays lack
        said = "failed: AttributeError: 'numpy.ndarray' object has no attribute 'c_contiguous'"
    assert result.as_numpy("SAID")[0].decode() == said  # type: ignore[attr-defined]


def _seen(result: object) -> dict[str, object]:
    seen: dict[str, object] = json.loads(result.as_numpy("SEEN")[0])  # type: ignore[attr-defined]
    return seen


@SERVERS
@PROTOCOLS
def test_requested_output_names_is_a_set(
    which: str, client: object, urls: Callable[[str], tuple[str, str]]
) -> None:
    one = {"IN_I8": np.array([1], np.int8)}
    seen = _seen(_infer(client, _url(urls, which, client), "r22_seen", one))
    assert seen["outputs type"] == "set"
    assert seen["outputs"] == ["OTHER", "SEEN"]
    assert seen["outputs but SEEN"] == ["OTHER"]


SENT = ("IN_I8", "IN_U64", "IN_BYTES", "IN_BOOL", "IN_FP16")
"""Sent in this order, 2.51's model sees IN_BYTES second: it shares IN_I8's bucket."""


@SERVERS
@PROTOCOLS
def test_a_python_request_lists_its_inputs_as_sent_not_in_cores_map_order(
    which: str, client: object, urls: Callable[[str], tuple[str, str]]
) -> None:
    sent = {n: np.array([i], np.int8) for i, n in enumerate(SENT)}
    seen = _seen(_infer(client, _url(urls, which, client), "r22_seen", sent))
    cores = iteration_order(iteration_order(SENT))
    assert cores == ["IN_I8", "IN_BYTES", "IN_U64", "IN_BOOL", "IN_FP16"]
    assert seen["inputs"] == (cores if which == "triton" else list(SENT))


@SERVERS
def test_request_parameters_are_one_json_object_written_two_ways(
    which: str, urls: Callable[[str], tuple[str, str]]
) -> None:
    """Over HTTP, whose JSON keeps the client's order (gRPC's map does not)."""
    client = httpclient.InferenceServerClient(urls(which)[1])
    try:
        inp = httpclient.InferInput("IN_I8", [1], "INT8")
        inp.set_data_from_numpy(np.array([1], np.int8))
        sent = {"a": 1, "é": "ü", "b": True}
        seen = _seen(client.infer("r22_seen", [inp], parameters=sent))
    finally:
        client.close()
    assert json.loads(str(seen["parameters"])) == sent
    written = {
        "triton": '{"a":1,"é":"ü","b":true}',
        "triton-mp": '{"a": 1, "\\u00e9": "\\u00fc", "b": true}',
    }
    assert seen["parameters"] == written[which]


@SERVERS
def test_an_output_named_twice_in_a_response(
    which: str, urls: Callable[[str], tuple[str, str]]
) -> None:
    """Over HTTP JSON, where both of 2.51's tensors can be read."""
    client = httpclient.InferenceServerClient(urls(which)[1])
    try:
        inp = httpclient.InferInput("IN_I8", [1], "INT8")
        inp.set_data_from_numpy(np.array([1], np.int8), binary_data=False)
        out = httpclient.InferRequestedOutput("OUT", binary_data=False)
        body = client.infer("r22_twice", [inp], outputs=[out]).get_response()
    finally:
        client.close()
    answered = [(o["name"], o["shape"], o["data"]) for o in body["outputs"]]
    both = [("OUT", [3], [0, 1, 2]), ("OUT", [4], [0, 1, 2, 3])]
    assert answered == (both if which == "triton" else both[1:])
