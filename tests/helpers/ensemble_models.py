"""Python models and a repository writer shared by the ensemble e2e tests (not a test module).

``DOUBLE_PY``: ``OUT = 2 * IN`` (FP32), one response per request. ``REPEAT_PY``: decoupled,
three responses ``OUT = k * IN`` for k = 1, 2, 3, then the final flag alone. Both read
``IN`` and write ``OUT``; their configs stay with each test, which chooses shapes.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

DOUBLE_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", (2 * pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())
                    .astype(np.float32))])
                for r in requests
            ]
"""

REPEAT_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                sender = request.get_response_sender()
                for k in (1, 2, 3):
                    out = pb_utils.Tensor("OUT", (k * x).astype(np.float32))
                    sender.send(pb_utils.InferenceResponse([out]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""


def write_ensemble_repo(
    repo: Path,
    configs: Mapping[str, str],
    sources: Mapping[str, str],
    ensembles: Mapping[str, str],
) -> Path:
    """Write python models (``configs[name]`` with ``sources[name]`` as version 1) and
    ensembles (config only, an empty version 1) into ``repo``; texts are dedented.
    Returns ``repo``."""
    for name, config in configs.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(sources[name]))
    for name, config in ensembles.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    return repo
