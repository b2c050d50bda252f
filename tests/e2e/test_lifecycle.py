"""Server lifecycle end to end: drain on SIGTERM, cleanup after kill -9, a dead worker.

Processes are found by the pids the server logs (every line carries role, instance and
pid), and every server is stopped by the fixture by pid and process group.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import ServerProcess, group_alive, server_factory, wait_for
from triton_mp.common.process import process_dirs
from triton_mp.ipc.memory.shm import list_objects

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _add_sub_inputs(batch: int = 1) -> list[grpcclient.InferInput]:
    a = np.ones((batch, 16), np.float32)
    out = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [batch, 16], "FP32")
        i.set_data_from_numpy(a)
        out.append(i)
    return out


def _det_input(side: int) -> list[grpcclient.InferInput]:
    x = np.random.default_rng(side).uniform(-1, 1, (1, 3, side, side)).astype(np.float32)
    i = grpcclient.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return [i]


def _pid_of(server: ServerProcess, pattern: str) -> int:
    m = re.search(pattern, server.log())
    assert m, f"no log line matches {pattern!r}:\n{server.log()}"
    return int(m.group(1))


def _batches_started(server: ServerProcess) -> int:
    """Batches the workers logged as started (``--log-verbose 1``); a request a frontend
    handed to an idle instance itself (``frontend.dispatch.direct``) runs as a batch of negative
    id."""
    return len(re.findall(r"batch -?\d+ started", server.log()))


def _requests_started(log: str) -> int:
    """Requests the workers have started (``--log-verbose 1``'s "batch ... started: N
    requests" lines). The frontend's "accepted for" line is the Python path's only: a call
    served by the native path (a known form, any request id) writes none."""
    return sum(int(n) for n in re.findall(r"batch \S+ started: (\d+) requests", log))


def test_sigterm_drains_in_flight_requests_then_cleans_up(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "ocr_det")
    server = start_server(repo, "--exit-timeout-secs", "60", "--log-verbose", "1")
    sid = str(server.pid)
    assert list_objects(sid), "a running server has shared memory"
    client = server.client()
    client.infer("ocr_det", _det_input(64))  # warm up the session
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client.infer, "ocr_det", _det_input(960)) for _ in range(4)]
        wait_for(lambda: _requests_started(server.log()) == 5, 60, "4 requests in flight")
        server.proc.send_signal(signal.SIGTERM)
        results = [f.result(timeout=120) for f in futures]
    for r in results:
        assert r.as_numpy("sigmoid_0.tmp_0").shape == (1, 1, 960, 960)
    assert server.proc.wait(timeout=60) == 0
    # NOTE: multiprocessing's resource tracker exits once the supervisor's pipe closes.
    wait_for(lambda: not group_alive(server.pid), 10, "every process of the server to exit")
    assert list_objects(sid) == []
    assert "draining" in server.log()
    client.close()


SLOW_TEARDOWN_MODEL = """
import time


class _CostlyToTearDown:
    # Stands in for what the interpreter's teardown frees at exit (numpy, onnxruntime,
    # protobuf...), which took seconds of a busy 2-core machine in each worker.
    def __del__(self):
        time.sleep(30)


_HELD_UNTIL_TEARDOWN = _CostlyToTearDown()


class TritonPythonModel:
    def execute(self, requests):
        raise NotImplementedError
"""


def test_ctrl_c_to_the_process_group_stops_the_server_in_seconds(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """Ctrl-C (SIGINT to the whole group): each child ends once its role has stopped, without
    the interpreter's teardown, so the server exits 0 within seconds, kills nothing and leaves
    nothing behind: no process of its group, nothing in /dev/shm. (With the teardown, a
    worker whose module-level object costs 30 s to free was killed as "did not stop" after
    10 s; the resource tracker, left to init to reap, kept the group alive ~2 s more.)"""
    repo = copy_models(tmp_path / "repo", "add_sub")
    write_python_model(
        repo,
        "slow_teardown_py",
        'backend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [1] }]\n'
        'output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [1] }]\n'
        "instance_group [{ count: 1, kind: KIND_CPU }]\n",
        SLOW_TEARDOWN_MODEL,
    )
    server = start_server(repo)
    sid = str(server.pid)
    server.client().infer("add_sub", _add_sub_inputs())
    t0 = time.monotonic()
    os.killpg(server.pid, signal.SIGINT)
    assert server.proc.wait(timeout=60) == 0
    stop_s = time.monotonic() - t0
    # NOTE: the supervisor reaped every child, multiprocessing's resource tracker included,
    # so nothing of the group is left for init to reap.
    assert not group_alive(server.pid)
    assert "did not stop" not in server.log()
    assert stop_s < 8, f"the server took {stop_s:.1f} s to stop"
    assert server.log().count("instance stopped") == 2
    assert list_objects(sid) == []


def _socket_dirs() -> set[Path]:
    """The native gRPC servers' private socket directories in the temp directory now."""
    return set(Path(tempfile.gettempdir()).glob(f"{process_dirs.NATIVE_GRPC}-*"))


def test_restart_after_kill_9_of_the_whole_tree_removes_stale_shared_memory(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    before = _socket_dirs()
    first = start_server(repo)
    client = first.client()
    client.infer("add_sub", _add_sub_inputs())
    client.close()
    stale = list_objects(str(first.pid))
    assert stale
    # NOTE: its frontend's native gRPC socket directory (process_dirs), swept the same way
    dirs = _socket_dirs() - before
    assert dirs
    os.killpg(first.pid, signal.SIGKILL)
    first.proc.wait(timeout=30)
    wait_for(lambda: not group_alive(first.pid), 30, "the killed tree to exit")
    # NOTE: kill -9 leaves the objects behind; another server starting on this machine at
    # the same moment may already have swept some of them, hence a subset.
    assert set(list_objects(str(first.pid))) <= set(stale)

    second = start_server(repo)
    assert list_objects(str(first.pid)) == []
    assert not any(d.exists() for d in dirs)
    client = second.client()
    res = client.infer("add_sub", _add_sub_inputs())
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), np.full((1, 16), 2, np.float32))
    client.close()


