"""A string correlation ID on a sequence model *without* batching, side by side with the real
Triton 2.51 (python backend) on the session's shared pair (docs/differences.md).

tests/e2e/test_r22_sequence_ids.py pins 2.51's refusal for a model with ``max_batch_size``
over 0 and took for granted that 2.51 serves a model without batching; it does not: with
``max_batch_size: 0`` too, every request with a string ID (any length) is refused, "unexpected
number of string elements 2 for inference input 'CORRID', expecting 1" (its CORRID control
tensor is not one serialized string). triton-mp gives the model its ID, with or without
batching; a START, a middle request and an END keep their sequence.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
}
"""
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            corrid = pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy().reshape(-1)[0]
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().reshape(-1)[0]
            said = corrid + b"|" + str(int(x)).encode()
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", np.array([said], dtype=np.object_))]))
        return out
"""
SIDE_BY_SIDE_MODELS = {"r26_seq_text_unbatched": PythonModel(CONFIG, MODEL)}
"""A sequence model without batching whose CORRID control is TYPE_STRING: answers the
control's value and INPUT0 (tests/e2e/conftest.py's ``shared_side_by_side`` serves it)."""

REFUSAL = "unexpected number of string elements 2 for inference input 'CORRID', expecting 1"

STEPS = ((True, False, 1), (False, False, 2), (False, True, 3))
"""(start, end, INPUT0) of one sequence."""


def _sequence(server: ServerProcess | RealTriton, client: object, corrid: str) -> list[str]:
    """Each answer (OUTPUT0 decoded) or refusal of ``STEPS`` sent with ``corrid``."""
    module: object = client
    grpc_url, http_url = server.url, server.http_url
    c = module.InferenceServerClient(grpc_url if client is grpcclient else http_url)  # type: ignore[attr-defined]
    said = []
    try:
        for start, end, x in STEPS:
            t = module.InferInput("INPUT0", [1], "INT32")  # type: ignore[attr-defined]
            t.set_data_from_numpy(np.array([x], np.int32))
            try:
                result = c.infer(
                    "r26_seq_text_unbatched",
                    [t],
                    sequence_id=corrid,
                    sequence_start=start,
                    sequence_end=end,
                )
                said.append(result.as_numpy("OUTPUT0")[0].decode())
            except InferenceServerException as e:
                said.append(e.message())
    finally:
        c.close()
    return said


@pytest.mark.parametrize("client", [grpcclient, httpclient], ids=["grpc", "http"])
@pytest.mark.parametrize("corrid", ["a", "abcd", "seq-é-17"])
def test_a_string_corrid_without_batching(
    shared_side_by_side: dict[str, ServerProcess | RealTriton], client: object, corrid: str
) -> None:
    """triton-mp: the model reads the ID at every step of the sequence."""
    said = _sequence(shared_side_by_side["triton-mp"], client, corrid)
    assert said == [f"{corrid}|{x}" for _, _, x in STEPS]


@pytest.mark.parametrize("client", [grpcclient, httpclient], ids=["grpc", "http"])
@pytest.mark.parametrize("corrid", ["a", "abcd", "seq-é-17"])
def test_triton_refuses_a_string_corrid_without_batching(
    shared_side_by_side: dict[str, ServerProcess | RealTriton], client: object, corrid: str
) -> None:
    """2.51 (the difference kept): every request is refused, whatever the ID."""
    urls_of(shared_side_by_side, "triton")
    said = _sequence(shared_side_by_side["triton"], client, corrid)
    assert said == [REFUSAL] * len(STEPS)
