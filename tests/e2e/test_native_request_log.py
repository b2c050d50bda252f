"""The per-request DEBUG line at ``--log-verbose 1`` on the native gRPC path, end to end.

Each request a frontend accepts writes "request N accepted for 'MODEL' version V (batch size
B)" at DEBUG (``--log-verbose`` > 0; Triton 2.51 writes its own per-request lines at verbose
1, e.g. ``ModelInferHandler`` "Process for ModelInferHandler ..."). A call the native side
submits from a lesson (``known_submit``) never passed through ``Inference._push``, which
writes that line, so the native path wrote none for the repeated calls of a form it knew:
the native side now queues an ACCEPTED entry per call while DEBUG is on (``known_log``,
following the log settings, also when changed at run time), and Python words the line.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repos import copy_models
from tests.helpers.server import ServerProcess, wait_for
from triton_mp.frontend.native import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

CALLS = 40
LINE = re.compile(r"request \d+ accepted for 'add_sub' version 1 \(batch size 1\)")


def _inputs() -> list[grpcclient.InferInput]:
    out = []
    for name in ("INPUT0", "INPUT1"):
        x = grpcclient.InferInput(name, [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        out.append(x)
    return out


def _sent_natively(server: ServerProcess) -> float:
    """Calls the native side submitted from a lesson (the ``sent`` known-calls counter)."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    m = re.search(
        r'^triton_mp_frontend_native_known_calls_total\{outcome="sent"\} (\S+)$', text, re.M
    )
    assert m is not None, text[-2000:]
    return float(m[1])


def _calls(client: grpcclient.InferenceServerClient, n: int) -> None:
    for _ in range(n):
        res = client.infer("add_sub", _inputs(), client_timeout=30)
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), np.full((1, 16), 2, np.float32))


def test_every_call_writes_its_accepted_line_on_the_native_path(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    server = start_server(repo, "--grpc-frontend", "native", "--log-verbose", "1")
    client = server.client()
    _calls(client, CALLS)
    client.close()
    wait_for(lambda: _sent_natively(server) > 0, 30, "a call on the native known path")
    wait_for(lambda: len(LINE.findall(server.log())) >= CALLS, 30, "a line per call")
    assert len(LINE.findall(server.log())) == CALLS


def test_the_line_follows_the_verbose_level_set_at_run_time(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    server = start_server(repo, "--grpc-frontend", "native")
    client = server.client()
    _calls(client, CALLS // 2)
    wait_for(lambda: _sent_natively(server) > 0, 30, "a call on the native known path")
    sent = _sent_natively(server)
    assert not LINE.findall(server.log())
    client.update_log_settings({"log_verbose_level": 1})
    _calls(client, CALLS // 2)
    wait_for(lambda: _sent_natively(server) > sent, 30, "calls at verbose 1 on the native path")
    wait_for(lambda: len(LINE.findall(server.log())) >= CALLS // 2, 30, "a line per call")
    client.update_log_settings({"log_verbose_level": 0})
    _calls(client, 5)
    client.close()
    assert len(LINE.findall(server.log())) == CALLS // 2
