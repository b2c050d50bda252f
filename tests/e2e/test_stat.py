"""End to end: ``triton-mp stat`` and ``Admin/QueueStatus`` against a running server.

One server for the module, serving the ONNX ``add_sub`` and ``held_py``, a python model
that holds its batch for the largest ``INPUT0[0, 0]`` seconds (or until the test creates
its gate file), with two priority levels
and room for 3 requests at level 2. A request that sleeps holds the only instance, so
the queue stays put while the test reads it, through the gRPC admin service and through
``triton-mp stat --json`` run as a subprocess. The test waits for states it observes
(the instance busy, the queue filled); no sleep is an assertion.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import (
    REPO_ROOT,
    ServerProcess,
    counted,
    default_sigint,
    free_port,
    server_factory,
)
from tests.helpers.stat_cli import run_stat
from triton_mp._proto import admin_pb2, admin_pb2_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HELD_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching {
  priority_levels: 2
  default_priority_level: 2
  priority_queue_policy { key: 2 value: { max_queue_size: 3 } }
}
"""
HELD_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

GATE = "GATE_PATH"


class TritonPythonModel:
    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        # NOTE: held that many seconds, or until the test opens the gate (creates the file)
        deadline = time.monotonic() + max(float(x.flat[0]) for x in inputs)
        while time.monotonic() < deadline and not os.path.exists(GATE):
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", (x * 2).astype(np.float32))])
            for x in inputs
        ]
"""


def _stat_json(server: ServerProcess, *args: str) -> dict[str, object]:
    out = run_stat("--url", server.url, "--json", *args)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    snap = json.loads(out.stdout)
    assert isinstance(snap, dict)
    return snap


def _rpc(server: ServerProcess, model: str = "") -> admin_pb2.QueueStatusResponse:
    with grpc.insecure_channel(server.url) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        return stub.QueueStatus(admin_pb2.QueueStatusRequest(model=model), timeout=30)


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file whose creation ends ``held_py``'s holds (before their seconds are up)."""
    return tmp_path_factory.mktemp("gate") / "open"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[ServerProcess]:
    repo = copy_models(tmp_path_factory.mktemp("repo"), "add_sub")
    write_python_model(repo, "held_py", HELD_CONFIG, HELD_MODEL.replace("GATE_PATH", str(gate)))
    with server_factory(Path(tmp_path_factory.mktemp("logs"))) as start:
        yield start(repo)


def _held_input(sleep_s: float) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.full((1, 2), sleep_s, np.float32))
    return [inp]


def test_stat_json_counts_every_batch_of_a_burst(server: ServerProcess) -> None:
    client = server.client()
    a = np.arange(16, dtype=np.float32)[None]
    answered: list[object] = []
    try:
        for _ in range(3):  # a few sequential requests, then a burst of 40
            inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for i in inputs:
                i.set_data_from_numpy(a)
            client.infer("add_sub", inputs)
        for _ in range(40):
            inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for i in inputs:
                i.set_data_from_numpy(a)
            client.async_infer(
                "add_sub", inputs, lambda result, error: answered.append(error or result)
            )
        deadline = time.monotonic() + 60
        while len(answered) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(answered) == 40
        assert not [x for x in answered if isinstance(x, InferenceServerException)]
        stats = counted(
            lambda: client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0],
            lambda st: int(st.get("inference_count", 0)) >= 43,
            "43 inferences counted",
        )
    finally:
        client.close()

    snap = _stat_json(server, "--model", "add_sub")
    assert snap["url"] == server.url
    # NOTE: every frontend of the server, none restarted (the supervisor's counts).
    restarts = snap["frontend_restarts"]
    assert isinstance(restarts, dict)
    assert restarts
    assert set(restarts.values()) == {0}
    (m,) = snap["models"]  # type: ignore[misc]
    assert (m["model"], m["version"], m["scheduler"], m["max_batch_size"]) == (
        "add_sub",
        1,
        "dynamic",
        8,
    )
    sizes = {int(k): n for k, n in m["batch_sizes"].items()}
    assert sum(size * n for size, n in sizes.items()) == 43
    assert max(sizes) <= 8
    batches = sum(sizes.values())
    assert sum(m["close_reasons"].values()) == batches
    assert set(m["close_reasons"]) >= {"max", "preferred", "delay", "idle", "shape", "single"}
    assert sum(i["executions"] for i in m["instances"]) == batches
    assert [(i["name"], i["live"], i["batches_in_flight"]) for i in m["instances"]] == [
        ("add_sub_0_0", True, 0)
    ]
    assert all(lv["depth"] == 0 and lv["oldest_age_us"] == 0 for lv in m["levels"])
    recent = m["recent_batches"]
    assert recent
    assert all(b["instance"] == "add_sub_0_0" for b in recent)
    assert [b["age_us"] for b in recent] == sorted(b["age_us"] for b in recent)  # newest first
    assert sum(b["batch_size"] for b in recent) <= 43
    # NOTE: the same batches as ModelStatistics' batch_stats (executions per batch size)
    assert sizes == {
        int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]
    }

    # the gRPC answer says the same
    (pm,) = _rpc(server, "add_sub").models
    assert dict(pm.batch_sizes) == sizes
    assert {k: v for k, v in pm.close_reasons.items() if v} == {
        k: v for k, v in m["close_reasons"].items() if v
    }


