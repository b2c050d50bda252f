"""A step model unloaded while an ensemble request runs, side by side with the real Triton 2.51
(python backend), on one pair of servers for the module (explicit model control).

2.51's ``EnsembleContext`` takes a handle on every step's model when the request starts
(``handles_``) and holds them until it ends, so a step unloaded by name meanwhile still
serves that request: the ensemble answers; the step, and the ensemble with it, are gone for
every later request.
triton-mp looked a step's model up only when the step was reached, and failed the request
NOT_FOUND "in ensemble '<e>', Request for unknown model: '<step>' has no available versions".
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import Ensemble, PythonModel, RealTriton, serve_models

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton

STEP = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
SLOW = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(2.0)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + 1)]))
        return out
"""
DOUBLE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return out
"""


def _step(model: str, into: str, out: str) -> str:
    return (
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "INPUT0" value: "{into}" }}'
        f' output_map {{ key: "OUTPUT0" value: "{out}" }} }}'
    )


MODELS = {
    "r26_slow": PythonModel(STEP, SLOW),
    "r26_double": PythonModel(STEP, DOUBLE),
    "r26_chain": Ensemble(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        "ensemble_scheduling { step [ "
        + _step("r26_slow", "IN", "mid")
        + ", "
        + _step("r26_double", "mid", "OUT")
        + " ] }\n"
    ),
}
"""r26_slow: x + 1 after 2 s; r26_double: x * 2; r26_chain: r26_slow then r26_double."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """triton-mp and (when installed) 2.51 on ``MODELS``, explicit mode, nothing loaded."""
    work = tmp_path_factory.mktemp("r26_step_unload")
    with serve_models(MODELS, Path(work), "--model-control-mode=explicit") as found:
        yield found


def _chain_while_unloading(server: Server) -> tuple[str, str, bool]:
    """Load r26_chain (its steps come with it), send it [[1, 2]], and 0.7 s later (while
    r26_slow runs) unload r26_double by name. The ensemble's answer (or error), then what a
    later request gets, and whether r26_double is still ready."""
    with grpcclient.InferenceServerClient(server.url) as c:
        c.load_model("r26_chain")

        def chain() -> str:
            t = grpcclient.InferInput("IN", [1, 2], "FP32")
            t.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
            try:
                out = c.infer("r26_chain", [t], client_timeout=60).as_numpy("OUT")
            except InferenceServerException as e:
                return f"{e.status()}: {e.message()}"
            return str(out.tolist())

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(chain)
            time.sleep(0.7)
            c.unload_model("r26_double")
            first = answer.result()
        later = chain()
        ready = c.is_model_ready("r26_double")
        c.unload_model("r26_chain")
    return first, later, ready


LATER = "StatusCode.NOT_FOUND: Request for unknown model: 'r26_chain' has no available versions"
"""A later request: the ensemble went with its step (core's dependency graph)."""


@pytest.mark.parametrize("which", ["triton-mp", "triton"])
def test_a_step_unloaded_mid_request_still_serves_it(pair: dict[str, Server], which: str) -> None:
    if which not in pair:
        pytest.skip("the real Triton is not installed (bash bench/peers/install-peers.sh .peers)")
    first, later, ready = _chain_while_unloading(pair[which])
    assert first == "[[4.0, 6.0]]"
    assert (later, ready) == (LATER, False)
    server = pair[which]
    if isinstance(server, ServerProcess):
        # NOTE: the step's instance, kept for the request, stops once the request ended.
        deadline = time.monotonic() + 60
        while _workers(server.pid, "r26_double"):
            assert time.monotonic() < deadline, "r26_double's worker never stopped"
            time.sleep(0.25)


def _workers(pid: int, model: str) -> list[int]:
    """The pids of ``pid``'s worker processes of ``model`` still running."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if " ".join(child.cmdline()).startswith(f"triton-mp: worker {model}_"):
                found.append(child.pid)
        except psutil.Error:
            continue
    return found