@pytest.fixture(scope="module")
def verbose_det_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """ocr_det and add_sub at ``--log-verbose 1``, for the dead-worker test and the
    given-up-client test (a start each before); each counts batches from where it began."""
    repo = copy_models(tmp_path_factory.mktemp("repo"), "ocr_det", "add_sub")
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo, "--log-verbose", "1")


def test_dead_worker_fails_its_requests_and_is_restarted(
    verbose_det_server: ServerProcess,
) -> None:
    server = verbose_det_server
    client = server.client()
    client.infer("ocr_det", _det_input(64))
    ready = re.findall(r"instance ready\s.*?instance=ocr_det_0_0 .*?pid=(\d+)", server.log())
    assert ready, f"no instance ready line for ocr_det_0_0:\n{server.log()}"
    det_pid = int(ready[-1])
    batches = _batches_started(server)
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(client.infer, "ocr_det", _det_input(1600))
        # NOTE: kill the worker while it runs the batch (a 1600x1600 pass takes seconds).
        wait_for(lambda: _batches_started(server) > batches, 60, "the batch to start")
        os.kill(det_pid, signal.SIGKILL)
        with pytest.raises(InferenceServerException) as e:
            fut.result(timeout=60)
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert "ocr_det" in e.value.message()
    assert "exit code -9" in e.value.message()
    # The other model never noticed.
    client.infer("add_sub", _add_sub_inputs())
    wait_for(lambda: "worker ocr_det_0_0 restarted" in server.log(), 60, "the restart")
    # ModelReady follows the live instances: ready again once the restart is done.
    wait_for(lambda: client.is_model_ready("ocr_det"), 30, "ocr_det to be ready again")
    assert client.is_server_ready()
    res = client.infer("ocr_det", _det_input(64))
    assert res.as_numpy("sigmoid_0.tmp_0").shape == (1, 1, 64, 64)
    client.close()


@pytest.fixture(scope="module")
def add_sub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """add_sub and add_sub_py with the default flags, for the tests that only look at a
    running server (a start each before): the port clash and the scheduler's mappings."""
    repo = copy_models(tmp_path_factory.mktemp("repo"), "add_sub", "add_sub_py")
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def test_a_second_server_on_a_port_in_use_refuses_to_start(
    tmp_path: Path, add_sub_server: ServerProcess
) -> None:
    first = add_sub_server
    repo = copy_models(tmp_path / "repo", "add_sub")
    # NOTE: frontends bind with SO_REUSEPORT; a second server must not share the port.
    clash = ServerProcess(repo, tmp_path / "clash.log", "--grpc-port", str(first.grpc_port))
    try:
        assert clash.proc.wait(timeout=60) == 1
        assert f"Socket '127.0.0.1:{first.grpc_port}' already in use" in clash.log()
    finally:
        clash.stop()
    client = first.client()
    assert client.is_model_ready("add_sub")
    client.close()


