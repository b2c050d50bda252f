"""Loading and unloading an ensemble in explicit mode, side by side with the real Triton 2.51
(python backend), each test on its own pair of servers (they load and unload the steps).

- RepositoryModelUnload of an ensemble with ``unload_dependents`` also unloads its composing
  models that were loaded only for it (not by name) and that no other ensemble calls (core
  ``DependencyGraph::RemoveNodes`` with cascading removal: a node goes when it has no
  downstreams left and is not ``explicitly_load_``). triton-mp unloaded the ensemble alone.
- RepositoryModelLoad of an ensemble polls its composing models again (core ``PollModels``'
  polling chain), so a served step whose files changed on disk is reloaded with the
  ensemble. triton-mp loaded only the steps that did not serve: the old step kept serving.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repo_control import post_json
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import Ensemble, PythonModel, RealTriton, serve_models

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton

STEP = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def _step(model: str, into: str, out: str) -> str:
    return (
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "INPUT0" value: "{into}" }}'
        f' output_map {{ key: "OUTPUT0" value: "{out}" }} }}'
    )


def _ensemble(*steps: str) -> Ensemble:
    return Ensemble(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


MODELS = {
    "r24_a": PythonModel(STEP),
    "r24_b": PythonModel(STEP),
    "r24_ab": _ensemble(_step("r24_a", "IN", "mid"), _step("r24_b", "mid", "OUT")),
    "r24_b_only": _ensemble(_step("r24_b", "IN", "OUT")),
}
"""r24_a, r24_b: INPUT0 FP32 [-1] answered as OUTPUT0 (batching); r24_ab: r24_a then r24_b;
r24_b_only: r24_b alone."""

NAMES = ("r24_a", "r24_ab", "r24_b", "r24_b_only")


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[dict[str, Server]]:
    """triton-mp and (when installed) 2.51 on ``MODELS``, explicit mode, nothing loaded."""
    with serve_models(MODELS, tmp_path, "--model-control-mode=explicit") as found:
        yield found


def _index(server: Server) -> dict[str, tuple[str, str]]:
    """RepositoryIndex over HTTP: name -> (state, reason) of ``NAMES``."""
    status, rows = post_json(server.http_url, "/v2/repository/index", {})
    assert status == 200, rows
    assert isinstance(rows, list)
    return {
        r["name"]: (r.get("state", ""), r.get("reason", "")) for r in rows if r["name"] in NAMES
    }


def _settled(server: Server, want: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """The index once it equals ``want``, or after 10 s without LOADING/UNLOADING (an
    unload answers before its cascade ends, in both servers)."""
    deadline = time.monotonic() + 10
    while True:
        now = _index(server)
        busy = {s for s, _ in now.values()} & {"LOADING", "UNLOADING"}
        if now == want or (time.monotonic() > deadline and not busy):
            return now
        time.sleep(0.1)


READY = ("READY", "")
GONE = ("UNAVAILABLE", "unloaded")
ALL_READY = dict.fromkeys(NAMES, READY)
STEPS = (
    (
        "r24_ab and r24_b_only loaded",
        ALL_READY,
    ),
    (
        "r24_ab unloaded with dependents: r24_a goes, r24_b_only still calls r24_b",
        {**ALL_READY, "r24_ab": GONE, "r24_a": GONE},
    ),
    (
        "r24_b_only unloaded with dependents",
        dict.fromkeys(NAMES, GONE),
    ),
    (
        "r24_a loaded by name, then r24_ab: unloaded with dependents, r24_a stays",
        {**dict.fromkeys(NAMES, GONE), "r24_a": READY},
    ),
    (
        "r24_ab loaded, then unloaded without dependents: its steps stay",
        {**dict.fromkeys(NAMES, GONE), "r24_a": READY, "r24_b": READY},
    ),
)


def _dependents_scenario(server: Server) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """``STEPS`` through tritonclient gRPC: what RepositoryIndex says after each."""
    seen = []
    with grpcclient.InferenceServerClient(server.url) as client:
        for step, want in STEPS:
            if step.startswith("r24_ab and"):
                client.load_model("r24_ab")
                client.load_model("r24_b_only")
            elif step.startswith("r24_ab unloaded"):
                client.unload_model("r24_ab", unload_dependents=True)
            elif step.startswith("r24_b_only"):
                client.unload_model("r24_b_only", unload_dependents=True)
            elif step.startswith("r24_a loaded"):
                client.load_model("r24_a")
                client.load_model("r24_ab")
                client.unload_model("r24_ab", unload_dependents=True)
            else:
                client.load_model("r24_ab")
                client.unload_model("r24_ab")
            seen.append((step, _settled(server, want)))
    return seen


def test_unload_dependents_takes_the_steps_loaded_for_the_ensemble(
    pair: dict[str, Server],
) -> None:
    """2.51 unloads an ensemble's composing models with it when asked ``unload_dependents``,
    except one loaded by name or still called by another ensemble; triton-mp kept every
    step serving."""
    want = [(step, rows) for step, rows in STEPS]
    seen = {which: _dependents_scenario(server) for which, server in pair.items()}
    assert seen == dict.fromkeys(pair, want)


def _answer(client: grpcclient.InferenceServerClient, model: str) -> list[float]:
    x = grpcclient.InferInput("INPUT0" if model == "r24_a" else "IN", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
    out = "OUTPUT0" if model == "r24_a" else "OUT"
    result = client.infer(model, [x]).as_numpy(out)
    assert result is not None
    return [float(v) for v in result.reshape(-1)]


def test_loading_an_ensemble_reloads_a_step_changed_on_disk(
    pair: dict[str, Server], tmp_path: Path
) -> None:
    """r24_a served, its model.py then changed to double its input: a load of r24_ab polls
    r24_a again and serves the new code, in the step and in the ensemble (2.51); triton-mp
    kept the old r24_a."""
    clients = {w: grpcclient.InferenceServerClient(s.url) for w, s in pair.items()}
    try:
        for client in clients.values():
            client.load_model("r24_a")
        before = {w: _answer(c, "r24_a") for w, c in clients.items()}
        source = tmp_path / "repo" / "r24_a" / "1" / "model.py"
        source.write_text(source.read_text().replace("t.as_numpy()", "t.as_numpy() * 2"))
        for client in clients.values():
            client.load_model("r24_ab")
        after = {w: (_answer(c, "r24_a"), _answer(c, "r24_ab")) for w, c in clients.items()}
    finally:
        for client in clients.values():
            client.close()
    assert before == dict.fromkeys(pair, [1.0, 2.0])
    assert after == dict.fromkeys(pair, ([2.0, 4.0], [2.0, 4.0]))


def _listed(server: Server) -> dict[str, list[str]]:
    """The models each statistics view lists: HTTP ``GET /v2/models/stats``, gRPC
    ModelStatistics of every model, and ``/metrics``' ``nv_inference_count`` series."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/stats", timeout=30) as r:
        http = [s["name"] for s in json.loads(r.read())["model_stats"]]
    with grpcclient.InferenceServerClient(server.url) as client:
        grpc = [s.name for s in client.get_inference_statistics().model_stats]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as r:
        metrics = sorted(
            set(re.findall(r'^nv_inference_count\{model="([^"]+)"', r.read().decode(), re.M))
        )
    return {"http": sorted(http), "grpc": sorted(grpc), "metrics": metrics}


