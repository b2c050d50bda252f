"""RepositoryModelUnload while the model still has requests, side by side with the real
Triton 2.51: the unload answers at once (``TRITONSERVER_ServerUnloadModel`` returns once core's
``ModelLifeCycle::AsyncUnload`` released the model), and the model drains behind it.

While it drains, RepositoryIndex shows its version UNLOADING (no reason), the server is not
ready (strict readiness: UNLOADING is not "unloaded"), a new request is refused with the
unloaded model's words, and the requests it already had (running, queued, or a START waiting
for a sequence slot) are answered by the old worker. Once the last is answered the version is
UNAVAILABLE "unloaded". A live sequence alone does not hold the unload. A load during the
drain serves a new generation at once; a stop during it leaves nothing (triton-mp). The
models answer their worker's pid, so each generation's process is seen from a client.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repo_control import config_pbtxt, post, seq_sum_config, seq_sum_source
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, group_alive, wait_for
from tests.helpers.triton_peer import RealTriton, side_by_side

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton
Answer = tuple[int, int] | str

SLOW_S = 3.0
"""Seconds ``slow`` takes per request (one instance, no batching: the others queue)."""
IDLE_S = 12.0
"""max_sequence_idle of the sequence models, in seconds."""
QUICK_S = 5.0
"""An unload answering within this did not wait for the model's requests (2.51: 0.00 s
idle, up to 7.5 s seen with a load average near 70; triton-mp before: 8-12 s here)."""

SLOW_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "PID" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _slow_src(marks: Path) -> str:
    """model.py of the slow models: each request sleeps ``SLOW_S``, answers INPUT0 and the
    worker's pid, and first leaves a file ``<INPUT0>-<pid>`` in ``marks`` (it runs now)."""
    return f"""
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            open(os.path.join({str(marks)!r}, f"{{int(x[0])}}-{{os.getpid()}}"), "w").close()
            time.sleep({SLOW_S})
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], np.int32))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x), pid]))
        return out
"""


def _seq_config() -> dict:
    """seq_sum with PID, Direct, one instance with one slot: a second START waits."""
    base = seq_sum_config(("OUTPUT0", "PID"), count=1)
    seq = {k: v for k, v in base["sequence_batching"].items() if k != "oldest"}
    seq["direct"] = {}
    seq["max_sequence_idle_microseconds"] = int(IDLE_S * 1e6)
    return {**base, "max_batch_size": 1, "sequence_batching": seq}


SLOW_MODELS = ("slow", "slow_reload", "slow_twice")
SEQ_MODELS = ("seq_backlog", "seq_alone")

ENSEMBLE_TEMPLATE = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "PID" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "%s" model_version: -1
  input_map { key: "INPUT0" value: "IN" }
  output_map [ { key: "OUTPUT0" value: "OUT" }, { key: "PID" value: "PID" } ] } ] }
"""
ENSEMBLES = {"ens_slow": "slow_step", "ens_kept": "slow_kept"}
"""Ensemble -> its one step: ``slow_step`` is loaded only for ``ens_slow`` (not at start,
not by name); ``slow_kept`` and ``ens_kept`` are loaded at start."""


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the slow models mark each request they start (``_slow_src``)."""
    return tmp_path_factory.mktemp("marks")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, marks: Path) -> Iterator[dict[str, Server]]:
    repo = tmp_path_factory.mktemp("s20unl") / "repo"
    for name in SLOW_MODELS:
        write_python_model(repo, name, SLOW_CONFIG, _slow_src(marks))
    for name in SEQ_MODELS:
        write_python_model(repo, name, config_pbtxt(_seq_config()), seq_sum_source(True))
    for ensemble, step in ENSEMBLES.items():
        write_python_model(repo, step, SLOW_CONFIG, _slow_src(marks))
        (repo / ensemble / "1").mkdir(parents=True)
        (repo / ensemble / "config.pbtxt").write_text(ENSEMBLE_TEMPLATE % step)
    at_start = (*SLOW_MODELS, *SEQ_MODELS, "slow_kept", "ens_kept")
    loads = tuple(f"--load-model={n}" for n in at_start)
    flags = ("--model-control-mode=explicit", *loads)
    with side_by_side(repo, tmp_path_factory.mktemp("logs"), *flags) as found:
        yield found


