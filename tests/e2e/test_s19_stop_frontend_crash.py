"""A frontend that crashes while the stop drains it: the supervisor says so and exits 1.

The stop drains each frontend (SIGTERM) until the exit budget; a frontend that dies by another
signal then (a crash: SIGSEGV here) ends the calls it held unanswered. Before, the supervisor
took any frontend exit in the drain as clean and exited 0 after losing them; now it logs the
crash and exits 1, as a lost call at the budget does (tests/unit/test_stop_exit_status.py
holds the rule), without tritonserver's "Exit timeout expired" (the budget did not run out).
2.51 is one process: a crash there ends the server by the signal.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.test_r24_drain_refusal import CONFIG, SLOW
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EXIT_TIMEOUT_S = 30
CRASHED = "died by a signal during the stop"
EXIT_TIMEOUT_EXPIRED = "Exit timeout expired"


def _frontend_pid(server: ServerProcess) -> int:
    """The pid of the server's one frontend (process title ``triton-mp: frontend 0``)."""
    for p in psutil.Process(server.pid).children(recursive=True):
        try:
            if " ".join(p.cmdline()).strip().startswith("triton-mp: frontend "):
                return int(p.pid)
        except psutil.Error:
            continue
    raise AssertionError("no frontend process")


def test_a_frontend_crash_during_the_drain_makes_the_exit_status_1(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    model = write_python_model(repo, "s19_slow", CONFIG, SLOW)  # 3 s per call
    server = ServerProcess(repo, tmp_path / "server.log", f"--exit-timeout-secs={EXIT_TIMEOUT_S}")
    outcome: list[object] = []

    def call() -> None:
        client = grpcclient.InferenceServerClient(server.url)
        x = grpcclient.InferInput("INPUT0", [4], "FP32")
        x.set_data_from_numpy(np.ones(4, np.float32))
        try:
            outcome.append(client.infer("s19_slow", [x]).as_numpy("OUTPUT0"))
        except InferenceServerException as e:
            outcome.append(e)
        finally:
            client.close()

    caller = threading.Thread(target=call)
    try:
        server.wait_live()
        caller.start()
        wait_for(lambda: (model / "1" / "started").exists(), 30, "the slow call to run")
        frontend = _frontend_pid(server)
        server.proc.send_signal(signal.SIGINT)
        wait_for(lambda: "draining:" in server.log(), 30, "the frontend to drain")
        os.kill(frontend, signal.SIGSEGV)
        code = server.proc.wait(timeout=EXIT_TIMEOUT_S + 30)
        caller.join(timeout=30)
        log = server.log()
        assert code == 1, log
        assert CRASHED in log, log
        assert str(frontend) in log, log
        assert EXIT_TIMEOUT_EXPIRED not in log, log
        assert len(outcome) == 1
        assert isinstance(outcome[0], InferenceServerException)
    finally:
        server.stop()
        caller.join(timeout=10)
