"""A full reload of a sequence model whose old generation still has a live sequence (and a
START waiting in its backlog), side by side with the real Triton 2.51: RepositoryModelLoad
answers once the new generation serves, and the old one drains behind it (core's model
lifecycle releases the old model object when its last sequence ends), not after
max_sequence_idle. A second reload and an unload during the drain answer as quickly, and a
server stopped during it leaves nothing behind. A request the old generation answers after
the reload counts in the version's statistics (2.51 counts it in the old model's, which go
with it). The model answers its worker's pid, so each
generation's process is seen from a client.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repo_control import config_pbtxt, load_with, post, seq_sum_config, seq_sum_source
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, group_alive, wait_for
from tests.helpers.triton_peer import RealTriton, side_by_side

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton
Answer = tuple[int, int] | str

SRC = seq_sum_source(with_pid=True)
IDLE_S = 12.0
"""max_sequence_idle of the old generation, in seconds: what the load waited for before."""
QUICK_S = 5.0
"""A load that answers within this did not wait for the old generation (2.51: ~1.6 s)."""


def _config(idle_s: float) -> dict:
    """seq_sum with PID, Direct, one instance with one slot: a second START waits."""
    base = seq_sum_config(("OUTPUT0", "PID"), count=1)
    seq = {k: v for k, v in base["sequence_batching"].items() if k != "oldest"}
    seq["direct"] = {}
    seq["max_sequence_idle_microseconds"] = int(idle_s * 1e6)
    return {**base, "max_batch_size": 1, "sequence_batching": seq}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    repo = tmp_path_factory.mktemp("s19drain") / "repo"
    for name in ("seq_once", "seq_twice"):
        write_python_model(repo, name, config_pbtxt(_config(IDLE_S)), SRC)
    both = {**_config(IDLE_S), "version_policy": {"all": {}}}
    (write_python_model(repo, "seq_versions", config_pbtxt(both), SRC) / "2").mkdir()
    (repo / "seq_versions" / "2" / "model.py").write_text(SRC)
    flags = ("--model-control-mode=explicit", "--load-model=*")
    with side_by_side(repo, tmp_path_factory.mktemp("logs"), *flags) as found:
        yield found


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


def _backlogged_start(
    url: str, model: str, sid: int, **flags: object
) -> tuple[threading.Thread, list[Answer]]:
    """A START sent from a thread that waits in the backlog (the one slot is taken)."""
    into: list[Answer] = []
    th = threading.Thread(
        target=lambda: into.append(_seq(url, model, sid, 5, sequence_start=True, **flags)),
        daemon=True,
    )
    th.start()
    time.sleep(0.5)
    return th, into


def _timed_load(server: Server, model: str, idle_s: float) -> float:
    """A full reload (max_sequence_idle changed); seconds until it answered 200."""
    t0 = time.monotonic()
    assert load_with(server.http_url, model, _config(idle_s), SRC) == 200
    return time.monotonic() - t0


def _index(server: Server, model: str) -> list[tuple[str, str]]:
    """(version, state) of ``model``'s rows in RepositoryIndex."""
    status, body = post(server.http_url, "/v2/repository/index", {})
    assert status == 200
    rows = [r for r in json.loads(body) if r["name"] == model]
    return [(r.get("version", ""), r.get("state", "")) for r in rows]


