"""What a load leaves of a served model's config and statistics, side by side with the real
Triton 2.51 (python backend, explicit model control). Found by r15 asking both servers the same
loads; each case is 2.51's behaviour (its half runs first):

1. A load of a composing model that reloads it (a config change beyond ``instance_group``)
   reloads the ensembles that call it too (core ``ModelRepositoryManager`` loads a model's
   dependents after it): the ensemble's statistics start again at 0, in triton-mp too
   (``scheduler.lifecycle``).
2. A load without ``config`` after a load with a ``config`` override does not reload the
   model when its files did not change: the override's config keeps serving (its
   ``parameters`` are still in ModelConfig) and the statistics go on, in triton-mp too
   (``supervisor.models.model_control``'s ``_keep_override``); once a file changed, the
   next load reloads it from ``config.pbtxt`` on both.

Each test unloads and loads its models again at its end, the one way back to the repository's
config on both servers.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import Ensemble, PythonModel, RealTriton, serve_models

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton

IDENT = {
    "backend": "python",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
}
IDENT_PBTXT = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
ENSEMBLE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "step_py" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""
MODELS = {
    "step_py": PythonModel(IDENT_PBTXT),
    "step_ens": Ensemble(ENSEMBLE),
    "over_py": PythonModel(IDENT_PBTXT),
}
"""step_ens: one step, step_py (an INT32 identity); over_py: the same identity alone."""
CHANGED = {**IDENT, "parameters": {"note": {"string_value": "override"}}}
"""A config beyond ``instance_group`` from the repository's: a reload to both servers."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed, explicit model
    control with every model loaded."""
    flags = ("--model-control-mode=explicit", "--load-model=*")
    with serve_models(MODELS, tmp_path_factory.mktemp("reload_stats"), *flags) as found:
        yield found


def _infer(server: Server, model: str, name: str) -> None:
    """One call of ``model`` (input ``name``), and its statistics in (the python backend
    reports them after the answer is sent)."""
    before = _success(server, model)
    t = grpcclient.InferInput(name, [1, 2], "INT32")
    t.set_data_from_numpy(np.ones((1, 2), np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        c.infer(model, [t])
    deadline = time.monotonic() + 10
    while _success(server, model) == before and time.monotonic() < deadline:
        time.sleep(0.05)


def _success(server: Server, model: str) -> int:
    with grpcclient.InferenceServerClient(server.url) as c:
        stats = c.get_inference_statistics(model).model_stats[0]
    return int(stats.inference_stats.success.count)


def _load(server: Server, model: str, config: dict | None = None) -> None:
    with grpcclient.InferenceServerClient(server.url) as c:
        c.load_model(model, config=None if config is None else json.dumps(config))


def _reset(server: Server, *models: str) -> None:
    """Unload ``models`` and load them from the repository again (the last one first)."""
    with grpcclient.InferenceServerClient(server.url) as c:
        for model in models:
            c.unload_model(model)
        deadline = time.monotonic() + 30
        while any(c.is_model_ready(m) for m in models) and time.monotonic() < deadline:
            time.sleep(0.1)
        for model in reversed(models):
            c.load_model(model)


def _repository(servers: dict[str, Server]) -> Path:
    """The repository both servers serve (``serve_models`` writes one)."""
    return next(s.repository for s in servers.values() if isinstance(s, ServerProcess))


def _parameters(server: Server, model: str) -> list[str]:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/config") as r:
        return sorted(json.loads(r.read()).get("parameters", {}))


def test_an_ensembles_statistics_start_again_when_a_model_it_calls_is_reloaded(
    servers: dict[str, Server],
) -> None:
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        try:
            _infer(server, "step_ens", "IN")
            assert _success(server, "step_ens") > 0, name
            _load(server, "step_py", CHANGED)
            assert _success(server, "step_py") == 0, name
            assert _success(server, "step_ens") == 0, name
            _infer(server, "step_ens", "IN")
            assert _success(server, "step_ens") == 1, name
        finally:
            _reset(server, "step_ens", "step_py")


def test_a_load_without_config_keeps_the_overrides_config(servers: dict[str, Server]) -> None:
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        try:
            _load(server, "over_py", CHANGED)
            _infer(server, "over_py", "INPUT0")
            assert _parameters(server, "over_py") == ["note"], name
            _load(server, "over_py")
            assert _parameters(server, "over_py") == ["note"], name
            assert _success(server, "over_py") == 1, name
            model_py = _repository(servers) / "over_py" / "1" / "model.py"
            later = model_py.stat().st_mtime + 10
            os.utime(model_py, (later, later))  # a file changed: the next load reloads
            _load(server, "over_py")
            assert _parameters(server, "over_py") == [], name
            assert _success(server, "over_py") == 0, name
        finally:
            _reset(server, "over_py")
