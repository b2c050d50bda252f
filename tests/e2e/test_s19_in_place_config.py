"""What a model version's instances read after an in-place change, and what a
version_policy-only change keeps, side by side with the real Triton 2.51.

- ``args['model_config']``: 2.51 makes no new backend ModelState for an instance_group-only
  change (core ``TritonModel::UpdateInstanceGroup``), and python_backend's
  ``StubLauncher::Initialize`` hands every stub the ModelState's config, parsed once at
  ``TRITONBACKEND_ModelInitialize``: an added instance reads the config the version was last
  fully loaded with, while ModelConfig answers the new one. The model here answers the
  instance count its ``initialize`` read and its pid. 2.51 does not restart a SIGKILLed stub
  (its calls fail from then on); triton-mp restarts a dead worker (docs/reliability.md), and
  the restarted one reads that same config.
- A version_policy-only change is an in-place change too (``ConfigChangeRequiresReload``
  false): the version that stays keeps its process and its statistics, a version the policy
  adds starts, one it drops stops.

Loads go through RepositoryModelLoad's ``config`` override (the files on disk never
change). Each test begins with a full reload in both servers (a config that differs in a
``parameters`` entry): the first override after a load from the files is a full reload in
2.51 only at times (docs/differences.md, r22's row).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repo_control import config_pbtxt, load_with, post
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, side_by_side

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton

CONFIG = {
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [
        {"name": "COUNT", "data_type": "TYPE_INT32", "dims": [1]},
        {"name": "PID", "data_type": "TYPE_INT32", "dims": [1]},
    ],
    "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
}
SOURCE = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        groups = json.loads(args["model_config"])["instance_group"]
        self.count = sum(int(g.get("count", 1)) for g in groups)

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            time.sleep(float(x.reshape(-1)[0]) / 1000)
            count = pb_utils.Tensor("COUNT", np.full(x.shape, self.count, np.int32))
            pid = pb_utils.Tensor("PID", np.full(x.shape, os.getpid(), np.int32))
            out.append(pb_utils.InferenceResponse([count, pid]))
        return out
"""
"""count_pid: sleeps INPUT0 ms; answers the instance count its initialize read, and its pid."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed, explicit model
    control, count_pid loaded from its files (count 2; versions 1 and 2, latest 1 serving)."""
    repo = tmp_path_factory.mktemp("in_place") / "repo"
    model = write_python_model(repo, "count_pid", config_pbtxt(CONFIG), SOURCE)
    (model / "2").mkdir()
    (model / "2" / "model.py").write_text((model / "1" / "model.py").read_text())
    flags = ("--model-control-mode=explicit", "--load-model=*")
    with side_by_side(repo, tmp_path_factory.mktemp("logs"), *flags) as found:
        yield found


def _config(count: int, tag: str, policy: dict | None = None) -> dict:
    """CONFIG with ``count`` instances and the parameter ``tag``: a load whose tag differs
    from the served one is a full reload in both servers (a new backend ModelState)."""
    config = {
        **CONFIG,
        "instance_group": [{"count": count, "kind": "KIND_CPU"}],
        "parameters": {"tag": {"string_value": tag}},
    }
    return {**config, "version_policy": policy} if policy else config


def _load(server: Server, config: dict) -> int:
    """RepositoryModelLoad of count_pid with ``config`` (the files on disk, untouched)."""
    return load_with(server.http_url, "count_pid", config)


def _from_files(server: Server) -> None:
    """Back to the files' config: an unload, then a load (a load alone after an override,
    the files untouched, keeps the override in 2.51)."""
    post(server.http_url, "/v2/repository/models/count_pid/unload", {})
    assert load_with(server.http_url, "count_pid") == 200


def _await_stats(server: Server, want: dict[str, int]) -> None:
    """Until count_pid's success counts per version are ``want`` (the python backend
    reports a request's statistics just after answering it)."""
    deadline = time.monotonic() + 10
    while (got := _stats(server)) != want:
        assert time.monotonic() < deadline, (got, want)
        time.sleep(0.05)


