"""A config with ``model_metrics`` (per-model histogram buckets), side by side with the real
Triton 2.51 on a pair of its own (docs/differences.md, "Newer than 2.51").

``ModelConfig.model_metrics`` is upstream main's field (Triton's QA config
L0_model_config/model_metrics/valid_config): 2.51's proto has none, so its repository poll
cannot parse the file and the load fails, INTERNAL (HTTP 500) "failed to load '<m>', failed
to poll from model repository". triton-mp reads it and loads the model (custom buckets are
warned as not acted on, docs/metrics.md).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.triton_peer import PythonModel, serve_models

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
model_metrics {
  metric_control: [
    { metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
      histogram_options: { buckets: [ 1, 2, 4, 8 ] } }
  ]
}
"""


def _load(http_url: str) -> tuple[int, object]:
    url = f"http://{http_url}/v2/repository/models/r26_metrics_cfg/load"
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_config_with_model_metrics(tmp_path: Path) -> None:
    models = {"r26_metrics_cfg": PythonModel(CONFIG)}
    with serve_models(models, tmp_path, "--model-control-mode=explicit") as servers:
        assert _load(servers["triton-mp"].http_url) == (200, "")
        if "triton" in servers:
            assert _load(servers["triton"].http_url) == (
                500,
                {"error": "failed to load 'r26_metrics_cfg', failed to poll from model repository"},
            )