# ------------------------------------------------------------------------ clients
def _slow(url: str, model: str, value: int) -> Answer:
    """One request of ``slow``: (value answered, pid), or ``"<status>: <message>"``."""
    t = grpcclient.InferInput("INPUT0", [1], "INT32")
    t.set_data_from_numpy(np.array([value], np.int32))
    with grpcclient.InferenceServerClient(url) as c:
        try:
            r = c.infer(model, [t], client_timeout=60)
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return int(r.as_numpy("OUTPUT0")[0]), int(r.as_numpy("PID")[0])


def _ensemble(url: str, value: int, model: str = "ens_slow") -> Answer:
    """One request of an ensemble: (value answered, pid), or ``"<status>: <message>"``."""
    t = grpcclient.InferInput("IN", [1], "INT32")
    t.set_data_from_numpy(np.array([value], np.int32))
    with grpcclient.InferenceServerClient(url) as c:
        try:
            r = c.infer(model, [t], client_timeout=60)
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return int(r.as_numpy("OUT")[0]), int(r.as_numpy("PID")[0])


def _seq(url: str, model: str, sid: int, value: int, **flags: object) -> Answer:
    """One request of a sequence: (running sum, pid), or ``"<status>: <message>"``."""
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[value]], np.int32))
    with grpcclient.InferenceServerClient(url) as c:
        try:
            r = c.infer(model, [t], sequence_id=sid, client_timeout=60, **flags)  # type: ignore[arg-type]
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return int(r.as_numpy("OUTPUT0")[0][0]), int(r.as_numpy("PID")[0][0])


def _in_background(call: Callable[[], Answer]) -> tuple[threading.Thread, list[Answer]]:
    into: list[Answer] = []
    th = threading.Thread(target=lambda: into.append(call()), daemon=True)
    th.start()
    return th, into


def _running(
    call: Callable[[int], Answer], values: tuple[int, ...], marks: Path, pid: int
) -> list[tuple[threading.Thread, list[Answer]]]:
    """Send ``values`` to a slow model (on worker ``pid``; 0: any, the first value's marks
    cleared first) from threads: the first one runs (its mark is there) before the others
    are sent; those queue behind it."""
    if not pid:
        for old in marks.glob(f"{values[0]}-*"):
            old.unlink()
    first = [_in_background(lambda: call(values[0]))]
    mark = f"{values[0]}-{pid}" if pid else f"{values[0]}-*"
    wait_for(lambda: any(marks.glob(mark)), 60, "the first request to run")
    rest = [_in_background(lambda v=v: call(v)) for v in values[1:]]  # type: ignore[misc]
    time.sleep(1.0)  # NOTE: they reach the queue (the first runs for SLOW_S)
    return first + rest


def _index(server: Server, model: str) -> list[tuple[str, str, str]]:
    """(version, state, reason) of ``model``'s rows in RepositoryIndex."""
    status, body = post(server.http_url, "/v2/repository/index", {})
    assert status == 200
    rows = [r for r in json.loads(body) if r["name"] == model]
    return [(r.get("version", ""), r.get("state", ""), r.get("reason", "")) for r in rows]


def _get(url: str) -> tuple[int, str]:
    """HTTP GET: (status, body)."""
    try:
        with urllib.request.urlopen(url) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _server_ready(server: Server) -> bool:
    return _get(f"http://{server.http_url}/v2/health/ready")[0] == 200


def _metric_lines(server: Server, model: str) -> list[str]:
    """The Prometheus lines about ``model``'s successes (nv_inference_request_success)."""
    _, body = _get(f"http://127.0.0.1:{server.metrics_port}/metrics")
    return [
        line
        for line in body.splitlines()
        if line.startswith("nv_inference_request_success{") and f'model="{model}"' in line
    ]


def _timed_unload(server: Server, model: str) -> float:
    t0 = time.monotonic()
    status, body = post(server.http_url, f"/v2/repository/models/{model}/unload", {})
    took = time.monotonic() - t0
    assert status == 200, body
    return took


