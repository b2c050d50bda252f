"""Who frees an ensemble's shared-memory blocks, and when (issue 16), against a running server.

- ``fork_ens``: ``split_py`` writes ``OUTPUT_A = INPUT0 + 1`` (an ensemble output) and
  ``mid = INPUT0`` into one block; ``mid`` feeds ``repeat_py`` (decoupled: three responses
  ``k * IN``, k = 1..3, then the final flag) which writes ``OUTPUT_B``. Every one of the
  three ensemble responses carries ``OUTPUT_A`` from the same upstream block, so that block
  may be freed only once the requester is done with all three. The client reads its stream
  slowly (gRPC flow control holds the later responses in the frontend, their bytes still in
  the block) while other requests run ``split_py`` and reuse its arena: a block freed too
  early is overwritten, and every byte of every response is checked.
- ``chain_ens``: ``double_py`` twice; the scheduler frees the first step's block (no
  response names it), so it maps ``double_py``'s arena. A worker killed with SIGKILL is
  restarted; the scheduler unmaps the dead process's arena (the supervisor unlinked it; a
  mapping would keep its pages) and the ensemble answers through the new process.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.ensemble_models import DOUBLE_PY, REPEAT_PY, write_ensemble_repo
from tests.helpers.server import ServerProcess, server_factory, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

N = 1 << 20
"""Elements per tensor: 4 MiB of FP32, more than gRPC's flow-control window holds."""

VAR = "dims: [ -1 ]"

CONFIGS = {
    "split_py": f"""
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_FP32 {VAR} }} ]
        output [
          {{ name: "OUTA" data_type: TYPE_FP32 {VAR} }},
          {{ name: "MID" data_type: TYPE_FP32 {VAR} }}
        ]
    """,
    "double_py": f"""
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_FP32 {VAR} }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 {VAR} }} ]
    """,
    "repeat_py": f"""
        backend: "python"
        max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "IN" data_type: TYPE_FP32 {VAR} }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 {VAR} }} ]
    """,
}

SOURCES = {
    "split_py": """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                responses = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                    responses.append(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUTA", (x + 1).astype(np.float32)),
                        pb_utils.Tensor("MID", x.astype(np.float32)),
                    ]))
                return responses
    """,
    "double_py": DOUBLE_PY,
    "repeat_py": REPEAT_PY,
}

FORK_ENS = f"""
    name: "fork_ens"
    platform: "ensemble"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 {VAR} }} ]
    output [
      {{ name: "OUTPUT_A" data_type: TYPE_FP32 {VAR} }},
      {{ name: "OUTPUT_B" data_type: TYPE_FP32 {VAR} }}
    ]
    ensemble_scheduling {{
      step [
        {{
          model_name: "split_py"
          model_version: -1
          input_map {{ key: "IN" value: "INPUT0" }}
          output_map {{ key: "OUTA" value: "OUTPUT_A" }}
          output_map {{ key: "MID" value: "mid" }}
        }},
        {{
          model_name: "repeat_py"
          model_version: -1
          input_map {{ key: "IN" value: "mid" }}
          output_map {{ key: "OUT" value: "OUTPUT_B" }}
        }}
      ]
    }}
"""


CHAIN_ENS = f"""
    name: "chain_ens"
    platform: "ensemble"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 {VAR} }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 {VAR} }} ]
    ensemble_scheduling {{
      step [
        {{
          model_name: "double_py"
          model_version: -1
          input_map {{ key: "IN" value: "INPUT0" }}
          output_map {{ key: "OUT" value: "twice" }}
        }},
        {{
          model_name: "double_py"
          model_version: -1
          input_map {{ key: "IN" value: "twice" }}
          output_map {{ key: "OUT" value: "OUTPUT0" }}
        }}
      ]
    }}
"""
ENSEMBLES = {"fork_ens": FORK_ENS, "chain_ens": CHAIN_ENS}


