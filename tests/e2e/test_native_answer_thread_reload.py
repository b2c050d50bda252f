"""Model reloads under load while the native answer thread reads the inbox
(``frontend/native/answer_thread.h`` AddRing / RemoveRing, ``InboxHandler.on_table_change``).

A reload that changes a model's instances adds the new instances' rings to the thread and lets
the stopped ones' rings go (what they still hold read first); an unload lets every ring of the
model go, and the load after it adds new ones. From tritonclient threads calling the model with
known calls (no request id: the native path) the whole time: every answer is right, a call
fails only while the model is unloaded and then in Triton's words, none waits out its deadline
(an answer left unread in a ring the thread does not read), and after the last reload the
thread serves the calls (``thread_served``), from the rings it was given at run time.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import REPO_ROOT, ServerProcess
from triton_mp.frontend.native import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

MODEL = "add_sub_py_nodelay"
THREADS = 4
UNLOADED = re.compile(r"unknown model|not ready|unavailable|no available versions|stopping", re.I)


def _served(server: ServerProcess) -> float:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    m = re.search(
        r'^triton_mp_frontend_native_known_calls_total\{outcome="thread_served"\} (\S+)$',
        text,
        re.M,
    )
    assert m is not None, "no thread_served sample: the answer thread does not run"
    return float(m[1])


def _call(client: grpcclient.InferenceServerClient, seed: int) -> None:
    a = np.full((1, 16), seed, np.float32)
    b = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
              grpcclient.InferInput("INPUT1", [1, 16], "FP32")]  # fmt: skip
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    res = client.infer(MODEL, inputs, client_timeout=30)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def test_reloads_under_load_give_the_thread_the_new_rings(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    src = REPO_ROOT / "bench" / "model_repository" / "add_sub_py"
    shutil.copytree(src, repo / MODEL)
    cfg = repo / MODEL / "config.pbtxt"
    text = re.sub(r"dynamic_batching\s*\{[^}]*\}", "dynamic_batching { }", cfg.read_text())
    cfg.write_text(text.replace('name: "add_sub_py"', f'name: "{MODEL}"'))
    server = start_server(repo, "--model-control-mode=explicit", f"--load-model={MODEL}")
    control = server.client()
    stop = threading.Event()
    unloaded = threading.Event()  # NOTE: from the unload on, calls may fail in its words
    calls = [0] * THREADS
    problems: list[str] = []

    def load(t: int) -> None:
        client = server.client()
        seed = t * 100000
        while not stop.is_set():
            seed += 1
            try:
                _call(client, seed)
                calls[t] += 1
            except InferenceServerException as e:
                if not (unloaded.is_set() and UNLOADED.search(e.message() or "")):
                    problems.append(f"{e.status()} {e.message()}")
                time.sleep(0.01)
            except AssertionError as e:
                problems.append(f"wrong answer: {e}")
        client.close()

    threads = [threading.Thread(target=load, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    try:
        config = control.get_model_config(MODEL, as_json=True)["config"]
        for count in (2, 1, 3):
            time.sleep(1.0)
            config["instance_group"][0]["count"] = count
            control.load_model(MODEL, config=json.dumps(config))
        time.sleep(1.0)
        unloaded.set()
        control.unload_model(MODEL)
        control.load_model(MODEL)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not problems, problems[:5]
    assert sum(calls) > 0
    before = _served(server)
    for i in range(100):
        _call(control, i)
    # NOTE: every answer now comes from a ring added at run time; a few may reach Python
    # (a call Python took over), the rest the thread serves
    assert _served(server) - before >= 80
    control.close()
