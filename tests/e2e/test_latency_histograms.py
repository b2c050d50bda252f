"""End to end: ``--metrics-config histogram_latencies=true`` serves Triton's
``nv_inference_first_response_histogram_ms`` on ``:8002/metrics`` (core 25.01 on, every model
since core #464; Triton 2.51 has no such family), counted over two frontend processes.

The repository is ``tests/ensemble_models``: ``pipe3`` (an ensemble) and ``add_py`` asked
directly; ``add_py``'s config names its own buckets (``model_metrics.metric_control``).
"""

from __future__ import annotations

import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.server import REPO_ROOT, ServerProcess, server_factory, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

FAMILY = "nv_inference_first_response_histogram_ms"
BUCKETS = (
    """
model_metrics { metric_control [ { metric_identifier { family: "%s" }
  histogram_options { buckets: [ 1, 60000 ] } } ] }
"""
    % FAMILY
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("latency") / "repo"
    src = REPO_ROOT / "tests" / "ensemble_models"
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    config = dest / "add_py" / "config.pbtxt"
    config.write_text(config.read_text() + BUCKETS)
    return dest


def _text(server: ServerProcess) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


def _lines(text: str, model: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(FAMILY) and f'"{model}"' in line]


def _send(server: ServerProcess, n: int) -> None:
    """``n`` requests to pipe3 and ``n`` to add_py, half over gRPC, half over HTTP."""
    a = np.ones((1, 4), np.float32)
    grpc = grpcclient.InferenceServerClient(server.url)
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        for i in range(n):
            mod, client = (grpcclient, grpc) if i % 2 else (httpclient, http)
            for model, names in (("pipe3", ("INPUT0", "INPUT1")), ("add_py", ("IN0", "IN1"))):
                inputs = [mod.InferInput(name, [1, 4], "FP32") for name in names]
                for x in inputs:
                    x.set_data_from_numpy(a)
                client.infer(model, inputs)
    finally:
        grpc.close()
        http.close()


@pytest.fixture(scope="module")
def servers(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """(with histogram_latencies=true and two frontends, without the setting)."""
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        # NOTE: the two start side by side
        on = start(
            repo,
            "--metrics-config=histogram_latencies=true",
            "--frontend-processes=2",
            wait=False,
        )
        off = start(repo, wait=False)
        for srv in (on, off):
            srv.wait_live()
            client = grpcclient.InferenceServerClient(srv.url)
            wait_for(lambda c=client: c.is_model_ready("pipe3"), 120, "pipe3 ready")
            client.close()
        yield on, off


def test_each_request_s_first_response_is_counted_in_its_model_s_buckets(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    on, _ = servers
    _send(on, 12)
    text = _text(on)
    assert (
        f"# HELP {FAMILY} Duration from request to first response in milliseconds\n"
        f"# TYPE {FAMILY} histogram\n"
    ) in text
    # NOTE: 12 requests each, however the two frontends shared them (SO_REUSEPORT)
    pipe3 = _lines(text, "pipe3")
    assert [line.split("{")[0] for line in pipe3] == [
        f"{FAMILY}_count",
        f"{FAMILY}_sum",
        *[f"{FAMILY}_bucket"] * 5,
    ]
    assert pipe3[0] == f'{FAMILY}_count{{model="pipe3",version="1"}} 12'
    assert [line.split("le=")[1].split("}")[0] for line in pipe3[2:]] == [
        '"100"',
        '"500"',
        '"2000"',
        '"5000"',
        '"+Inf"',
    ]
    assert pipe3[-1] == f'{FAMILY}_bucket{{model="pipe3",version="1",le="+Inf"}} 12'
    # NOTE: a loaded model nobody asked has its series from its load on, as core's
    assert f'{FAMILY}_count{{model="sub_py",version="1"}} 0' in text
    add = _lines(text, "add_py")
    assert add[0] == f'{FAMILY}_count{{model="add_py",version="1"}} 12'
    assert [line.split("le=")[1].split("}")[0] for line in add[2:]] == ['"1"', '"60000"', '"+Inf"']
    assert add[-2].endswith(" 12")  # every answer within a minute


def test_without_the_setting_there_is_no_such_family(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    _, off = servers
    _send(off, 2)
    assert FAMILY not in _text(off)
