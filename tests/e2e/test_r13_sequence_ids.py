"""A request without a correlation ID to a sequence model whose CORRID control is a string,
side by side with the real Triton 2.51 (docs/differences.md, "Newer than 2.51").

Upstream main's core ``InferenceRequest::ValidateCorrelationId`` runs in ``Normalize``, before
the sequence batcher: a request without an ID has Triton's default one (UINT64 0), which a
TYPE_STRING control refuses ("... data-type is 'UINT64', but model '<m>' expects 'BYTES'");
2.51 has no such check and its sequence batcher refuses the missing ID. A numeric control
gives the same answer on both.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] }
  ]
}
"""
SIDE_BY_SIDE_MODELS = {
    "seq_text": PythonModel(CONFIG % "TYPE_STRING"),
    "seq_number": PythonModel(CONFIG % "TYPE_UINT64"),
}
"""Identities with a TYPE_STRING CORRID and a TYPE_UINT64 one (tests/e2e/conftest.py's
``shared_side_by_side`` serves them)."""


def _without_id(server: ServerProcess | RealTriton, model: str) -> str:
    t = grpcclient.InferInput("INPUT0", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        try:
            c.infer(model, [t], sequence_start=True)
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return "served"


MISSING = "StatusCode.INVALID_ARGUMENT: inference request to model '%s' must specify a non-zero "
MISSING += "or non-empty correlation ID"


def test_no_correlation_id_for_a_string_corrid(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    expected = {
        "triton": MISSING % "seq_text",
        "triton-mp": "StatusCode.INVALID_ARGUMENT: [request id: <id_unknown>] sequence batching "
        "control 'CORRID' data-type is 'UINT64', but model 'seq_text' expects 'BYTES'",
    }
    for name, server in shared_side_by_side.items():
        assert _without_id(server, "seq_text") == expected[name], name


def test_no_correlation_id_for_a_numeric_corrid(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    for name, server in shared_side_by_side.items():
        assert _without_id(server, "seq_number") == MISSING % "seq_number", name
