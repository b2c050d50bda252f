"""An instance_group-only reload, side by side with the real Triton 2.51: the instances
stay where the new group still asks for them (core ``TritonModel::UpdateInstanceGroup``),
added ones start, removed ones finish their live sequences and running requests first, and
the statistics go on. Each model answers its worker's pid, so "kept" is seen from a client.

Loads go through RepositoryModelLoad's ``config`` / ``file:`` overrides (the same model.py
every time), so the repository on disk, which both servers read, never changes.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repo_control import config_pbtxt, load_with, seq_sum_config, seq_sum_source
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, side_by_side

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton

IO = {
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1]},
        {"name": "PID", "data_type": "TYPE_INT32", "dims": [1]},
    ],
}
SEQ_CONFIG = seq_sum_config(("OUTPUT0", "PID"), count=2)
SEQ = seq_sum_source(with_pid=True)
"""seq_pid: each sequence's running sum, kept in its instance, and the instance's pid."""
DYN_CONFIG = {
    "backend": "python",
    "max_batch_size": 8,
    **IO,
    "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    "dynamic_batching": {},
}
DYN = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            time.sleep(float(x.reshape(-1)[0]) / 1000)
            pid = pb_utils.Tensor("PID", np.full(x.shape, os.getpid(), np.int32))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x), pid]))
        return out
"""
"""dyn_pid: a dynamic batcher model that sleeps INPUT0 ms per request and answers its pid."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed, explicit model
    control with both models loaded."""
    repo = tmp_path_factory.mktemp("regroup") / "repo"
    write_python_model(repo, "seq_pid", config_pbtxt(SEQ_CONFIG), SEQ)
    write_python_model(repo, "dyn_pid", config_pbtxt(DYN_CONFIG), DYN)
    flags = ("--model-control-mode=explicit", "--load-model=*")
    with side_by_side(repo, tmp_path_factory.mktemp("logs"), *flags) as found:
        yield found


def _sides(servers: dict[str, Server]) -> list[tuple[str, Server]]:
    """The servers by name, Triton first (its half passes first). A real Triton that died
    earlier in this module is left out with a warning, so triton-mp's half still runs: 2.51
    dies (SIGSEGV) now and then around an in-place regroup with sequences live (the note in
    the first test; one clean-clone CI lost the module's last three tests to it)."""
    out = []
    for name, server in sorted(servers.items()):
        if isinstance(server, RealTriton) and server.proc.poll() is not None:
            warnings.warn(
                f"Triton 2.51 died earlier in this module: {name}'s half left out", stacklevel=2
            )
            continue
        out.append((name, server))
    return out


def _load(server: Server, model: str, config: dict, source: str) -> int:
    """RepositoryModelLoad of ``model`` with ``config`` and ``source`` as its 1/model.py."""
    return load_with(server.http_url, model, config, source)


def _count(config: dict, n: int) -> dict:
    return {**config, "instance_group": [{"count": n, "kind": "KIND_CPU"}]}


def _seq(server: Server, value: int, **flags: object) -> tuple[int, int] | str:
    """One request of a seq_pid sequence: (running sum, pid), or the error."""
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[value]], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        try:
            r = c.infer("seq_pid", [t], **flags)  # type: ignore[arg-type]
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return int(r.as_numpy("OUTPUT0")[0][0]), int(r.as_numpy("PID")[0][0])


def _pids_of_new_sequences(server: Server, first_id: int, n: int) -> set[int]:
    """The pids that ``n`` new sequences, live at once, run on (spread over the slots;
    ``n`` at most the free slots: both servers forget sequences past them)."""
    pids = set()
    ids = range(first_id, first_id + n)
    for s in ids:
        got = _seq(server, 1, sequence_id=s, sequence_start=True)
        assert isinstance(got, tuple), got
        pids.add(got[1])
    for s in ids:
        assert isinstance(_seq(server, 0, sequence_id=s, sequence_end=True), tuple)
    return pids