def test_kill_9_of_the_supervisor_takes_every_child_down(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    server = start_server(repo)
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    wait_for(lambda: not group_alive(server.pid), 30, "the orphaned children to exit")
    # The next start cleans what the dead tree left.
    start_server(repo)
    assert list_objects(str(server.pid)) == []


def test_draining_server_answers_not_ready_and_refuses_new_work(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "ocr_det", "add_sub")
    server = start_server(repo, "--exit-timeout-secs", "60", "--log-verbose", "1")
    client = server.client()
    client.infer("ocr_det", _det_input(64))
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(client.infer, "ocr_det", _det_input(1600))
        wait_for(lambda: _batches_started(server) >= 2, 60, "the long request to run")
        server.proc.send_signal(signal.SIGTERM)
        # NOTE: the frontend's own line: the supervisor's "draining" comes before the
        # frontend has its SIGTERM.
        wait_for(lambda: "requests in flight" in server.log(), 30, "the drain to begin")
        other = server.client()
        assert other.is_server_live()
        assert not other.is_server_ready()
        with pytest.raises(InferenceServerException) as e:
            other.infer("add_sub", _add_sub_inputs())
        assert e.value.status() == "StatusCode.UNAVAILABLE"
        assert "Server is stopping" in e.value.message()
        other.close()
        assert fut.result(timeout=120).as_numpy("sigmoid_0.tmp_0").shape == (1, 1, 1600, 1600)
    assert server.proc.wait(timeout=60) == 0
    client.close()


def test_requests_whose_client_gave_up_are_not_run(
    verbose_det_server: ServerProcess,
) -> None:
    server = verbose_det_server
    client = server.client()

    def count() -> int:
        st = client.get_inference_statistics("ocr_det", as_json=True)["model_stats"][0]
        return int(st.get("inference_count", 0))

    # NOTE: this test counts from here, once the other test's last request (answered just
    # before it ended) is counted: two reads 0.3 s apart agree.
    start, deadline = count(), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.3)
        start, settled = count(), start
        if start == settled:
            break
    client.infer("ocr_det", _det_input(64))
    # NOTE: the scheduler books a request when the worker's BatchDone reaches it, which can
    # be a moment after the client has its answer: wait for the warm-up to be counted.
    wait_for(lambda: count() == start + 1, 30, "the warm-up to be counted")
    before = count()
    batches = _batches_started(server)
    with ThreadPoolExecutor(5) as pool:
        long = pool.submit(client.infer, "ocr_det", _det_input(1600))
        wait_for(lambda: _batches_started(server) > batches, 60, "the long request to run")
        # These queue behind it and time out on the client side long before it ends.
        quitters = [
            pool.submit(client.infer, "ocr_det", _det_input(320), client_timeout=0.3)
            for _ in range(4)
        ]
        for q in quitters:
            with pytest.raises(InferenceServerException) as e:
                q.result(timeout=60)
            assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        long.result(timeout=120)
    client.infer("ocr_det", _det_input(64))
    # NOTE: one instance runs in order, so once the last request is counted, any abandoned
    # one that ran would be counted too.
    wait_for(lambda: count() - before >= 2, 30, "the last request to be counted")
    assert count() - before == 2, "the abandoned requests must not have run"
    client.close()


CRASHY_MODEL = """
import os
from pathlib import Path

MARK = Path(__file__).parent / "crashed"


class TritonPythonModel:
    def initialize(self, args):
        if MARK.exists():
            raise RuntimeError("refusing to start again after a crash")

    def execute(self, requests):
        MARK.touch()
        os._exit(3)
"""


def test_a_model_whose_instances_are_given_up_is_not_ready(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    write_python_model(
        repo,
        "crashy_py",
        'backend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [1] }]\n'
        'output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [1] }]\n'
        "instance_group [{ count: 1, kind: KIND_CPU }]\n",
        CRASHY_MODEL,
    )
    server = start_server(repo)
    client = server.client()
    assert client.is_model_ready("crashy_py")
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("crashy_py", [x])
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert "exit code 3" in e.value.message()
    wait_for(lambda: "not restarting it" in server.log(), 120, "the restarts to be given up")
    assert not client.is_model_ready("crashy_py")
    assert not client.is_server_ready()
    assert client.is_model_ready("add_sub")
    client.infer("add_sub", _add_sub_inputs())
    client.close()


def _mapped_files(pid: int) -> set[str]:
    """The files mapped into process ``pid`` (shared libraries, ``/proc/<pid>/maps``)."""
    with open(f"/proc/{pid}/maps") as maps:
        return {line.split(maxsplit=5)[5].strip() for line in maps if len(line.split()) == 6}


def test_the_scheduler_process_loads_no_numpy_onnxruntime_or_model_loader(
    add_sub_server: ServerProcess,
) -> None:
    """The scheduler's spawn target imports only its entry point (supervisor.processes.child_entry):
    none of the extension modules of numpy, onnxruntime, grpc or protobuf (which the
    repository loader needs) is mapped into it, while a worker of the same server has them."""
    server = add_sub_server
    server.client().infer("add_sub", _add_sub_inputs())
    scheduler = _pid_of(server, r"started scheduler scheduler \(pid (\d+)\)")
    worker = _pid_of(server, r"started worker add_sub_0_0 \(pid (\d+)\)")
    markers = ("/numpy/", "/onnxruntime/", "/grpc/", "/google/_upb/", "/google/protobuf/")
    loaded = [f for f in _mapped_files(scheduler) if any(m in f for m in markers)]
    assert loaded == [], f"the scheduler maps {loaded}"
    in_worker = {m for m in markers if any(m in f for f in _mapped_files(worker))}
    assert {"/numpy/", "/onnxruntime/"} <= in_worker