def test_queue_while_instance_busy(server: ServerProcess, gate: Path) -> None:
    client = server.client()
    done: list[tuple[str, object]] = []

    def send(tag: str, sleep_s: float = 0.0, priority: int = 0) -> None:
        client.async_infer(
            "held_py",
            _held_input(sleep_s),
            lambda result, error: done.append((tag, error if error is not None else result)),
            priority=priority,
        )

    def held() -> admin_pb2.ModelQueueStatus:
        (m,) = _rpc(server, "held_py").models
        return m

    try:
        send("holder", 60.0)  # until the CLI runs are done (the gate), at most 60 s
        busy = counted(
            held, lambda m: m.instances[0].batches_in_flight > 0, "the instance busy", 60
        )
        assert (busy.instances[0].requests_in_flight, busy.instances[0].batch_size_in_flight) == (
            1,
            1,
        )
        for i in range(5):
            send(f"low{i}", priority=2)  # level 2 holds 3: two are refused
        send("high", priority=1)
        full = counted(
            held,
            # NOTE: aged from their arrival: a query the scheduler reads in the same pass
            # as the requests sees them older than 0 µs too (it said 0 µs before).
            lambda m: [(lv.depth, lv.rejected) for lv in m.levels] == [(1, 0), (3, 2)],
            "the queue filled",
            60,
        )
        assert full.instances[0].batches_in_flight == 1
        assert [lv.level for lv in full.levels] == [1, 2]
        assert all(lv.oldest_age_us > 0 for lv in full.levels)

        # the CLI sees the same queue (the holder still runs)
        snap = _stat_json(server, "--model", "held_py")
        (m,) = snap["models"]  # type: ignore[misc]
        levels = [(lv["level"], lv["depth"], lv["rejected"], lv["timed_out"]) for lv in m["levels"]]
        assert levels == [(1, 1, 0, 0), (2, 3, 2, 0)]
        assert m["levels"][1]["oldest_age_us"] > 0
        (inst,) = m["instances"]
        assert (inst["live"], inst["batches_in_flight"], inst["batch_size_in_flight"]) == (
            True,
            1,
            1,
        )
        table = run_stat("--url", server.url, "--model", "held_py")
        assert table.returncode == 0, table.stderr
        assert "held_py v1 · dynamic batcher · max batch 4" in table.stdout
        assert "1 (1 req)" in table.stdout  # the holder's batch, running
        # NOTE: the running batch counts in its instance's batches, as in the caption's total
        row = next(line for line in table.stdout.splitlines() if "1 (1 req)" in line)
        assert row.split()[-1] == "1"
        assert "1 batches, mean 1.0" in table.stdout

        gate.touch()
        deadline = time.monotonic() + 60
        while len(done) < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        gate.touch()
        client.close()
    errors = {tag: r for tag, r in done if isinstance(r, InferenceServerException)}
    assert len(done) == 7
    assert len(errors) == 2
    assert all(e.message().endswith("Exceeds maximum queue size") for e in errors.values())

    final = held()
    assert [lv.depth for lv in final.levels] == [0, 0]
    sizes = dict(final.batch_sizes)
    assert sum(size * n for size, n in sizes.items()) == 5  # holder + high + 3 low
    assert sum(final.close_reasons.values()) == sum(sizes.values())
    assert final.instances[0].executions == sum(sizes.values())


def test_unknown_model(server: ServerProcess) -> None:
    out = run_stat("--url", server.url, "--model", "nope", "--json")
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr == "triton-mp stat: Request for unknown model: 'nope' is not found\n"

    with pytest.raises(grpc.RpcError) as info:
        _rpc(server, "nope")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "Request for unknown model: 'nope' is not found"


@pytest.mark.parametrize("mode", [(), ("--json",), ("--watch",)])
def test_unreachable_server_is_one_line_and_status_1(mode: tuple[str, ...]) -> None:
    url = f"127.0.0.1:{free_port()}"
    out = run_stat("--url", url, *mode)
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"triton-mp stat: cannot reach a server at {url}: ")


def test_watch_redraws_until_ctrl_c(server: ServerProcess) -> None:
    """--watch on a terminal (a pty): frames arrive until SIGINT, then exit status 0."""
    env = dict(os.environ, COLUMNS="100", LINES="60", TERM="xterm")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")) if p
    )
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "triton_mp", "stat", "--url", server.url, "--watch"]
        + ["--interval", "0.2"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=REPO_ROOT,
        preexec_fn=default_sigint,
    )
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        # NOTE: two footers = at least two frames drawn.
        while seen.count(b"Ctrl-C to quit") < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
        assert seen.count(b"Ctrl-C to quit") >= 2, seen.decode(errors="replace")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(master)
    text = seen.decode(errors="replace")
    assert "held_py v1" in text
    assert "add_sub v1" in text
    assert "Traceback" not in text
