"""A ``model_warmup`` sample with ``batch_size`` 2 on a model that does not batch
(``max_batch_size: 0``), through tritonclient.

Upstream core's ``GenerateWarmupData`` makes ``batch_size`` requests of the sample's dims (no
batch dimension when the model does not batch) and executes them together; 2.51 dies of a
SIGSEGV while warming such a python model up (its log ends "Signal (11) received." after
the instance's initialize), so this runs on triton-mp alone (docs/differences.md). The
model answers, in each response, what its first ``execute`` (the warmup's) was given.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repos import write_python_model
from tests.helpers.server import server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
model_warmup [ {
  name: "pairs" batch_size: 2
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } }
} ]
"""

SOURCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.first = None

    def execute(self, requests):
        shapes = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().shape for r in requests]
        if self.first is None:
            self.first = [len(requests), len(shapes[0]), shapes[0][0]]
        out = np.array(self.first, np.float32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]) for _ in requests]
"""
"""Answers [requests in the first execute, rank and first dimension of its first input]."""


def test_a_batch_size_2_sample_on_a_model_without_batching_runs_two_requests(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    write_python_model(repo, "warm_pairs", CONFIG, SOURCE)
    with server_factory(tmp_path) as start:
        server = start(repo)
        with grpcclient.InferenceServerClient(server.url) as c:
            assert c.is_model_ready("warm_pairs")
            t = grpcclient.InferInput("INPUT0", [3], "FP32")
            t.set_data_from_numpy(np.ones(3, np.float32))
            answer = c.infer("warm_pairs", [t]).as_numpy("OUTPUT0")
    assert answer.tolist() == [2.0, 1.0, 3.0]