def _wait_index(server: Server, model: str, want: list[tuple[str, str, str]], what: str) -> None:
    wait_for(lambda: _index(server, model) == want, IDLE_S + 30, what)


UNLOADING = [("1", "UNLOADING", "")]
UNLOADED = [("1", "UNAVAILABLE", "unloaded")]
READY = [("1", "READY", "")]


# -------------------------------------------------------------------------- tests
def test_an_unload_answers_while_running_and_queued_requests_finish(
    servers: dict[str, Server],
    marks: Path,
) -> None:
    for name, s in servers.items():
        warm = _slow(s.url, "slow", 0)
        assert isinstance(warm, tuple), (name, warm)
        assert _metric_lines(s, "slow"), name
        running = _running(lambda i, s=s: _slow(s.url, "slow", i), (1, 2, 3), marks, warm[1])
        took = _timed_unload(s, "slow")
        during = _index(s, "slow")
        ready_during = _server_ready(s)
        refused = _slow(s.url, "slow", 9)
        print(f"{name}: unload answered in {took:.2f} s; index {during}; ready {ready_during}")
        print(f"{name}: a new request during the drain got {refused}")
        assert took < QUICK_S, (name, took)
        assert during == UNLOADING, name
        assert not ready_during, name
        assert refused == (
            "StatusCode.NOT_FOUND: Request for unknown model: 'slow' has no available versions"
        ), name
        assert _metric_lines(s, "slow"), name  # NOTE: the model object still lives
        for th, _ in running:
            th.join(timeout=60)
        answers = [into[0] for _, into in running]
        print(f"{name}: the running and queued requests got {answers}")
        assert answers == [(1, warm[1]), (2, warm[1]), (3, warm[1])], name
        wait_for(lambda pid=warm[1]: not psutil.pid_exists(pid), 30, f"{name}: worker exit")
        _wait_index(s, "slow", UNLOADED, f"{name}: slow UNAVAILABLE")
        assert _server_ready(s), name
        after = _slow(s.url, "slow", 9)
        stats = _get(f"http://{s.http_url}/v2/models/slow/stats")
        print(f"{name}: after the drain a request got {after}; stats {stats}")
        assert after == refused, name
        assert stats == (
            400,
            '{"error":"requested model \'slow\' is not available"}',
        ), name
        wait_for(lambda s=s: not _metric_lines(s, "slow"), 10, f"{name}: slow's metrics gone")


def test_a_load_while_the_unloaded_model_drains_serves_a_new_generation(
    servers: dict[str, Server],
    marks: Path,
) -> None:
    for name, s in servers.items():
        warm = _slow(s.url, "slow_reload", 0)
        assert isinstance(warm, tuple), (name, warm)
        running = _running(lambda i, s=s: _slow(s.url, "slow_reload", i), (1, 2), marks, warm[1])
        assert _timed_unload(s, "slow_reload") < QUICK_S, name
        t0 = time.monotonic()
        status, body = post(s.http_url, "/v2/repository/models/slow_reload/load", {})
        took = time.monotonic() - t0
        assert status == 200, body
        during = _index(s, "slow_reload")
        print(f"{name}: load during the drain answered in {took:.2f} s; index {during}")
        assert during == READY, name
        new = _slow(s.url, "slow_reload", 5)
        assert isinstance(new, tuple), (name, new)
        assert new[0] == 5, (name, new)
        assert new[1] != warm[1], (name, new, warm)
        for th, _ in running:
            th.join(timeout=60)
        answers = [into[0] for _, into in running]
        print(f"{name}: the requests of the unloaded generation got {answers}")
        assert answers == [(1, warm[1]), (2, warm[1])], name
        wait_for(lambda pid=warm[1]: not psutil.pid_exists(pid), 30, f"{name}: old worker exit")
        assert _index(s, "slow_reload") == READY, name
        assert _server_ready(s), name