def _call(server: Server, sleep_ms: int, version: str = "") -> tuple[int, int] | str:
    """One call: (the count the answering instance read, its pid), or the error."""
    t = grpcclient.InferInput("INPUT0", [1], "INT32")
    t.set_data_from_numpy(np.array([sleep_ms], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        try:
            r = c.infer("count_pid", [t], model_version=version, client_timeout=60)
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return int(r.as_numpy("COUNT")[0]), int(r.as_numpy("PID")[0])


def _calls(server: Server, n: int, sleep_ms: int, version: str = "") -> list[tuple[int, int] | str]:
    """``n`` calls at once (each instance gets some when each call takes ``sleep_ms``)."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: _call(server, sleep_ms, version), range(n)))


def _answers(server: Server, n: int, sleep_ms: int) -> tuple[set[int], set[int]]:
    """The counts and the pids of ``n`` concurrent calls, all of which must succeed."""
    got = _calls(server, n, sleep_ms)
    failed = [a for a in got if isinstance(a, str)]
    assert failed == [], failed[:3]
    return {a[0] for a in got if isinstance(a, tuple)}, {a[1] for a in got if isinstance(a, tuple)}


def _served_count(server: Server) -> int:
    """The instance count ModelConfig answers for count_pid."""
    with grpcclient.InferenceServerClient(server.url) as c:
        config = c.get_model_config("count_pid", as_json=True)["config"]
    return sum(int(g.get("count", 1)) for g in config["instance_group"])


def _stats(server: Server) -> dict[str, int]:
    """Per version of count_pid, its success count."""
    url = f"http://{server.http_url}/v2/models/count_pid/stats"
    with urllib.request.urlopen(url) as r:
        stats = json.loads(r.read())["model_stats"]
    return {s["version"]: s["inference_stats"]["success"].get("count", 0) for s in stats}


def _ready_versions(server: Server) -> list[str]:
    url = f"http://{server.http_url}/v2/repository/index"
    req = urllib.request.Request(url, b"{}", method="POST")
    with urllib.request.urlopen(req) as r:
        index = json.loads(r.read())
    return sorted(m["version"] for m in index if m["name"] == "count_pid" and m["state"] == "READY")


def _new_pids_after_kill(server: Server, killed: int, want: int) -> set[int]:
    """Call until ``want`` pids answer, ``killed`` not among them (the instance it served
    restarted; calls that reach it dead may fail meanwhile): the counts they read."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        got = [a for a in _calls(server, 12, 100) if isinstance(a, tuple)]
        pids = {a[1] for a in got}
        if len(pids) == want and killed not in pids:
            return {a[0] for a in got}
        time.sleep(0.2)
    raise AssertionError(f"no restarted instance answered in time (last pids {pids})")


def _dead_stays_dead(server: Server, killed: int) -> None:
    """2.51 does not restart a SIGKILLed python stub: every call the instance gets fails
    INTERNAL "Stub process '<instance>' is not healthy.", the others answer (count 1)."""
    for _ in range(3):
        got = _calls(server, 12, 100)
        errors = {a for a in got if isinstance(a, str)}
        assert errors == {"StatusCode.INTERNAL: Stub process 'count_pid_0_0' is not healthy."}
        answers = {a for a in got if isinstance(a, tuple)}
        assert {a[0] for a in answers} == {1}, answers
        assert killed not in {a[1] for a in answers}, answers
        time.sleep(0.5)


def test_added_and_restarted_instances_read_the_config_of_the_last_full_load(
    servers: dict[str, Server],
) -> None:
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        try:
            assert _answers(server, 4, 50)[0] == {2}, name  # the files' config
            assert _load(server, _config(1, "regroup")) == 200, name  # a full reload
            counts, pids = _answers(server, 6, 20)
            assert counts == {1}, (name, counts)
            assert len(pids) == 1, (name, pids)
            (kept,) = pids
            assert _load(server, _config(3, "regroup")) == 200, name
            assert _served_count(server) == 3, name
            counts, pids = _answers(server, 12, 200)
            assert len(pids) == 3, (name, pids)
            assert kept in pids, (name, kept, pids)
            assert counts == {1}, (name, counts)  # NOTE: the added instances too
            os.kill(kept, signal.SIGKILL)
            if name == "triton":
                _dead_stays_dead(server, kept)
            else:  # NOTE: worker restarts are beyond Triton (docs/reliability.md)
                assert _new_pids_after_kill(server, kept, 3) == {1}, name
            assert _served_count(server) == 3, name
            assert _load(server, _config(2, "regroup")) == 200, name
            counts, pids = _answers(server, 12, 200)
            assert counts == {1}, (name, counts)
            assert _served_count(server) == 2, name
        finally:
            _from_files(server)


def test_a_version_policy_only_change_keeps_the_served_version_in_place(
    servers: dict[str, Server],
) -> None:
    both = {"specific": {"versions": [1, 2]}}
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        try:
            assert _served_count(server) == 2, name  # the files' config
            assert _load(server, _config(1, "policy")) == 200, name  # a full reload
            assert _ready_versions(server) == ["2"], name
            served = _stats(server)["2"]
            (before,) = {
                a[1] for a in _calls(server, 3, 0, "2") if isinstance(a, tuple) and a[0] == 1
            }
            _await_stats(server, {"2": served + 3})
            assert _load(server, _config(1, "policy", both)) == 200, name
            assert _ready_versions(server) == ["1", "2"], name
            assert {a for a in _calls(server, 3, 0, "2")} == {(1, before)}, name
            one = _calls(server, 2, 0, "1")
            assert all(isinstance(a, tuple) and a[1] != before for a in one), (name, one)
            _await_stats(server, {"1": 2, "2": served + 6})
            assert _load(server, _config(1, "policy", {"latest": {"num_versions": 1}})) == 200, name
            assert _ready_versions(server) == ["2"], name
            assert {a for a in _calls(server, 3, 0, "2")} == {(1, before)}, name
            _await_stats(server, {"2": served + 9})
            assert "UNAVAILABLE" in str(_calls(server, 1, 0, "1")[0]), name
        finally:
            _from_files(server)


def test_a_config_load_after_a_load_from_the_files_is_in_place_in_both(
    servers: dict[str, Server],
) -> None:
    """docs/differences.md's source-switch row holds for a model loaded at start only: once
    it was unloaded and loaded again from its files, 2.51 too updates it in place when a
    ``config`` load changes only ``instance_group`` (2 -> 1: one instance stays, and it read
    the files' count)."""
    for name, server in sorted(servers.items()):
        try:
            _from_files(server)
            counts, pids = _answers(server, 12, 200)
            assert (counts, len(pids)) == ({2}, 2), name
            one = {**CONFIG, "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
            assert _load(server, one) == 200, name
            assert _served_count(server) == 1, name
            counts, after = _answers(server, 6, 50)
            assert counts == {2}, (name, counts)
            assert len(after) == 1, (name, after)
            assert after < pids, (name, pids, after)
        finally:
            _from_files(server)
