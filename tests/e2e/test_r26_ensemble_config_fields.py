"""An ensemble's model configuration over HTTP, side by side with the real Triton 2.51 on the
session's shared pair (docs/differences.md, "Newer than 2.51").

triton-mp's model configuration is upstream main's, whose ``ModelEnsembling`` has
``max_inflight_requests`` (core PR #455; it bounds each step's requests in flight,
docs/ensembles.md): the HTTP config JSON, which prints every field, lists it (0 when not set).
2.51's proto has no such field. Everything else of the config is the same; over gRPC the
field is left out at 0 (proto3), so both answers are equal there.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import Ensemble, PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

STEP = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
SIDE_BY_SIDE_MODELS = {
    "r26_cfg_step": PythonModel(STEP),
    "r26_cfg_ens": Ensemble(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "r26_cfg_step" model_version: -1 '
        'input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }\n'
    ),
}
"""r26_cfg_ens: one step, r26_cfg_step (INPUT0 answered as OUTPUT0); tests/e2e/conftest.py's
``shared_side_by_side`` serves them."""


def _http_config(server: ServerProcess | RealTriton) -> dict[str, object]:
    url = f"http://{server.http_url}/v2/models/r26_cfg_ens/config"
    with urllib.request.urlopen(url, timeout=30) as r:
        config: dict[str, object] = json.load(r)
    return config


def test_the_http_config_lists_max_inflight_requests(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    ours = _http_config(shared_side_by_side["triton-mp"])
    scheduling = ours["ensemble_scheduling"]
    assert isinstance(scheduling, dict)
    assert scheduling["max_inflight_requests"] == 0
    if "triton" not in shared_side_by_side:
        return
    theirs = _http_config(shared_side_by_side["triton"])
    theirs_scheduling = theirs["ensemble_scheduling"]
    assert isinstance(theirs_scheduling, dict)
    assert "max_inflight_requests" not in theirs_scheduling
    scheduling.pop("max_inflight_requests")
    assert ours == theirs


def test_the_grpc_config_is_the_same(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    configs = []
    for server in shared_side_by_side.values():
        with grpcclient.InferenceServerClient(server.url) as c:
            configs.append(c.get_model_config("r26_cfg_ens").config.SerializeToString())
    assert len(set(configs)) == 1
