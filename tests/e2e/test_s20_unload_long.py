"""An unloaded model whose request runs far longer than any stop bound: the request is still
answered, and the version is UNLOADING until then; a stop during the drain answers the
drained model's requests before it ends (2.51's lifecycle keeps an unloaded model
until its last request is released; core ``ModelLifeCycle::AsyncUnload``).

Before, the supervisor killed a draining worker 30 s (``STOP_TIMEOUT_S``) after the unload:
the running request was never answered and its client waited to its own deadline (the
newcomer's bug 3, session 20). triton-mp alone: 2.51 never kills a model for running long, and
a side-by-side pair of 35 s requests would double this file's time for no more evidence.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repo_control import post
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, group_alive, wait_for
from triton_mp.ipc.memory.shm import list_objects

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LONG_S = 34.0
"""Seconds the request runs: past the old 30 s kill (``STOP_TIMEOUT_S``)."""

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _source(mark: Path) -> str:
    """model.py: leaves ``mark`` (it runs now), sleeps INPUT0 milliseconds, answers INPUT0."""
    return f"""
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            open({str(mark)!r}, "w").close()
            ms = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()[0][0]
            time.sleep(ms / 1000)
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


def _server(tmp_path: Path, at_start: bool = True) -> tuple[ServerProcess, Path]:
    """A server in explicit mode with ``long_py`` (loaded at start, or not), and the model's
    run mark."""
    mark = tmp_path / "running"
    write_python_model(tmp_path / "repo", "long_py", CONFIG, _source(mark))
    server = ServerProcess(
        tmp_path / "repo",
        tmp_path / "server.log",
        "--model-control-mode=explicit",
        *(("--load-model=long_py",) if at_start else ()),
    )
    return server, mark


def _call(server: ServerProcess, ms: int, into: list[object]) -> threading.Thread:
    """A thread sending one request that runs ``ms`` milliseconds; its answer (or the error)
    goes to ``into``."""

    def call() -> None:
        x = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[ms]], np.int32))
        with grpcclient.InferenceServerClient(server.url) as c:
            try:
                into.append(
                    int(c.infer("long_py", [x], client_timeout=90).as_numpy("OUTPUT0")[0][0])
                )
            except Exception as e:  # noqa: BLE001 - what the client saw is the finding
                into.append(repr(e))

    th = threading.Thread(target=call, daemon=True)
    th.start()
    return th


def _workers(server: ServerProcess) -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process(server.pid).children(recursive=True)
        if "worker long_py" in " ".join(p.cmdline())
    ]


def test_a_request_running_past_30_s_after_the_unload_is_answered(tmp_path: Path) -> None:
    server, mark = _server(tmp_path)
    got: list[object] = []
    try:
        server.wait_live()
        workers = _workers(server)
        assert len(workers) == 1
        th = _call(server, int(LONG_S * 1000), got)
        wait_for(mark.exists, 60, "the request to run")
        assert post(server.http_url, "/v2/repository/models/long_py/unload", {}, 10)[0] == 200
        assert _index(server) == [("UNLOADING", "")]
        th.join(LONG_S + 30)
        assert got == [int(LONG_S * 1000)]
        assert "did not stop; killing it" not in server.log()
        wait_for(lambda: _index(server) == [("UNAVAILABLE", "unloaded")], 30, "the drain's end")
        assert not workers[0].is_running()
    finally:
        server.stop()


def test_a_stop_during_the_unload_drain_answers_its_requests(tmp_path: Path) -> None:
    """SIGINT 0.5 s after the unload: the running request is answered by the draining worker
    and the server exits 0 with nothing left. Before, the drain freed the worker's rings and
    removed it at the signal: the request was lost, cut at the exit budget, exit 1 (the
    newcomer's bug 2, session 20)."""
    server, mark = _server(tmp_path, at_start=False)
    got: list[object] = []
    try:
        server.wait_live()
        assert post(server.http_url, "/v2/repository/models/long_py/load", {}, 60)[0] == 200
        first = _call(server, 8000, got)
        wait_for(mark.exists, 60, "the request to run")
        assert post(server.http_url, "/v2/repository/models/long_py/unload", {}, 10)[0] == 200
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGINT)
        first.join(30)
        assert got == [8000]
        assert server.proc.wait(timeout=30) == 0
        wait_for(lambda: not group_alive(server.pid), 10, "every process to exit")
        assert list_objects(str(server.pid)) == []
    finally:
        server.stop()