def _stats(server: Server, model: str) -> tuple[int, int]:
    """``model``'s success count and execution count."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats") as r:
        st = json.loads(r.read())["model_stats"][0]
    return st["inference_stats"]["success"].get("count", 0), st["execution_count"]


def test_a_count_down_keeps_live_sequences_and_one_of_the_pids(
    servers: dict[str, Server],
) -> None:
    for name, server in _sides(servers):  # Triton first: its half passes
        try:
            assert _load(server, "seq_pid", SEQ_CONFIG, SEQ) == 200, name
            before = _pids_of_new_sequences(server, 100, 8)
            assert len(before) == 2, name
            a = _seq(server, 1, sequence_id=11, sequence_start=True)
            b = _seq(server, 10, sequence_id=12, sequence_start=True)
            assert isinstance(a, tuple), (name, a)
            assert isinstance(b, tuple), (name, b)
            assert _load(server, "seq_pid", _count(SEQ_CONFIG, 1), SEQ) == 200, name
            # NOTE: 2.51 dies now and then (SIGSEGV) when a removed instance's sequence gets a
            # request within milliseconds of the update; a second's pause avoids its race.
            time.sleep(1)
            assert _seq(server, 2, sequence_id=11) == (3, a[1]), name
            assert _seq(server, 20, sequence_id=12) == (30, b[1]), name
            assert _seq(server, 3, sequence_id=11, sequence_end=True) == (6, a[1]), name
            assert _seq(server, 30, sequence_id=12, sequence_end=True) == (60, b[1]), name
            after = _pids_of_new_sequences(server, 200, 4)  # one instance, 4 slots
            assert len(after) == 1, (name, after)
            assert after < before, (name, before, after)
        finally:
            _load(server, "seq_pid", SEQ_CONFIG, SEQ)


def test_a_count_up_keeps_the_instance_and_its_live_sequence(servers: dict[str, Server]) -> None:
    for name, server in _sides(servers):  # Triton first: its half passes
        try:
            assert _load(server, "seq_pid", _count(SEQ_CONFIG, 1), SEQ) == 200, name
            time.sleep(1)  # NOTE: 2.51's race, as in the test above
            a = _seq(server, 5, sequence_id=13, sequence_start=True)
            assert isinstance(a, tuple), (name, a)
            assert _load(server, "seq_pid", _count(SEQ_CONFIG, 3), SEQ) == 200, name
            assert _seq(server, 6, sequence_id=13) == (11, a[1]), name
            after = _pids_of_new_sequences(server, 300, 11)  # 12 slots, 13 holds one
            assert len(after) == 3, (name, after)
            assert a[1] in after, (name, a, after)
            assert _seq(server, 7, sequence_id=13, sequence_end=True) == (18, a[1]), name
        finally:
            _load(server, "seq_pid", SEQ_CONFIG, SEQ)


def _dyn(server: Server, sleep_ms: int) -> tuple[int, int] | str:
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[sleep_ms]], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        try:
            r = c.infer("dyn_pid", [t], client_timeout=60)
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return int(r.as_numpy("OUTPUT0")[0][0]), int(r.as_numpy("PID")[0][0])


def _call(server: Server, sleep_ms: int, answers: list[tuple[int, int] | str]) -> None:
    answers.append(_dyn(server, sleep_ms))


def _keep_calling(
    server: Server, stop: threading.Event, answers: list[tuple[int, int] | str]
) -> None:
    while not stop.is_set():
        answers.append(_dyn(server, 2))


def test_requests_running_on_a_removed_instance_are_answered(servers: dict[str, Server]) -> None:
    for name, server in _sides(servers):
        try:
            assert _load(server, "dyn_pid", _count(DYN_CONFIG, 2), DYN) == 200, name
            answers: list[tuple[int, int] | str] = []
            slow = [threading.Thread(target=_call, args=(server, 1500, answers)) for _ in "ab"]
            for t in slow:
                t.start()
                time.sleep(0.3)  # NOTE: the second comes when the first runs: the other instance
            assert _load(server, "dyn_pid", _count(DYN_CONFIG, 1), DYN) == 200, name
            for t in slow:
                t.join(60)
            assert [a if isinstance(a, str) else a[0] for a in answers] == [1500, 1500], name
            pids = {a[1] for a in answers if isinstance(a, tuple)}
            assert len(pids) == 2, (name, answers)
            later = {_dyn(server, 0) for _ in range(6)}
            assert len(later) == 1, (name, later)
            assert later < {(0, pid) for pid in pids}, (name, later, pids)
        finally:
            _load(server, "dyn_pid", DYN_CONFIG, DYN)


def test_a_dynamic_batcher_under_load_loses_no_request_across_changes(
    servers: dict[str, Server],
) -> None:
    for name, server in _sides(servers):
        try:
            assert _load(server, "dyn_pid", DYN_CONFIG, DYN) == 200, name
            before = _stats(server, "dyn_pid")[0]
            stop = threading.Event()
            answers: list[tuple[int, int] | str] = []
            clients = [
                threading.Thread(target=_keep_calling, args=(server, stop, answers))
                for _ in range(4)
            ]
            for t in clients:
                t.start()
            for n in (2, 3, 1, 2, 1):
                time.sleep(0.3)
                assert _load(server, "dyn_pid", _count(DYN_CONFIG, n), DYN) == 200, (name, n)
            time.sleep(0.3)
            stop.set()
            for t in clients:
                t.join(60)
            failed = [a for a in answers if isinstance(a, str)]
            assert failed == [], (name, failed[:3])
            assert len({a[1] for a in answers if isinstance(a, tuple)}) >= 2, name
            deadline = time.monotonic() + 10  # the python backend reports after answering
            while _stats(server, "dyn_pid")[0] < before + len(answers):
                assert time.monotonic() < deadline, (name, _stats(server, "dyn_pid"))
                time.sleep(0.05)
            assert _stats(server, "dyn_pid")[0] == before + len(answers), name
        finally:
            _load(server, "dyn_pid", DYN_CONFIG, DYN)
