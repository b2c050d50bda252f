"""An HTTP inference request whose JSON nests deeper than triton-mp's parser goes, side by side
with the real Triton 2.51 on the session's shared pair (docs/differences.md).

triton-mp's JSON parser (msgspec) recurses once per level and stops at the interpreter's
recursion limit (about 1,000 levels): deeper bodies get 400 "failed to parse the request JSON
buffer: nested too deeply" before any field is looked at, and the server goes on serving.
"""

from __future__ import annotations

import http.client
import json

import pytest

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIDE_BY_SIDE_MODELS = {
    "s20_depth": PythonModel(
        """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
    )
}
"""s20_depth: INPUT0 FP32 [-1] answered as OUTPUT0, no batching."""

Server = ServerProcess | RealTriton

REFUSED = (400, {"error": "failed to parse the request JSON buffer: nested too deeply"})


def _body(depth: int) -> bytes:
    """A valid request for s20_depth with an unknown top-level key (which both servers pass
    over) whose value nests ``depth`` arrays deep."""
    junk = "[" * depth + "]" * depth
    return (
        '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":[1,2]}],'
        f'"junk":{junk}}}'
    ).encode()


def _post(server: Server, body: bytes) -> tuple[int, bytes]:
    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/v2/models/s20_depth/infer", body=body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


ANSWER = {
    "model_name": "s20_depth",
    "model_version": "1",
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}],
}


def test_triton_mp_refuses_a_body_nested_past_its_parser(
    shared_side_by_side: dict[str, Server],
) -> None:
    """900 levels are answered; 1,100 and more get the refusal, and the next request is
    answered again."""
    ours = shared_side_by_side["triton-mp"]
    status, answer = _post(ours, _body(900))
    assert (status, json.loads(answer)) == (200, ANSWER)
    for depth in (1100, 100_000):
        status, answer = _post(ours, _body(depth))
        assert (status, json.loads(answer)) == REFUSED, depth
    status, answer = _post(ours, _body(10))
    assert (status, json.loads(answer)) == (200, ANSWER)


def test_triton_reads_any_depth(shared_side_by_side: dict[str, Server]) -> None:
    """2.51 (the difference kept): RapidJSON reads 100,000 levels and the request is
    answered."""
    if "triton" not in shared_side_by_side:
        pytest.skip("the real Triton is not installed (bash bench/peers/install-peers.sh .peers)")
    for depth in (1100, 100_000):
        status, answer = _post(shared_side_by_side["triton"], _body(depth))
        assert (status, json.loads(answer)) == (200, ANSWER), depth
