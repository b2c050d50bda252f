"""A decoupled python model that never asks ``is_cancelled()`` and keeps answering after its
client is gone, side by side with the real Triton 2.51 (``.peers/``; where it is not
installed, triton-mp alone is held to 2.51's answers, pinned here).

``repeat_deaf`` is ``repeat_int32`` (model_repository/) with its cancellation check taken
out: each of ``LONG_REQUESTS`` requests answers ``LONG_RESPONSES`` times, 250 ms apart, far
beyond the test. Its client goes away mid-stream: in triton-mp the frontend holding the
stream is killed with SIGKILL (its requests count as cancelled, which this model ignores);
2.51 has one process, so there the client cancels its stream, the nearest it comes to it.
Then, in both:

1. a new call of the same model, on a new connection, is answered whole while the deaf
   requests go on;
2. SIGINT waits the whole exit budget for the model, which is still answering, then exits 1
   with "failed to stop server: Internal - Exit timeout expired. Exiting immediately."
   (triton-mp kills the worker then, and leaves no process or shared memory behind).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.test_block_handover import _frontend_on, _inputs
from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess, group_alive, wait_for
from tests.helpers.stop_sides import Server, side_starter
from triton_mp.ipc.memory.shm import list_objects

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EXIT_TIMEOUT_S = 3
GRACE_S = 4.0
"""How long after the budget either server may take to exit (a loaded 2-core machine)."""
LONG_REQUESTS = 4
LONG_RESPONSES = 60
"""60 answers 250 ms apart: 15 s, beyond the budget and the waits."""
EXPIRED = "failed to stop server: Internal - Exit timeout expired. Exiting immediately."


def _deaf_repository(root: Path) -> Path:
    repo = root / "repo"
    model = repo / "repeat_deaf"
    shutil.copytree(
        PROJECT_REPOSITORY / "repeat_int32", model, ignore=shutil.ignore_patterns("__pycache__")
    )
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace('"repeat_int32"', '"repeat_deaf"'))
    source = model / "1" / "model.py"
    text = source.read_text()
    assert "if request.is_cancelled():" in text
    source.write_text(text.replace("if request.is_cancelled():", "if False:"))
    return repo


def _client_goes(server: Server, name: str) -> None:
    """A stream of long deaf requests whose client goes away once the first answer came."""
    answered = threading.Event()
    client = grpcclient.InferenceServerClient(
        server.url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
    )
    try:
        client.start_stream(callback=lambda result, error: answered.set())
        for i in range(LONG_REQUESTS):
            client.async_stream_infer(
                "repeat_deaf", _inputs(LONG_RESPONSES, 250), request_id=f"long{i}"
            )
        wait_for(answered.is_set, 30, "the first answer")
        if name == "triton":
            client.stop_stream(cancel_requests=True)
            return
        assert isinstance(server, ServerProcess)
        victim = _frontend_on(server)
        assert victim is not None, "no frontend holds the stream"
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: "restarted (restart 1)" in server.log(), 30, "the frontend back")
    finally:
        client.close()


def _new_call(server: Server) -> list[object]:
    """Three quick answers of the same model on a new connection (or the error)."""
    got: list[object] = []
    done = threading.Event()

    def on_answer(result: grpcclient.InferResult | None, error: object) -> None:
        got.append(str(error) if error is not None else int(result.as_numpy("OUT")[0]))  # type: ignore[union-attr]
        if error is not None or len(got) == 3:
            done.set()

    client = grpcclient.InferenceServerClient(server.url)
    try:
        client.start_stream(callback=on_answer)
        client.async_stream_infer("repeat_deaf", _inputs(3, 10), request_id="new")
        done.wait(30)
        client.stop_stream()
    finally:
        client.close()
    return got


@pytest.mark.parametrize("name", ["triton", "triton-mp-spare"])
def test_a_model_deaf_to_cancellation_after_its_client_went(name: str, tmp_path: Path) -> None:
    """``triton-mp-spare``: a frontend is killed here; the spare takes its place, as in a
    deployment."""
    with side_starter(_deaf_repository(tmp_path), tmp_path, EXIT_TIMEOUT_S) as start:
        server = start(name)
        _client_goes(server, name)
        assert _new_call(server) == [0, 1, 2], name
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGINT)
        code = server.proc.wait(timeout=EXIT_TIMEOUT_S + GRACE_S + 30)
        took = time.monotonic() - t0
        assert code == 1, (name, took)
        assert EXIT_TIMEOUT_S <= took < EXIT_TIMEOUT_S + GRACE_S, (name, took)
        assert EXPIRED in server.log(), name
        if isinstance(server, ServerProcess):
            wait_for(lambda: not group_alive(server.pid), 10, "every process to exit")
            assert list_objects(str(server.pid)) == []
