"""An HTTP inference request whose JSON holds bytes that are not UTF-8, side by side with the
real Triton 2.51 on the session's shared pair (a kept difference, docs/differences.md).

2.51 reads the body with RapidJSON without encoding validation, so a string's bytes pass
through as they came: an input name is looked up with them ("unexpected inference input
'<bytes>'"), a BYTES element reaches the model as those bytes. triton-mp refuses the body
(RFC 8259: JSON text is UTF-8), 400 "failed to parse the request JSON buffer: Invalid UTF-8
encoded string", before it looks at any field.
"""

from __future__ import annotations

import http.client
import json

import pytest

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIDE_BY_SIDE_MODELS = {
    "r24_text": PythonModel(
        """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
    )
}
"""r24_text: INPUT0 BYTES [-1] answered as OUTPUT0, no batching."""

Server = ServerProcess | RealTriton

NAME = b'{"inputs":[{"name":"IN\xffPUT0","datatype":"BYTES","shape":[1],"data":["a"]}]}'
DATA = b'{"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[1],"data":["caf\xe9"]}]}'
REFUSED = (400, {"error": "failed to parse the request JSON buffer: Invalid UTF-8 encoded string"})


def _post(server: Server, body: bytes) -> tuple[int, bytes]:
    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/v2/models/r24_text/infer", body=body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


@pytest.mark.parametrize("body", [NAME, DATA], ids=["input-name", "bytes-element"])
def test_json_that_is_not_utf8_is_refused(
    shared_side_by_side: dict[str, Server], body: bytes
) -> None:
    """triton-mp: 400 with the parser's words, whichever string holds the bytes."""
    status, answer = _post(shared_side_by_side["triton-mp"], body)
    assert (status, json.loads(answer)) == REFUSED


def test_triton_passes_the_bytes_on(shared_side_by_side: dict[str, Server]) -> None:
    """2.51 (the difference kept): the bytes of a name are looked up as they came, those of
    a BYTES element reach the model and come back."""
    if "triton" not in shared_side_by_side:
        pytest.skip("the real Triton is not installed (bash bench/peers/install-peers.sh .peers)")
    theirs = shared_side_by_side["triton"]
    assert _post(theirs, NAME) == (
        400,
        b"{\"error\":\"unexpected inference input 'IN\xffPUT0' for model 'r24_text'\"}",
    )
    status, answer = _post(theirs, DATA)
    assert status == 200, answer
    assert b"caf\xe9" in answer
