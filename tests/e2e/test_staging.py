"""Staging end to end (``scheduler.staging``): a queued request's batch sent behind the batch
its one instance runs, with tritonclient against a running server.

identity_py (the id1m_shm goal's model: python, the default scheduler, one instance) with 4
concurrent clients over system shared memory: every answer exact, the statistics Triton's,
and requests served staged (the scheduler's debug line per staged batch). Then the faults:
a worker killed while a batch is staged behind its running one (the running request fails,
the staged one runs on the restarted instance, as a queued one would, and ``triton-mp stat``
counts it once), and an unload with a
staged batch (both finish, then the model is gone).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.e2e.test_direct_handoff import HANDED, _in_background, _in_flight, _stats
from tests.e2e.test_faults import _infer, _inputs, _pid
from tests.e2e.test_stat import _stat_json
from tests.helpers.fault_models import write_faulty_model
from tests.helpers.server import REPO_ROOT, ServerProcess, counted, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

STAGED = "staged behind batch"
"""The scheduler's debug line for each batch it staged (``Stager.place``)."""
CLIENTS = 4
CALLS = 40
ELEMENTS = 64 * 1024
"""FP32 elements per request: 256 KiB each way."""


def _serve_over_shm(server: ServerProcess, k: int, failures: list[str]) -> None:
    """Client ``k``: its own input and output regions, ``CALLS`` calls of distinct data;
    each answer must equal its input, byte for byte."""
    nbytes = ELEMENTS * 4
    tag = f"stage{k}"
    key_in, key_out = (
        f"/triton_mp_{os.getpid()}_test_{tag}_in",
        f"/triton_mp_{os.getpid()}_test_{tag}_out",
    )
    region_in = shm.create_shared_memory_region(f"{tag}_in", key_in, nbytes, create_only=True)
    region_out = shm.create_shared_memory_region(f"{tag}_out", key_out, nbytes, create_only=True)
    client = server.client()
    try:
        client.register_system_shared_memory(f"{tag}_in", key_in, nbytes)
        client.register_system_shared_memory(f"{tag}_out", key_out, nbytes)
        for i in range(CALLS):
            x = np.arange(ELEMENTS, dtype=np.float32) + np.float32(k * 1000 + i)
            shm.set_shared_memory_region(region_in, [x])
            inp = grpcclient.InferInput("INPUT0", [ELEMENTS], "FP32")
            inp.set_shared_memory(f"{tag}_in", nbytes)
            out = grpcclient.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(f"{tag}_out", nbytes)
            client.infer("identity_py", [inp], outputs=[out], client_timeout=120)
            got = shm.get_contents_as_numpy(region_out, np.float32, [ELEMENTS])
            if not np.array_equal(got, x):
                failures.append(f"client {k} call {i}: wrong answer")
    except Exception as e:  # noqa: BLE001 - reported by the test
        failures.append(f"client {k}: {e}")
    finally:
        client.unregister_system_shared_memory(f"{tag}_in")
        client.unregister_system_shared_memory(f"{tag}_out")
        client.close()
        shm.destroy_shared_memory_region(region_in)
        shm.destroy_shared_memory_region(region_out)


def test_identity_py_c4_over_system_shm_is_served_staged_and_exact(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(REPO_ROOT / "bench" / "model_repository" / "identity_py", repo / "identity_py")
    server = start_server(repo, "--log-verbose=1", "--allow-client-shm=true")
    failures: list[str] = []
    threads = [
        threading.Thread(target=_serve_over_shm, args=(server, k, failures), daemon=True)
        for k in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert failures == []
    total = CLIENTS * CALLS
    client = server.client()
    stats = counted(lambda: _stats(client, "identity_py"), lambda s: s[0] >= total, "counted")
    assert stats == (total, total, 0), "each request one execution, none failed"
    (st,) = client.get_inference_statistics("identity_py").model_stats
    assert (st.inference_stats.success.count, st.inference_stats.queue.count) == (total, total)
    staged = server.log().count(STAGED)
    assert staged >= 1, "no request was staged behind a running batch"
    assert _in_flight(server, "identity_py") == 0
    client.close()


def _staged_behind_running(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> list[tuple[threading.Thread, list[object]]]:
    """Three calls of ``slow_py`` (values 5, 6, 7; 1 would trigger its fault): A handed to
    the idle instance by the frontend, B and C queued behind it; when A ends, B runs and C is
    staged behind B. Returns the three background calls' (thread, result list)."""
    calls = [_in_background(lambda: client.infer("slow_py", _inputs(5), client_timeout=120))]
    wait_for(lambda: HANDED in server.log(), 30, "A to be handed to the instance")
    for v in (6, 7):
        calls.append(
            _in_background(lambda v=v: client.infer("slow_py", _inputs(v), client_timeout=120))
        )
    wait_for(lambda: STAGED in server.log(), 60, "C to be staged behind B")
    assert _in_flight(server, "slow_py") == 2, "stat shows B running and C staged"
    return calls


def _value(out: list[object]) -> float:
    (res,) = out
    assert not isinstance(res, Exception), res
    return float(res.as_numpy("OUTPUT0")[0])  # type: ignore[attr-defined]


def test_a_worker_killed_with_a_staged_batch_fails_the_running_one_and_runs_the_staged(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "slow_py", "none", sleep_ms=1500)
    server = start_server(repo, "--log-verbose=1")
    client = server.client()
    (ta, a), (tb, b), (tc, c) = _staged_behind_running(server, client)
    os.kill(_pid(server, "triton-mp: worker slow_py_0_0"), signal.SIGKILL)
    for t in (ta, tb, tc):
        t.join(120)
        assert not t.is_alive(), "a client got no answer"
    assert _value(a) == 5
    (err,) = b
    assert isinstance(err, InferenceServerException), err
    assert err.status() == "StatusCode.UNAVAILABLE", err
    assert "exit code -9" in err.message(), err.message()
    assert _value(c) == 7, "the staged request ran on the restarted instance"
    stats = counted(lambda: _stats(client, "slow_py"), lambda s: s[0] >= 2, "counted")
    assert stats == (2, 2, 1)
    assert _infer(client, "slow_py", 8) == 8
    client.close()
    # NOTE: triton-mp stat's histogram counts each batch once, as Triton's statistics: A, B
    # (failed by the death), C (staged, given back, formed again) and the last call. C counted
    # twice before.
    (model,) = _stat_json(server, "--model", "slow_py")["models"]  # type: ignore[index]
    assert sum(model["batch_sizes"].values()) == 4, model["batch_sizes"]


def test_an_unload_with_a_staged_batch_finishes_both_then_refuses(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "slow_py", "none", sleep_ms=1500)
    server = start_server(
        repo, "--log-verbose=1", "--model-control-mode=explicit", "--load-model=slow_py"
    )
    client = server.client()
    calls = _staged_behind_running(server, client)
    client.unload_model("slow_py")
    for t, _ in calls:
        t.join(120)
    assert [_value(out) for _, out in calls] == [5, 6, 7]
    wait_for(lambda: not client.is_model_ready("slow_py"), 60, "the unload to finish")
    with pytest.raises(InferenceServerException):
        client.infer("slow_py", _inputs(5), client_timeout=30)
    client.close()
