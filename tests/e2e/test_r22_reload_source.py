"""A load whose ``config`` parameter equals the config the model was loaded from its file,
side by side with the real Triton 2.51 (python backend) on the session's shared pair
(docs/differences.md).

2.51 reloads the version when a load switches its config's source from the repository's
``config.pbtxt`` to a ``config`` parameter, even one equal to the file's: a live sequence
ends there (its next request is refused "must specify the START flag"). triton-mp compares
the configs themselves: nothing changed, nothing is reloaded, the sequence goes on.
"""

from __future__ import annotations

import json
import textwrap
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
name: "r22_seq_sum"
backend: "python"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  oldest { max_candidate_sequences: 4 }
}
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        out = []
        for r in requests:
            x = float(pb_utils.get_input_tensor_by_name(r, "X").as_numpy().reshape(-1)[0])
            cid = r.correlation_id()
            if r.flags() & 1:
                self.sums[cid] = 0.0
            self.sums[cid] += x
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SUM", np.array([[self.sums[cid]]], np.float32))]))
        return out
"""
COUNTED = (
    CONFIG.replace("r22_seq_sum", "r22_seq_sum_n")
    + "instance_group [ { count: %d kind: KIND_CPU } ]\n"
)
SIDE_BY_SIDE_MODELS = {
    "r22_seq_sum": PythonModel(CONFIG, MODEL),
    "r22_seq_sum_n": PythonModel(COUNTED % 1, MODEL),
}
"""A running sum per sequence, loaded from its config.pbtxt (tests/e2e/conftest.py's
``shared_side_by_side`` serves it)."""

START_FIRST = (
    "inference request for sequence {} to model '{}' must specify the START flag on the first "
    "request of the sequence"
)


def _step(
    url: str, sequence_id: int, start: bool = False, model: str = "r22_seq_sum"
) -> float | str:
    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput("X", [1, 1], "FP32")
        inp.set_data_from_numpy(np.ones((1, 1), np.float32))
        result = client.infer(model, [inp], sequence_id=sequence_id, sequence_start=start)
        return float(result.as_numpy("SUM")[0, 0])
    except InferenceServerException as e:
        return str(e.message())
    finally:
        client.close()


def _load_config(http_url: str, config: str, model: str = "r22_seq_sum") -> int:
    as_json = json_format.MessageToJson(
        text_format.Parse(textwrap.dedent(config), model_config_pb2.ModelConfig())
    )
    body = json.dumps({"parameters": {"config": as_json}}).encode()
    req = urllib.request.Request(
        f"http://{http_url}/v2/repository/models/{model}/load", body, method="POST"
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return int(r.status)


@pytest.mark.parametrize("which", ["triton-mp", "triton"])
def test_a_config_parameter_equal_to_the_file_reloads_only_in_triton(
    shared_side_by_side: dict[str, ServerProcess | RealTriton], which: str
) -> None:
    if which not in shared_side_by_side:
        pytest.skip("the real Triton 2.51 is not installed (.peers/)")
    server = shared_side_by_side[which]
    sequence_id = 2201 if which == "triton" else 2202
    assert _step(server.url, sequence_id, start=True) == 1.0
    assert _step(server.url, sequence_id) == 2.0
    assert _load_config(server.http_url, CONFIG) == 200
    after = _step(server.url, sequence_id)
    refused = START_FIRST.format(sequence_id, "r22_seq_sum")
    assert after == (refused if which == "triton" else 3.0)


@pytest.mark.parametrize("which", ["triton-mp", "triton"])
def test_an_instance_count_change_is_in_place_once_the_config_is_a_parameter(
    shared_side_by_side: dict[str, ServerProcess | RealTriton], which: str
) -> None:
    """The first count change through a ``config`` parameter is a source switch too: 2.51
    reloads the version (the sequence ends); triton-mp updates it in place. From then on both
    update in place (core ``UpdateInstanceGroup``): a sequence goes on across 2 -> 1."""
    if which not in shared_side_by_side:
        pytest.skip("the real Triton 2.51 is not installed (.peers/)")
    server = shared_side_by_side[which]
    model = "r22_seq_sum_n"
    first, second = (2211, 2212) if which == "triton" else (2213, 2214)
    assert _step(server.url, first, True, model) == 1.0
    assert _load_config(server.http_url, COUNTED % 2, model) == 200
    after = _step(server.url, first, model=model)
    assert after == (START_FIRST.format(first, model) if which == "triton" else 2.0)
    assert _step(server.url, second, True, model) == 1.0
    assert _load_config(server.http_url, COUNTED % 1, model) == 200
    assert _step(server.url, second, model=model) == 2.0
