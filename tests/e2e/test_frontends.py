"""Several gRPC frontend processes share one port (SO_REUSEPORT) and one scheduler."""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CLIENTS = 16


def test_two_frontends_share_the_port_and_both_serve(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    server = start_server(repo, "--frontend-processes", "2", "--log-verbose", "1")
    # NOTE: each client is its own TCP connection; the kernel spreads connections over the
    # listening frontends. Under load the second frontend may start listening after the
    # server is live, so keep opening connections until both served (or 200 tried).
    frontends: set[str] = set()
    for k in range(200):
        client = server.client()
        a = np.full((1, 16), k, np.float32)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            i = grpcclient.InferInput(name, [1, 16], "FP32")
            i.set_data_from_numpy(a)
            inputs.append(i)
        res = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + a)
        client.close()
        if k >= CLIENTS - 1:
            frontends = set(re.findall(r"accepted for 'add_sub'.*instance=(\d+)", server.log()))
            if frontends == {"0", "1"}:
                break
    assert frontends == {"0", "1"}


LATE_CONFIG = """
name: "late"
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 300000 preferred_batch_size: [ 3 ] }
"""

LATE_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 1)]))
        return out
"""


def test_a_model_loaded_after_start_answers_every_frontend_s_requests_right(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """A model loaded at run time gets rings to every frontend, and each frontend reads only
    its own: when each frontend attached every new ring, two frontends drained each other's
    answers, so requests went unanswered (or, with a request id the other frontend also had
    pending, got its answer). Batches of 3 from several connections, each a distinct value."""
    write_python_model(tmp_path / "repo", "late", LATE_CONFIG, LATE_MODEL)
    server = start_server(
        tmp_path / "repo",
        "--frontend-processes",
        "2",
        "--model-control-mode=explicit",
        "--log-verbose",
        "1",
    )
    admin = server.client()
    admin.load_model("late")
    admin.close()

    def ask(k: int) -> float:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=20)
        try:  # NOTE: its own connection, which the kernel gives to either frontend
            i = httpclient.InferInput("IN", [1, 2], "FP32")
            i.set_data_from_numpy(np.full((1, 2), k, np.float32))
            out = client.infer("late", [i]).as_numpy("OUT")
            assert out is not None
            return float(out[0, 0])
        finally:
            client.close()

    served: set[str] = set()
    with ThreadPoolExecutor(3) as pool:
        for round_ in range(60):
            ks = [round_ * 3 + j for j in range(3)]
            assert list(pool.map(ask, ks)) == [k + 1.0 for k in ks]
            served = set(re.findall(r"accepted for 'late'.*instance=(\d+)", server.log()))
            if round_ >= 9 and served == {"0", "1"}:
                break
    assert served == {"0", "1"}  # NOTE: the kernel spreads connections over the frontends
