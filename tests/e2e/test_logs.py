"""End to end: structured logs. With ``--log-format json`` every line of every process is one
JSON object carrying its role and pid (workers: model and instance too), and each state change
(loading, ready, started, died, restarting, restarted, draining, stopped) is one line."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repos import copy_models
from tests.helpers.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _inputs() -> list[grpcclient.InferInput]:
    out = []
    for name in ("INPUT0", "INPUT1"):
        x = grpcclient.InferInput(name, [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        out.append(x)
    return out


def _lines(server: ServerProcess) -> list[dict[str, Any]]:
    lines = []
    for raw in server.log().splitlines():
        if raw.strip():
            lines.append(json.loads(raw))  # every line is JSON, or this raises
    return lines


def _wait_for_event(server: ServerProcess, text: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in _lines(server):
            if text in line["event"]:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no log line with {text!r}:\n{server.log()}")


def test_json_lines_name_their_process_and_every_state_change(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub_py")
    server = start_server(repo, "--log-format", "json", "--log-verbose", "1")
    client = server.client()
    client.infer("add_sub_py", _inputs())
    ready = _wait_for_event(server, "instance ready")
    assert (ready["role"], ready["model"], ready["instance"]) == (
        "worker",
        "add_sub_py",
        "add_sub_py_0_0",
    )
    os.kill(ready["pid"], signal.SIGKILL)
    _wait_for_event(server, "worker add_sub_py_0_0 restarted")
    client.infer("add_sub_py", _inputs())
    client.close()
    server.stop()

    lines = _lines(server)
    for line in lines:
        assert {"event", "level", "timestamp", "role", "pid"} <= set(line), line
        if line["role"] == "worker":
            assert (line["model"], line["instance"]) == ("add_sub_py", "add_sub_py_0_0"), line
    roles = {line["role"] for line in lines}
    assert roles == {"supervisor", "scheduler", "frontend", "worker"}

    def about_the_instance(text: str, role: str) -> dict[str, Any]:
        matches = [line for line in lines if text in line["event"] and line["role"] == role]
        assert matches, f"no {role} line with {text!r}"
        line = matches[0]
        assert (line.get("model"), line.get("instance")) == ("add_sub_py", "add_sub_py_0_0"), line
        return line

    about_the_instance("started worker add_sub_py_0_0", "supervisor")
    about_the_instance("loading model 'add_sub_py'", "worker")
    about_the_instance("instance add_sub_py_0_0 ready", "scheduler")
    died = about_the_instance("died with exit code -9", "supervisor")
    assert died["level"] == "warning"
    about_the_instance("restarting worker add_sub_py_0_0", "supervisor")
    about_the_instance("restarted", "supervisor")
    model_ready = [line for line in lines if "model 'add_sub_py' ready" in line["event"]]
    assert model_ready[0]["model"] == "add_sub_py"
    events = [line["event"] for line in lines]
    assert any("draining" in e for e in events)
    assert any("server stopped" in e for e in events)
    # --log-verbose 1: per-request and per-batch detail
    assert any("accepted for 'add_sub_py'" in e for e in events)
    assert any(e.startswith("batch ") and "closed by" in e for e in events)


def test_without_log_verbose_there_is_no_per_request_detail(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub_py")
    server = start_server(repo)
    client = server.client()
    client.infer("add_sub_py", _inputs())
    client.close()
    server.stop()
    log = server.log()
    assert "model 'add_sub_py' ready" in log
    assert "accepted for" not in log
    assert "closed by" not in log
    assert "[debug" not in log