def test_a_version_unloaded_again_while_an_older_generation_drains_stays_unloading(
    servers: dict[str, Server], marks: Path
) -> None:
    """Unload, load and unload again while the first generation still drains: the version
    is UNLOADING until the second generation drained too (2.51: the second model object
    still lives), not as soon as the first one's worker exits."""
    for name, s in servers.items():
        warm = _slow(s.url, "slow_twice", 0)
        assert isinstance(warm, tuple), (name, warm)
        old = _running(lambda i, s=s: _slow(s.url, "slow_twice", i), (1, 2, 3, 4), marks, warm[1])
        assert _timed_unload(s, "slow_twice") < QUICK_S, name
        status, body = post(s.http_url, "/v2/repository/models/slow_twice/load", {})
        assert status == 200, body
        new = _running(lambda i, s=s: _slow(s.url, "slow_twice", i), (11, 12, 13, 14), marks, 0)
        assert _timed_unload(s, "slow_twice") < QUICK_S, name
        wait_for(lambda pid=warm[1]: not psutil.pid_exists(pid), 60, f"{name}: first worker exit")
        while_second = _index(s, "slow_twice")
        print(f"{name}: first generation gone; index {while_second}")
        for th, _ in old + new:
            th.join(timeout=90)
        answers = [into[0] for _, into in old + new]
        print(f"{name}: the two generations' requests got {answers}")
        assert while_second == UNLOADING, name
        assert answers[:4] == [(v, warm[1]) for v in (1, 2, 3, 4)], name
        assert [a[0] if isinstance(a, tuple) else a for a in answers[4:]] == [11, 12, 13, 14]
        _wait_index(s, "slow_twice", UNLOADED, f"{name}: slow_twice UNAVAILABLE")


def test_an_unload_with_a_live_sequence_and_a_waiting_start_answers_at_once(
    servers: dict[str, Server],
) -> None:
    """The START waiting for the one slot holds the unloaded model until the live sequence's
    idle time frees the slot; it is answered then, by the old worker."""
    for name, s in servers.items():
        first = _seq(s.url, "seq_backlog", 60, 1, sequence_start=True)
        assert isinstance(first, tuple), (name, first)
        waiting = _in_background(lambda s=s: _seq(s.url, "seq_backlog", 61, 5, sequence_start=True))
        time.sleep(0.5)
        took = _timed_unload(s, "seq_backlog")
        during = _index(s, "seq_backlog")
        nxt = _seq(s.url, "seq_backlog", 60, 2)
        print(f"{name}: unload answered in {took:.2f} s; index {during}; next step got {nxt}")
        assert took < QUICK_S, (name, took)
        assert during == UNLOADING, name
        assert nxt == (
            "StatusCode.NOT_FOUND: Request for unknown model: 'seq_backlog' has no "
            "available versions"
        ), name
        waiting[0].join(timeout=IDLE_S + 30)
        print(f"{name}: the waiting START got {waiting[1]}")
        assert waiting[1] == [(5, first[1])], name
        wait_for(lambda pid=first[1]: not psutil.pid_exists(pid), 30, f"{name}: worker exit")
        _wait_index(s, "seq_backlog", UNLOADED, f"{name}: seq_backlog UNAVAILABLE")


def test_a_live_sequence_alone_does_not_hold_the_unload(servers: dict[str, Server]) -> None:
    for name, s in servers.items():
        first = _seq(s.url, "seq_alone", 70, 1, sequence_start=True)
        assert isinstance(first, tuple), (name, first)
        t0 = time.monotonic()
        assert _timed_unload(s, "seq_alone") < QUICK_S, name
        _wait_index(s, "seq_alone", UNLOADED, f"{name}: seq_alone UNAVAILABLE")
        took = time.monotonic() - t0
        print(f"{name}: UNAVAILABLE {took:.2f} s after the unload (idle {IDLE_S} s)")
        assert took < IDLE_S / 2, (name, took)
        wait_for(lambda pid=first[1]: not psutil.pid_exists(pid), 30, f"{name}: worker exit")


