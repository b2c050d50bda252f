"""A new inference request while the server drains after SIGTERM, side by side with the real
Triton 2.51 (python backend): a kept difference (docs/differences.md).

2.51's stop (core ``InferenceServer::Stop``) stops every model's scheduler, then counts the
in-flight inferences of each model version: those its scheduler holds, not one the backend
runs. With none queued it unloads every model at once, so a request that arrives while a
python model still runs one is refused NOT_FOUND "Request for unknown model: '<m>' has no
available versions" (only one that finds a request still queued gets "Server is stopping,
scheduler for model has stopped accepting new inference requests"). triton-mp refuses every
new request of the drain UNAVAILABLE with that second message, a status a client may retry
on another server. In both, the request in flight is answered and the server exits 0.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess, wait_for
from tests.helpers.triton_peer import PythonModel, RealTriton, serve_models

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
SLOW = """
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        started = os.path.join(os.path.dirname(__file__), "started")
        with open(started, "w"):
            pass
        time.sleep(3.0)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""
"""r24_slow: INPUT0 answered as OUTPUT0 after 3 s; ``1/started`` marks that one runs."""

DRAINING = {
    "triton-mp": "requests in flight, up to",
    "triton": "All models are stopped, unloading models",
}
"""The log line each server writes once its drain has begun."""


def _infer(url: str) -> str:
    x = grpcclient.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.ones(2, np.float32))
    with grpcclient.InferenceServerClient(url) as client:
        try:
            client.infer("r24_slow", [x], client_timeout=60)
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return "answered"


def _drain(which: str, server: Server, started: Path) -> tuple[str, str, int]:
    """One request running, SIGTERM, then a new request once the drain began: the new
    request's answer, the running one's, and the exit status."""
    started.unlink(missing_ok=True)
    running: list[str] = []
    first = threading.Thread(target=lambda: running.append(_infer(server.url)))
    first.start()
    wait_for(started.exists, 60, "the first request to run")
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: DRAINING[which] in server.log(), 30, f"{which}'s drain to begin")
    late = _infer(server.url)
    first.join(timeout=60)
    return late, running[0], server.proc.wait(timeout=60)


def test_a_request_during_the_drain_is_refused_unavailable(tmp_path: Path) -> None:
    with serve_models(
        {"r24_slow": PythonModel(CONFIG, SLOW)}, tmp_path, "--exit-timeout-secs=30"
    ) as found:
        started = tmp_path / "repo" / "r24_slow" / "1" / "started"
        for server in found.values():
            with grpcclient.InferenceServerClient(server.url) as client:
                deadline = time.monotonic() + 120
                while not client.is_model_ready("r24_slow") and time.monotonic() < deadline:
                    time.sleep(0.2)
        seen = {which: _drain(which, server, started) for which, server in found.items()}
    stopping = (
        "StatusCode.UNAVAILABLE: Server is stopping, scheduler for model has stopped "
        "accepting new inference requests"
    )
    assert seen["triton-mp"] == (stopping, "answered", 0)
    if "triton" in seen:
        unknown = (
            "StatusCode.NOT_FOUND: Request for unknown model: 'r24_slow' has no available versions"
        )
        assert seen["triton"] == (unknown, "answered", 0)
