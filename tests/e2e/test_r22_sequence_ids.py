"""A string correlation ID on a batching sequence model, side by side with the real Triton 2.51
(python backend) on the session's shared pair (docs/differences.md).

2.51's sequence batcher refuses every request to a model with ``max_batch_size`` over 0 whose
CORRID control is TYPE_STRING, whatever the ID: "unexpected number of string elements 2 for
inference input 'CORRID', expecting 1" (the control tensor it builds for the batch slot holds
two elements). triton-mp gives the model its ID. 2.51 refuses it without batching too
(tests/e2e/test_r26_string_corrid.py).

And a sequence model with a ``passive`` instance group: 2.51 dies placing a sequence on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, serve_models, urls_of

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


PASSIVE_CONFIG = """
backend: "python"
max_batch_size: 4
sequence_batching { direct { } }
instance_group [ { count: 1 kind: KIND_CPU }, { count: 1 kind: KIND_CPU passive: true } ]
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


SEQUENCES = (1, 2, 3, 4, 5)


def test_a_sequence_model_with_a_passive_instance(tmp_path: Path) -> None:
    """docs/differences.md: 2.51 dies (SIGSEGV) placing a sequence on a sequence model that
    has a ``passive`` instance group; triton-mp does not act on ``passive`` (warned at load,
    docs/models.md): its instances serve like any other. Its own pair: 2.51 dies."""
    with serve_models({"r22_passive": PythonModel(PASSIVE_CONFIG)}, tmp_path) as servers:
        answered = {}
        for name, server in sorted(servers.items()):  # Triton first
            c = grpcclient.InferenceServerClient(server.url)
            try:
                # NOTE: five live sequences: more than the 4 slots (max_batch_size) of the
                # instance that is not passive, so 2.51 must use a passive one
                for sequence_id in SEQUENCES:
                    inp = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
                    inp.set_data_from_numpy(np.full((1, 1), sequence_id, np.float32))
                    try:
                        result = c.infer(
                            "r22_passive", [inp], sequence_id=sequence_id, sequence_start=True
                        )
                        answered[name, sequence_id] = float(result.as_numpy("OUTPUT0")[0, 0])
                    except InferenceServerException:
                        answered[name, sequence_id] = None
            finally:
                c.close()
        for sequence_id in SEQUENCES:
            assert answered["triton-mp", sequence_id] == sequence_id
        ours = servers["triton-mp"]
        assert ours.proc.poll() is None
        if "triton" in servers:
            theirs = servers["triton"]
            assert theirs.proc.wait(timeout=30) == -11  # SIGSEGV
            assert None in [answered["triton", i] for i in SEQUENCES]
