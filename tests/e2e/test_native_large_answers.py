"""Large answers served by the native gRPC thread (``frontend/native/known_answer.h``,
``held_block.h``): a known call's output of 64 KiB or more is sent from the worker's output
arena in place (no copy), its block freed once gRPC has sent it. With tritonclient, 1 to
16 MiB tensors (odd sizes too) through a python model with a batching delay that returns a
copy of its input (so the gRPC thread submits its calls and serves their answers, and the
output is the worker's: an output that is its input is answered from the input block,
test_answer_from_input.py): every answer is its request's bytes, the calls after the first
few of a form are sent and answered natively (also those of a model whose requests may be
handed to an idle instance directly), their outputs counted as sent in place
(``triton_mp_frontend_tensor_bytes_total{direction="out_in_place"}``) and not as copied, no
free is refused, and the worker's output blocks are all freed afterwards, also after
clients whose deadlines end their calls mid-answer."""

from __future__ import annotations

import re
import shutil
import urllib.request
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import REPO_ROOT, ServerProcess, server_factory, wait_for
from tests.helpers.worker_arenas import live_output_blocks
from triton_mp.frontend.native import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [{ count: 1, kind: KIND_CPU }]
"""
MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.copy())]))
        return out
"""
MODEL_NAME = "big_py"
COUNTS = (1 << 18, (1 << 20) + 1, (1 << 22) - 3)  # FP32: 1 MiB, 4 MiB + 4 B, 16 MiB - 12 B
CALLS = 8  # NOTE: the first 3-4 of a form go the Python way (it teaches the gRPC thread)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("large_answers") / "repo"
    write_python_model(repo, MODEL_NAME, CONFIG, MODEL)
    shutil.copytree(REPO_ROOT / "bench" / "model_repository" / "identity_py", repo / "identity_py")
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def _samples(server: ServerProcess, metric: str, label: str) -> dict[str, float]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    pattern = rf'^{metric}\{{{label}="(\w+)"\}} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}


def _known(server: ServerProcess) -> dict[str, float]:
    return _samples(server, "triton_mp_frontend_native_known_calls_total", "outcome")


def _tensor_bytes(server: ServerProcess) -> dict[str, float]:
    return _samples(server, "triton_mp_frontend_tensor_bytes_total", "direction")


def _live_output_blocks(server: ServerProcess, model: str = MODEL_NAME) -> int:
    """LIVE block headers (tensor_pool: u32 state 1, u32 generation != 0, u64 size, at 64-byte
    steps) in the worker's output arenas (float payloads of the inputs drawn here never look
    like one)."""
    pids = [
        p.pid
        for p in psutil.Process(server.pid).children(recursive=True)
        if p.cmdline() and p.cmdline()[0].startswith(f"triton-mp: worker {model}")
    ]
    assert len(pids) == 1, pids
    return live_output_blocks(server.pid, pids[0])


def _infer(
    client: grpcclient.InferenceServerClient, x: np.ndarray, rid: str, model: str = MODEL_NAME
) -> None:
    shape = [1, x.size] if model == MODEL_NAME else [x.size]
    inp = grpcclient.InferInput("INPUT0", shape, "FP32")
    inp.set_data_from_numpy(x.reshape(shape))
    result = client.infer(model, [inp], request_id=rid)
    assert result.get_response().id == rid
    got = result.as_numpy("OUTPUT0")
    assert got is not None
    np.testing.assert_array_equal(got.reshape(-1), x)


def test_large_answers_are_sent_in_place_and_their_blocks_freed(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    rng = np.random.default_rng(3)
    try:
        for count in COUNTS:
            before, bytes_before = _known(server), _tensor_bytes(server)
            for _ in range(CALLS):
                _infer(client, rng.standard_normal(count, dtype=np.float32), f"big{count}")
            after, bytes_after = _known(server), _tensor_bytes(server)
            answered = after["answered"] - before["answered"]
            assert after["sent"] - before["sent"] >= 3, (count, before, after)
            assert answered >= 2, (count, before, after)
            in_place = bytes_after["out_in_place"] - bytes_before["out_in_place"]
            out = bytes_after["out"] - bytes_before["out"]
            # NOTE: each answer served natively sent its output in place; Python copied the rest
            assert in_place == answered * 4 * count, (count, in_place, answered)
            assert out == (CALLS - answered) * 4 * count, (count, out, answered)
    finally:
        client.close()
    assert _known(server)["stray_frees"] == 0
    wait_for(lambda: _live_output_blocks(server) == 0, 10, "the output blocks freed")
    log = server.log()
    assert "Traceback" not in log
    assert "refused to free" not in log


def test_deadlines_mid_answer_leave_no_block(server: ServerProcess) -> None:
    """16 MiB calls of a taught form, some with a deadline short enough to end the call
    while its answer is built or sent: no free is refused and every output block is freed
    (a call gone before its answer was committed goes to Python, which frees it; after,
    its reply's hold frees it when gRPC lets go)."""
    client = grpcclient.InferenceServerClient(server.url)
    x = np.arange(COUNTS[-1], dtype=np.float32)
    failed: list[str | None] = []
    try:
        for _ in range(CALLS):
            _infer(client, x, "dl")
        for i in range(12):
            inp = grpcclient.InferInput("INPUT0", [1, x.size], "FP32")
            inp.set_data_from_numpy(x.reshape(1, -1))
            try:
                client.infer(MODEL_NAME, [inp], request_id="dl", client_timeout=0.002 * (i % 6 + 1))
            except InferenceServerException as e:
                failed.append(e.status())
        _infer(client, x, "dl")
    finally:
        client.close()
    assert failed, "no call ended by its deadline"  # NOTE: 2 ms for 32 MiB on the wire
    assert set(failed) <= {"StatusCode.DEADLINE_EXCEEDED"}, failed
    # NOTE: a stray free would come with a late answer; once every output block is free,
    # every late answer has come.
    wait_for(lambda: _live_output_blocks(server) == 0, 10, "the output blocks freed")
    assert _known(server)["stray_frees"] == 0
    assert "Traceback" not in server.log()


def test_a_model_with_direct_routes_is_served_natively_for_large_calls(
    server: ServerProcess,
) -> None:
    """identity_py (the bench's id1m model: no batching, so its requests may be handed to an
    idle instance directly, which the gRPC thread does itself, ``direct_handoff.h``): its
    1 MiB calls are sent and answered natively, outputs in place (from the input block:
    identity_py returns its input)."""
    client = grpcclient.InferenceServerClient(server.url)
    rng = np.random.default_rng(5)
    before, bytes_before = _known(server), _tensor_bytes(server)
    try:
        for _ in range(CALLS):
            _infer(client, rng.standard_normal(1 << 18, dtype=np.float32), "id1m", "identity_py")
    finally:
        client.close()
    after, bytes_after = _known(server), _tensor_bytes(server)
    answered = after["answered"] - before["answered"]
    assert after["sent"] - before["sent"] >= 3, (before, after)
    assert answered >= 2, (before, after)
    assert bytes_after["out_in_place"] - bytes_before["out_in_place"] == answered * (1 << 20)
    wait_for(lambda: _live_output_blocks(server, "identity_py") == 0, 10, "the blocks freed")
