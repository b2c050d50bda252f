"""A model whose ``priority_levels`` is the largest uint64, side by side with the real Triton
2.51 on a pair of its own (Triton's own QA config, L0_config_json ``max_priority_level``).

2.51 loads it and serves requests at any priority. triton-mp's scheduler made one queue per
level when it loaded the model, 2^64 - 1 of them: it stopped answering and grew until the
kernel killed it (22 GB in a minute), and with it the whole server. Now only the levels in use
get a queue.

The level 4294967296 has a queue policy whose ``default_timeout_microseconds`` is the largest
uint64: 2.51 computes its deadline in wrapping nanoseconds and refuses each such request at
once, UNAVAILABLE "Request timeout expired"; triton-mp serves it (a timeout that never comes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.triton_peer import PythonModel, serve_models

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching {
  priority_levels: 18446744073709551615
  default_priority_level: 4294967295
  priority_queue_policy: [
    { key: 4294967296
      value: { timeout_action: REJECT default_timeout_microseconds: 18446744073709551615
               allow_timeout_override: true max_queue_size: 10 } }
  ]
}
"""

PRIORITIES = (0, 1, 4294967295, 4294967296, 2**64 - 1)


def test_the_largest_priority_levels_serve(tmp_path: Path) -> None:
    models = {"r26_max_priority": PythonModel(CONFIG)}
    flags = ("--model-control-mode=explicit",)
    with serve_models(models, tmp_path, *flags) as servers:
        answers = {}
        for name, server in sorted(servers.items()):
            with grpcclient.InferenceServerClient(server.url) as c:
                c.load_model("r26_max_priority")
                for priority in PRIORITIES:
                    t = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
                    t.set_data_from_numpy(np.array([[priority % 7]], np.float32))
                    try:
                        result = c.infer(
                            "r26_max_priority", [t], priority=priority, client_timeout=60
                        )
                        answers[name, priority] = result.as_numpy("OUTPUT0").tolist()
                    except InferenceServerException as e:
                        answers[name, priority] = e.message()
                c.unload_model("r26_max_priority")
                assert c.is_server_live(), name
    for (name, priority), answer in answers.items():
        if (name, priority) == ("triton", 4294967296):
            # NOTE: the difference kept (docs/differences.md): 2.51's deadline of a
            # 2^64 - 1 µs timeout wraps around, so the request expires at once
            assert answer == "Request timeout expired"
        else:
            assert answer == [[float(priority % 7)]], (name, priority)
    assert len(answers) == len(servers) * len(PRIORITIES)