def write_repo(repo: Path) -> None:
    """The models and ensembles of the module docstring."""
    write_ensemble_repo(repo, CONFIGS, SOURCES, ENSEMBLES)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for both tests (the second restarts a worker; the first checks nothing of
    the workers' pids)."""
    repo = tmp_path_factory.mktemp("repo")
    write_repo(repo)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        srv = start(repo)
        client = srv.client()
        try:
            for name in (*CONFIGS, *ENSEMBLES):
                assert client.is_model_ready(name), srv.log()
        finally:
            client.close()
        yield srv


def _input(name: str, x: np.ndarray) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput(name, list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return [t]


def _churn(server: ServerProcess, stop: threading.Event, errors: list[BaseException]) -> None:
    """Run ``split_py`` directly, over and over: its arena's blocks are reused."""
    junk = np.full(N, -1000.0, np.float32)
    client = server.client()
    try:
        while not stop.is_set():
            client.infer("split_py", _input("IN", junk))
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)
    finally:
        client.close()


def test_every_forked_response_keeps_the_upstream_output_it_shares(
    server: ServerProcess,
) -> None:
    seen: queue.Queue = queue.Queue()

    def slow_reader(result: grpcclient.InferResult | None, error: object) -> None:
        # NOTE: the stream's reader thread sleeps: the frontend's later writes wait for
        # gRPC's flow control with their bytes still in the ensemble's blocks.
        time.sleep(1.0)
        seen.put(error or result)

    client = server.client()
    stop, errors = threading.Event(), []
    churn = threading.Thread(target=_churn, args=(server, stop, errors))
    rounds = 3
    try:
        client.start_stream(callback=slow_reader)
        xs = [(np.arange(N) % 977 + 10 * r).astype(np.float32) for r in range(rounds)]
        for r, x in enumerate(xs):
            client.async_stream_infer(
                "fork_ens",
                _input("INPUT0", x),
                request_id=f"r{r}",
                enable_empty_final_response=True,
            )
        churn.start()
        got: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {f"r{r}": [] for r in range(rounds)}
        finals = 0
        while finals < rounds:
            item = seen.get(timeout=120)
            assert isinstance(item, grpcclient.InferResult), item
            response = item.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
            a = item.as_numpy("OUTPUT_A")
            if a is not None:
                got[response.id].append((a.copy(), item.as_numpy("OUTPUT_B").copy()))
    finally:
        stop.set()
        if churn.is_alive():
            churn.join(timeout=60)
        client.stop_stream()
        client.close()
    assert not errors, errors
    for r, x in enumerate(xs):
        answers = got[f"r{r}"]
        assert len(answers) == 3, (r, len(answers))
        for a, _ in answers:
            bad = np.flatnonzero(a != x + 1)
            assert bad.size == 0, f"r{r}: OUTPUT_A differs at {bad.size} of {N} elements"
        bs = sorted(answers, key=lambda ab: float(ab[1][1] / max(x[1], 1)))
        for k, (_, b) in enumerate(bs, start=1):
            np.testing.assert_array_equal(b, k * x)


def _pids(server: ServerProcess, role: str) -> list[int]:
    """Pids of the processes the supervisor logged as started for ``role``, oldest first."""
    return [int(p) for p in re.findall(rf"started {role} \(pid (\d+)\)", server.log())]


def _mapped_arenas(pid: int, marker: str) -> set[str]:
    """The shared-memory files mapped into ``pid`` whose names contain ``marker`` (an
    unlinked one reads ``/dev/shm/<name> (deleted)``)."""
    with open(f"/proc/{pid}/maps") as maps:
        fields = [line.split(maxsplit=5) for line in maps]
    return {f[5].strip() for f in fields if len(f) == 6 and "/dev/shm/" in f[5] and marker in f[5]}


def test_the_scheduler_unmaps_a_killed_worker_s_arena_and_the_ensemble_still_answers(
    server: ServerProcess,
) -> None:
    x = np.arange(N, dtype=np.float32)
    client = server.client()
    try:
        out = client.infer("chain_ens", _input("INPUT0", x)).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, 4 * x)
        (scheduler,) = _pids(server, "scheduler scheduler")
        (old,) = _pids(server, r"worker double_py_0")
        old_arenas = _mapped_arenas(scheduler, f"p{old}_a")
        assert old_arenas, "the scheduler should map double_py's arena to free step blocks"
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: len(_pids(server, r"worker double_py_0")) == 2, 60, "a restart")
        wait_for(lambda: client.is_model_ready("chain_ens"), 60, "chain_ens ready again")
        new = _pids(server, r"worker double_py_0")[-1]
        out = client.infer("chain_ens", _input("INPUT0", x + 1)).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, 4 * (x + 1))
        assert _mapped_arenas(scheduler, f"p{old}_a") == set(), "a dead arena is still mapped"
        assert _mapped_arenas(scheduler, f"p{new}_a"), "the new process's arena is in use"
    finally:
        client.close()