def _stats(server: Server, model: str) -> tuple[int, int]:
    """``model``'s success count and execution count."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats") as r:
        st = json.loads(r.read())["model_stats"][0]
    return st["inference_stats"]["success"].get("count", 0), st["execution_count"]


def _new_pid(server: Server, model: str, sid: int) -> int:
    """The pid a new one-request sequence runs on."""
    got = _seq(server.url, model, sid, 1, sequence_start=True, sequence_end=True)
    assert isinstance(got, tuple), got
    return got[1]


def _wait_gone(pid: int, what: str) -> None:
    wait_for(lambda: not psutil.pid_exists(pid), IDLE_S + 30, what)


def test_a_full_reload_answers_before_the_old_generation_drained(
    servers: dict[str, Server],
) -> None:
    for name, s in servers.items():
        first = _seq(s.url, "seq_once", 20, 1, sequence_start=True)
        assert isinstance(first, tuple), (name, first)
        old_pid = first[1]
        th, waited = _backlogged_start(s.url, "seq_once", 21)
        took = _timed_load(s, "seq_once", 2 * IDLE_S)
        print(f"{name}: full reload answered in {took:.2f} s (old generation idle {IDLE_S} s)")
        assert took < QUICK_S, (name, took)
        # NOTE: the same version number serves its new generation: READY meanwhile.
        assert _index(s, "seq_once") == [("1", "READY")], name
        assert _new_pid(s, "seq_once", 22) != old_pid, name
        _wait_gone(old_pid, f"{name}: the old generation's worker to exit")
        th.join(timeout=60)
        print(f"{name}: old pid {old_pid}; the backlogged START got {waited}")
        # NOTE: a difference (docs/differences.md): 2.51's statistics are the new model
        # object's (sequence 22); the old one's last request (21, answered as it drained)
        # is counted with it and dropped. triton-mp's statistics start again at the new
        # generation's activation and count what the old one answers after it too.
        assert _stats(s, "seq_once") == {"triton": (1, 1), "triton-mp": (2, 2)}[name], name
        assert _index(s, "seq_once") == [("1", "READY")], name


def test_a_second_reload_and_an_unload_while_it_drains_answer_at_once(
    servers: dict[str, Server],
) -> None:
    for name, s in servers.items():
        first = _seq(s.url, "seq_twice", 30, 1, sequence_start=True)
        assert isinstance(first, tuple), (name, first)
        assert _timed_load(s, "seq_twice", IDLE_S + 1) < QUICK_S, name
        second = _seq(s.url, "seq_twice", 31, 1, sequence_start=True)
        assert isinstance(second, tuple), (name, second)
        assert second[1] != first[1], name
        took = _timed_load(s, "seq_twice", IDLE_S + 2)
        print(f"{name}: second reload answered in {took:.2f} s")
        assert took < QUICK_S, (name, took)
        third = _new_pid(s, "seq_twice", 32)
        assert third not in (first[1], second[1]), name
        t0 = time.monotonic()
        status, body = post(s.http_url, "/v2/repository/models/seq_twice/unload", {})
        took = time.monotonic() - t0
        print(f"{name}: unload answered in {took:.2f} s")
        assert status == 200, body
        assert took < QUICK_S, (name, took)
        for pid in (first[1], second[1], third):
            _wait_gone(pid, f"{name}: every generation's worker to exit")
        # NOTE: UNLOADING until the unloaded generation's worker exited and was freed
        wait_for(
            lambda s=s: _index(s, "seq_twice") == [("1", "UNAVAILABLE")],
            10,
            f"{name}: seq_twice UNAVAILABLE",
        )
        assert load_with(s.http_url, "seq_twice", _config(IDLE_S), SRC) == 200


def test_a_version_retired_while_its_sequence_lives_is_unloading_until_it_drained(
    servers: dict[str, Server],
) -> None:
    """A load that drops version 1 (version_policy) while a sequence lives on it and a START
    waits: the load answers at once; version 1 is UNLOADING in RepositoryIndex until its
    worker exits, then UNAVAILABLE "unloaded"; version 2 serves throughout."""
    only_2 = {**_config(IDLE_S), "version_policy": {"specific": {"versions": [2]}}}
    for name, s in servers.items():
        first = _seq(s.url, "seq_versions", 50, 1, sequence_start=True, model_version="1")
        assert isinstance(first, tuple), (name, first)
        th, into = _backlogged_start(s.url, "seq_versions", 51, model_version="1")
        t0 = time.monotonic()
        assert load_with(s.http_url, "seq_versions", only_2) == 200, name
        took = time.monotonic() - t0
        during = _index(s, "seq_versions")
        print(f"{name}: version 1 dropped in {took:.2f} s; index meanwhile {during}")
        assert took < QUICK_S, (name, took)
        assert during == [("1", "UNLOADING"), ("2", "READY")], name
        _wait_gone(first[1], f"{name}: version 1's worker to exit")
        th.join(timeout=60)
        wait_for(
            lambda s=s: _index(s, "seq_versions") == [("1", "UNAVAILABLE"), ("2", "READY")],
            10,
            f"{name}: version 1 UNAVAILABLE",
        )
        print(f"{name}: the backlogged START on version 1 got {into}")


def test_a_stop_while_the_old_generation_drains_leaves_nothing(tmp_path: Path) -> None:
    """triton-mp only: SIGINT while a reloaded model's old worker keeps a live sequence;
    the server exits, no process of its group and nothing of it in /dev/shm is left."""
    repo = tmp_path / "repo"
    write_python_model(repo, "seq_stop", config_pbtxt(_config(IDLE_S)), SRC)
    server = ServerProcess(
        repo, tmp_path / "ours.log", "--model-control-mode=explicit", "--load-model=*"
    )
    try:
        server.wait_live()
        first = _seq(server.url, "seq_stop", 40, 1, sequence_start=True)
        assert isinstance(first, tuple), first
        th, _ = _backlogged_start(server.url, "seq_stop", 41)
        assert _timed_load(server, "seq_stop", 2 * IDLE_S) < QUICK_S
        time.sleep(1.0)
        assert psutil.pid_exists(first[1])  # NOTE: it keeps sequence 40 until idle
        server.proc.send_signal(signal.SIGINT)
        server.proc.wait(timeout=60)
        wait_for(lambda: not group_alive(server.pid), 10, "every process of the server to exit")
        assert not psutil.pid_exists(first[1])
        assert not list(Path("/dev/shm").glob(f"triton_mp_{server.pid}_*"))
        assert "did not stop" not in server.log()
        th.join(timeout=60)
    finally:
        server.stop()
