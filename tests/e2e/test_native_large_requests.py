"""Large requests through the native gRPC frontend: a unary request whose raw entries hold
``RECEIVED_MIN_RAW_BYTES`` or more stays in gRPC's receive slices (``_native.Received``),
and a known request's entries are copied from there straight into its input block
(``known_requests.write_known``); any other is made bytes and served as before. Side by
side with ``--grpc-frontend python``, byte for byte: two large inputs of odd sizes (each
at its 64-byte aligned place in the block) come back whole request after request, and a
known key whose raw entry disagrees with its shape, a truncated large message, a large
message with a byte changed and surplus raw entries get Python's answers."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.native import _NATIVE, available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

INFER = "/inference.GRPCInferenceService/ModelInfer"
PAIR_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "A", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "B", data_type: TYPE_UINT8, dims: [ -1 ] }
]
output [
  { name: "A_OUT", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "B_OUT", data_type: TYPE_UINT8, dims: [ -1 ] }
]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
PAIR_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("A_OUT", a * 2), pb_utils.Tensor("B_OUT", b[::-1].copy()),
            ]))
        return out
"""
A_COUNT = 25_001  # FP32: 100,004 bytes, past RECEIVED_MIN_RAW_BYTES on its own
B_COUNT = 70_003  # UINT8


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    repo = tmp_path_factory.mktemp("large") / "repo"
    write_python_model(repo, "pair_py", PAIR_CONFIG, PAIR_MODEL)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        # NOTE: the two start side by side
        both = {f: start(repo, "--grpc-frontend", f, wait=False) for f in ("native", "python")}
        for server in both.values():
            server.wait_live()
        yield both


def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(A_COUNT, dtype=np.float32)
    return a, rng.integers(0, 256, B_COUNT, dtype=np.uint8)


def _request(seed: int, rid: str, a_bytes: int | None = None, extra: int = 0) -> bytes:
    """pair_py's request (A: FP32 [A_COUNT], B: UINT8 [B_COUNT]); ``a_bytes``: send that
    many of A's bytes; ``extra``: that many surplus raw entries."""
    a, b = _inputs(seed)
    req = pb.ModelInferRequest(model_name="pair_py", id=rid)
    req.inputs.add(name="A", datatype="FP32", shape=[A_COUNT])
    req.inputs.add(name="B", datatype="UINT8", shape=[B_COUNT])
    raw_a = a.tobytes()
    req.raw_input_contents.append(raw_a if a_bytes is None else raw_a[:a_bytes])
    req.raw_input_contents.append(b.tobytes())
    req.raw_input_contents.extend(bytes(70_000) for _ in range(extra))
    assert _NATIVE is None or len(raw_a) >= _NATIVE.RECEIVED_MIN_RAW_BYTES
    return bytes(req.SerializeToString())


def _call(url: str, body: bytes) -> tuple[str, str, bytes]:
    """(status code name, details, response bytes) of a raw ModelInfer call."""
    with grpc.insecure_channel(url) as channel:
        try:
            out = channel.unary_unary(INFER)(body, timeout=60)
        except grpc.RpcError as e:
            return e.code().name, str(e.details()), b""
    return "OK", "", bytes(out)


def _both(servers: dict[str, ServerProcess], body: bytes) -> tuple[str, str, bytes]:
    """The native frontend's answer, checked to be the Python frontend's, byte for byte."""
    native = _call(servers["native"].url, body)
    assert native == _call(servers["python"].url, body)
    return native


def test_large_known_requests_come_back_whole(servers: dict[str, ServerProcess]) -> None:
    """The same key five times (from the second on a known request, its two entries
    copied from gRPC's slices into the block), each with its own data and id."""
    for seed in range(5):
        code, details, data = _both(servers, _request(seed, f"r{seed}"))
        assert (code, details) == ("OK", "")
        out = pb.ModelInferResponse.FromString(data)
        assert out.id == f"r{seed}"
        a, b = _inputs(seed)
        got_a = np.frombuffer(out.raw_output_contents[0], np.float32)
        np.testing.assert_array_equal(got_a, a * 2)
        np.testing.assert_array_equal(np.frombuffer(out.raw_output_contents[1], np.uint8), b[::-1])


BAD = {
    "raw entry shorter than its shape": lambda: _request(7, "bad", a_bytes=4 * A_COUNT - 4),
    "raw entry longer than its shape": lambda: _grown(),
    "truncated mid-entry": lambda: _request(7, "bad")[:150_000],
    "truncated by a byte": lambda: _request(7, "bad")[:-1],
    "a size byte changed": lambda: _changed(_request(7, "bad")),
    "surplus raw entries": lambda: _request(7, "extra", extra=2),
}


def _grown() -> bytes:
    """The known key with A's entry 4 bytes longer than its shape calls for."""
    req = pb.ModelInferRequest.FromString(_request(7, "bad"))
    req.raw_input_contents[0] += b"\0\0\0\0"
    return bytes(req.SerializeToString())


def _changed(body: bytes) -> bytes:
    """``body`` with the first raw entry's length varint made one larger."""
    req = pb.ModelInferRequest.FromString(body)
    at = body.index(bytes(req.raw_input_contents[0][:16]))
    size = bytearray(body[at - 3 : at])  # NOTE: 100,004 is a 3-byte varint
    size[0] = (size[0] + 1) & 0x7F | 0x80
    return body[: at - 3] + bytes(size) + body[at:]


@pytest.mark.parametrize("case", sorted(BAD))
def test_large_bad_requests_get_pythons_answers(
    servers: dict[str, ServerProcess], case: str
) -> None:
    """After a good request (the key known), a bad one: the same answer as Python's."""
    assert _both(servers, _request(1, "good"))[0] == "OK"
    answer = _both(servers, BAD[case]())
    if case != "surplus raw entries":
        assert answer[0] != "OK"
    assert _both(servers, _request(2, "good"))[0] == "OK"
