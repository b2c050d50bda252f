"""An unloaded model whose request runs far longer than any stop bound: the request is still
answered, and the version is UNLOADING until then (2.51's lifecycle keeps an unloaded model
until its last request is released; core ``ModelLifeCycle::AsyncUnload``).

Before, the supervisor killed a draining worker 30 s (``STOP_TIMEOUT_S``) after the unload:
the running request was never answered and its client waited to its own deadline (the
newcomer's bug 3, session 20). triton-mp alone: 2.51 never kills a model for running long, and
a side-by-side pair of 35 s requests would double this file's time for no more evidence.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repo_control import post
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LONG_S = 34.0
"""Seconds the request runs: past the old 30 s kill (``STOP_TIMEOUT_S``)."""

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _source(mark: Path) -> str:
    """model.py: leaves ``mark`` (it runs now), sleeps ``LONG_S``, answers INPUT0."""
    return f"""
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        open({str(mark)!r}, "w").close()
        time.sleep({LONG_S})
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            )])
            for r in requests
        ]
"""


def _index(server: ServerProcess) -> list[tuple[str, str]]:
    status, body = post(server.http_url, "/v2/repository/index", {})
    assert status == 200
    return [(r.get("state", ""), r.get("reason", "")) for r in json.loads(body)]


def test_a_request_running_past_30_s_after_the_unload_is_answered(tmp_path: Path) -> None:
    mark = tmp_path / "running"
    write_python_model(tmp_path / "repo", "long_py", CONFIG, _source(mark))
    server = ServerProcess(
        tmp_path / "repo",
        tmp_path / "server.log",
        "--model-control-mode=explicit",
        "--load-model=long_py",
    )
    got: list[object] = []

    def call() -> None:
        x = grpcclient.InferInput("INPUT0", [1], "INT32")
        x.set_data_from_numpy(np.array([7], np.int32))
        with grpcclient.InferenceServerClient(server.url) as c:
            try:
                got.append(int(c.infer("long_py", [x], client_timeout=90).as_numpy("OUTPUT0")[0]))
            except Exception as e:  # noqa: BLE001 - what the client saw is the finding
                got.append(repr(e))

    try:
        server.wait_live()
        workers = [
            p
            for p in psutil.Process(server.pid).children(recursive=True)
            if "worker long_py" in " ".join(p.cmdline())
        ]
        assert len(workers) == 1
        th = threading.Thread(target=call, daemon=True)
        th.start()
        wait_for(mark.exists, 60, "the request to run")
        assert post(server.http_url, "/v2/repository/models/long_py/unload", {}, 10)[0] == 200
        assert _index(server) == [("UNLOADING", "")]
        th.join(LONG_S + 30)
        assert got == [7]
        assert "did not stop; killing it" not in server.log()
        wait_for(lambda: _index(server) == [("UNAVAILABLE", "unloaded")], 30, "the drain's end")
        assert not workers[0].is_running()
    finally:
        server.stop()
