"""Requests that reach the scheduler without a wake-up while their model is busy are served.

While every instance of a model runs a batch, the frontend pushes the model's requests
without waking the scheduler (``scheduler.request_wakeups``); the instance's ``BatchDone``
must then wake it, and its drain read them. Here one instance (a dynamic batcher with a
1 ms delay: with none, the frontends hand requests to idle instances themselves,
``ipc.direct``, and such a model is never quiet) runs a request for 0.4 s;
requests sent meanwhile (one, then three at once, over the native and the Python gRPC
frontends) must be answered after it. Were the ``BatchDone`` quiet, as it is for a model with
an empty queue (``scheduler.done_wakeups``), nothing would wake the scheduler and they would
hang until the client's timeout.

``forming_py`` (an instance idle, a 0.4 s batching delay, max_batch_size 16): requests that
arrive while its batch waits for the delay and cannot fill it join it without waking the
scheduler (``scheduler.forming``); they must form the same one batch at the delay's end,
with the scheduler woken about once for it, not once per request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psutil
import pytest

from tests.e2e.test_dynamic_batch_timing import MODEL as COUNT_MODEL  # the batch size as COUNT
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory
from tests.helpers.spaced_requests import send_spaced

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUN_S = 0.4

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
"""

MODEL = f"""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({RUN_S})
        n = len(requests)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("COUNT", np.full((1, 1), n, np.int32))])
            for _ in requests
        ]
"""


FORMING_DELAY_S = 0.4

FORMING_CONFIG = f"""
backend: "python"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: {int(FORMING_DELAY_S * 1e6)} }}
"""


@pytest.fixture(scope="module", params=["native", "python"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_python_model(repo, "slow_py", CONFIG, MODEL)
    write_python_model(repo, "forming_py", FORMING_CONFIG, COUNT_MODEL)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo, "--grpc-frontend", request.param)


def _send(url: str, gaps_s: list[float]) -> list[tuple[int, float]]:
    """``send_spaced`` to slow_py (client timeout 20 s)."""
    return send_spaced(url, "slow_py", gaps_s, 20)


def test_a_request_sent_while_the_instance_is_busy_is_served_after_it(
    server: ServerProcess,
) -> None:
    got = _send(server.url, [0.0, RUN_S / 2])
    assert got[0][0] == 1
    assert got[1][0] == 1, got  # it waited unread, and the BatchDone's wake-up read it
    assert got[1][1] >= 2 * RUN_S * 0.9  # it ran after the first
    assert got[1][1] < 10.0


def test_requests_sent_together_while_it_is_busy_form_one_batch_after_it(
    server: ServerProcess,
) -> None:
    got = _send(server.url, [0.0, RUN_S / 2, 0.0, 0.0])
    assert [c for c, _ in got] == [1, 3, 3, 3], got
    assert max(t for _, t in got) < 10.0


def _scheduler_sleeps(server: ServerProcess) -> int:
    """The scheduler's voluntary context switches so far (each a sleep it was woken from)."""
    for p in psutil.Process(server.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "scheduler" in " ".join(p.cmdline()):
                return int(p.num_ctx_switches().voluntary)
    raise AssertionError("no scheduler process")


def test_requests_joining_a_forming_batch_wake_the_scheduler_about_once(
    server: ServerProcess,
) -> None:
    n = 12
    send_spaced(server.url, "forming_py", [0.0], 20)  # NOTE: warm, outside the count
    before = _scheduler_sleeps(server)
    got = send_spaced(server.url, "forming_py", [0.0] + [0.015] * (n - 1), 20)
    woken = _scheduler_sleeps(server) - before
    assert [c for c, _ in got] == [n] * n, got  # one batch, as when each woke it
    assert min(t for _, t in got) >= FORMING_DELAY_S * 0.9  # sent when the delay ran out
    # NOTE: the first request, the deadline's timed wake, the BatchDone (3-4 measured); each
    # of the other requests would add one (9-10 for 8 requests without the rule). On the
    # native frontend the gRPC thread counts its calls against the same allowance
    # (frontend/native/known_wake.h): 14 for 12 requests before it did.
    assert woken <= n // 2, woken