def test_an_unloaded_ensemble_leaves_the_statistics(pair: dict[str, Server]) -> None:
    """r24_ab loaded (its steps with it), asked once, then unloaded by name: neither the
    statistics extension (HTTP and gRPC, every model) nor ``/metrics`` lists it any more, as
    an unloaded model that runs on instances (2.51). triton-mp's scheduler never retired an
    ensemble's version (it has no instances): every view kept listing it."""
    for server in pair.values():
        with grpcclient.InferenceServerClient(server.url) as client:
            client.load_model("r24_ab")
            assert _answer(client, "r24_ab") == [1.0, 2.0]
            client.unload_model("r24_ab")
        _settled(server, {**dict.fromkeys(NAMES, GONE), "r24_a": READY, "r24_b": READY})
    steps = ["r24_a", "r24_b"]
    want = {"http": steps, "grpc": steps, "metrics": steps}
    assert {w: _listed(s) for w, s in pair.items()} == dict.fromkeys(pair, want)


def _series_of(server: Server, model: str) -> list[str]:
    """The ``/metrics`` series (family and labels, no value) of ``model``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    return sorted(line.rsplit(" ", 1)[0] for line in lines if f'model="{model}"' in line)


def test_an_unloaded_model_keeps_only_its_failure_series_in_triton(
    pair: dict[str, Server],
) -> None:
    """A kept difference (docs/differences.md): once r24_a is unloaded, 2.51's ``/metrics``
    still lists its ``nv_inference_request_failure`` series (one per reason) and nothing
    else of it; triton-mp lists none of its series."""
    for server in pair.values():
        with grpcclient.InferenceServerClient(server.url) as client:
            client.load_model("r24_a")
            assert _answer(client, "r24_a") == [1.0, 2.0]
            client.unload_model("r24_a")
        _settled(server, {**dict.fromkeys(NAMES, GONE)})
    seen = {which: _series_of(server, "r24_a") for which, server in pair.items()}
    assert seen["triton-mp"] == []
    if "triton" in seen:
        assert seen["triton"] == [
            f'nv_inference_request_failure{{model="r24_a",reason="{reason}",version="1"}}'
            for reason in ("BACKEND", "CANCELED", "OTHER", "REJECTED")
        ]