def test_unload_dependents_while_the_ensemble_s_requests_run(
    servers: dict[str, Server], marks: Path
) -> None:
    """An ensemble unloaded with ``unload_dependents`` takes its composing model (loaded only
    for it) along: the unload answers at once, both drain the ensemble requests they had."""
    for name, s in servers.items():
        status, body = post(s.http_url, "/v2/repository/models/ens_slow/load", {})
        assert status == 200, body
        warm = _ensemble(s.url, 0)
        assert isinstance(warm, tuple), (name, warm)
        running = _running(lambda i, s=s: _ensemble(s.url, i), (1, 2), marks, warm[1])
        t0 = time.monotonic()
        body = {"parameters": {"unload_dependents": True}}
        status, text = post(s.http_url, "/v2/repository/models/ens_slow/unload", body)
        took = time.monotonic() - t0
        assert status == 200, text
        during = {m: _index(s, m) for m in ("ens_slow", "slow_step")}
        print(f"{name}: unload with dependents answered in {took:.2f} s; index {during}")
        for th, _ in running:
            th.join(timeout=60)
        answers = [into[0] for _, into in running]
        print(f"{name}: the ensemble's requests got {answers}")
        for m in ("ens_slow", "slow_step"):
            _wait_index(s, m, UNLOADED, f"{name}: {m} UNAVAILABLE")
        assert took < QUICK_S, (name, took)
        assert during == {"ens_slow": UNLOADING, "slow_step": UNLOADING}, name
        assert answers == [(1, warm[1]), (2, warm[1])], name


def test_an_ensemble_unloaded_alone_while_its_requests_run(
    servers: dict[str, Server], marks: Path
) -> None:
    """A difference (docs/differences.md): 2.51 shows an ensemble unloaded without its
    composing model UNLOADING until its in-flight requests are answered; triton-mp shows it
    UNAVAILABLE "unloaded" at once (its supervisor does not see an ensemble's requests).
    Both answer the requests, and the composing model serves on."""
    for name, s in servers.items():
        warm = _ensemble(s.url, 0, "ens_kept")
        assert isinstance(warm, tuple), (name, warm)
        running = _running(lambda i, s=s: _ensemble(s.url, i, "ens_kept"), (1, 2), marks, warm[1])
        took = _timed_unload(s, "ens_kept")
        during = _index(s, "ens_kept")
        print(f"{name}: ensemble unloaded alone in {took:.2f} s; index {during}")
        for th, _ in running:
            th.join(timeout=60)
        answers = [into[0] for _, into in running]
        print(f"{name}: its requests got {answers}")
        _wait_index(s, "ens_kept", UNLOADED, f"{name}: ens_kept UNAVAILABLE")
        assert took < QUICK_S, (name, took)
        assert during == {"triton": UNLOADING, "triton-mp": UNLOADED}[name], name
        assert answers == [(1, warm[1]), (2, warm[1])], name
        assert _index(s, "slow_kept") == READY, name


def test_a_stop_while_an_unloaded_model_drains_leaves_nothing(tmp_path: Path) -> None:
    """triton-mp only: SIGINT while an unloaded model's worker still runs a request and has
    one queued; the server exits, no process of its group and nothing of it in /dev/shm is
    left, and the log shows no killed worker."""
    repo = tmp_path / "repo"
    write_python_model(repo, "slow_stop", SLOW_CONFIG, _slow_src(tmp_path))
    server = ServerProcess(
        repo, tmp_path / "ours.log", "--model-control-mode=explicit", "--load-model=*"
    )
    try:
        server.wait_live()
        warm = _slow(server.url, "slow_stop", 0)
        assert isinstance(warm, tuple), warm
        running = _running(lambda i: _slow(server.url, "slow_stop", i), (1, 2), tmp_path, warm[1])
        assert _timed_unload(server, "slow_stop") < QUICK_S
        assert _index(server, "slow_stop") == UNLOADING
        assert psutil.pid_exists(warm[1])
        server.proc.send_signal(signal.SIGINT)
        server.proc.wait(timeout=60)
        wait_for(lambda: not group_alive(server.pid), 10, "every process of the server to exit")
        assert not psutil.pid_exists(warm[1])
        assert not list(Path("/dev/shm").glob(f"triton_mp_{server.pid}_*"))
        assert "did not stop" not in server.log()
        for th, _ in running:
            th.join(timeout=60)
    finally:
        server.stop()
