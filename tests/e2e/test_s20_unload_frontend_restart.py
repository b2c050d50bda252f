"""A frontend killed and restarted while an instance that a model change stopped serving
still drains: the new frontend process reads that instance's answers too (triton-mp only: a
Triton server is one process).

An ``instance_group`` change from 2 instances to 1 (done in place, as 2.51's
``UpdateInstanceGroup``: tests/e2e/test_s18_regroup.py) leaves the removed instance running
its live sequence until it ends. The restarted frontend's spec lists the rings of the
instances that serve and of those that still drain, so the sequence's next request, sent
through the new process, is answered by the instance that holds it (before: by none; the
answer went to a ring the new process did not read, and the client waited out its deadline).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repo_control import config_pbtxt, load_with, seq_sum_config, seq_sum_source
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SRC = seq_sum_source(with_pid=True)


def _config(count: int) -> dict:
    """seq_sum with PID, Direct, ``count`` instances with one slot each."""
    base = seq_sum_config(("OUTPUT0", "PID"), count=count)
    seq = {k: v for k, v in base["sequence_batching"].items() if k != "oldest"}
    seq["direct"] = {}
    return {**base, "max_batch_size": 1, "sequence_batching": seq}


def _seq(server: ServerProcess, sid: int, value: int, **flags: object) -> tuple[int, int] | str:
    """One request of a sequence: (running sum, pid), or ``"<status>: <message>"``."""
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[value]], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        try:
            r = c.infer("seq_fe", [t], sequence_id=sid, client_timeout=20, **flags)  # type: ignore[arg-type]
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return int(r.as_numpy("OUTPUT0")[0][0]), int(r.as_numpy("PID")[0][0])


def _frontend_pid(server: ServerProcess) -> int | None:
    """The pid of the server's one frontend process, None while there is none."""
    for p in psutil.Process(server.pid).children(recursive=True):
        try:
            if " ".join(p.cmdline()).strip().startswith("triton-mp: frontend 0"):
                return p.pid
        except psutil.Error:
            continue
    return None


def test_a_restarted_frontend_reads_the_answers_of_an_instance_still_draining(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    write_python_model(repo, "seq_fe", config_pbtxt(_config(2)), SRC)
    server = ServerProcess(
        repo,
        tmp_path / "ours.log",
        "--model-control-mode=explicit",
        "--load-model=seq_fe",
        "--frontend-spare=true",
    )
    try:
        server.wait_live()
        a = _seq(server, 1, 1, sequence_start=True)
        b = _seq(server, 2, 10, sequence_start=True)
        assert isinstance(a, tuple), a
        assert isinstance(b, tuple), b
        assert a[1] != b[1]  # NOTE: one slot per instance: one sequence on each
        assert load_with(server.http_url, "seq_fe", _config(1), SRC) == 200
        assert psutil.pid_exists(a[1])
        assert psutil.pid_exists(b[1])
        victim = _frontend_pid(server)
        assert victim is not None
        marker = server.log().count("restarted (restart")
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: server.log().count("restarted (restart") > marker, 60, "the frontend restart"
        )
        wait_for(lambda: _frontend_pid(server) not in (None, victim), 10, "the new frontend")
        server.wait_live()
        # NOTE: one of the two pids is the removed instance's, still holding its sequence.
        assert _seq(server, 1, 2) == (3, a[1])
        assert _seq(server, 2, 20) == (30, b[1])
        assert _seq(server, 1, 3, sequence_end=True) == (6, a[1])
        assert _seq(server, 2, 30, sequence_end=True) == (60, b[1])
        wait_for(
            lambda: not (psutil.pid_exists(a[1]) and psutil.pid_exists(b[1])),
            30,
            "the removed instance to exit once its sequence ended",
        )
    finally:
        server.stop()
