"""A string correlation ID on a batching sequence model, side by side with the real Triton 2.51
(python backend) on the session's shared pair (docs/differences.md).

2.51's sequence batcher refuses every request to a model with ``max_batch_size`` over 0 whose
CORRID control is TYPE_STRING, whatever the ID: "unexpected number of string elements 2 for
inference input 'CORRID', expecting 1" (the control tensor it builds for the batch slot holds
two elements). triton-mp gives the model its ID, as 2.51 does for a model without batching
(tests/e2e/test_r13_sequence_ids.py's ``seq_text``).
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
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
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
            said = str(r.correlation_id()).encode() + b"|" + corrid
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", np.array([[said]], dtype=np.object_))]))
        return out
"""
SIDE_BY_SIDE_MODELS = {"r22_seq_text_batched": PythonModel(CONFIG, MODEL)}
"""A batching sequence model with a TYPE_STRING CORRID control, answering its correlation ID
and the control's value (tests/e2e/conftest.py's ``shared_side_by_side`` serves it)."""

REFUSAL = "unexpected number of string elements 2 for inference input 'CORRID', expecting 1"


@pytest.mark.parametrize("which", ["triton-mp", "triton"])
@pytest.mark.parametrize("client", [grpcclient, httpclient], ids=["grpc", "http"])
@pytest.mark.parametrize("corrid", ["s", "seq-é-17"])
def test_a_string_corrid_on_a_batching_sequence_model(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
    which: str,
    client: object,
    corrid: str,
) -> None:
    grpc_url, http_url = urls_of(shared_side_by_side, which)
    module: object = client
    c = module.InferenceServerClient(grpc_url if client is grpcclient else http_url)  # type: ignore[attr-defined]
    try:
        inp = module.InferInput("INPUT0", [1, 1], "FP32")  # type: ignore[attr-defined]
        inp.set_data_from_numpy(np.ones((1, 1), np.float32))
        kwargs = {"sequence_id": corrid, "sequence_start": True, "sequence_end": True}
        if which == "triton":
            with pytest.raises(InferenceServerException) as refused:
                c.infer("r22_seq_text_batched", [inp], **kwargs)
            assert refused.value.message() == REFUSAL
            return
        result = c.infer("r22_seq_text_batched", [inp], **kwargs)
        assert result.as_numpy("OUTPUT0").tolist() == [[f"{corrid}|{corrid}".encode()]]
    finally:
        c.close()
