"""Instance names after in-place ``instance_group`` count changes, side by side with 2.51.

Core's ``TritonModel::PrepareInstances`` names each instance it creates ``<group>_<c>`` and a
kept instance keeps its name, so after count 1 -> 2 -> 1 (``<group>_1`` kept) -> 2 the added
instance is ``<group>_1`` again: 2.51 serves two live instances of one name, and so does
triton-mp (what the model reads as ``args['model_instance_name']``, pinned here on both).
Our own outputs must still tell them apart: a real scrape of ``/metrics``, parsed with
prometheus_client's parser, has no two samples of one family with the same labels, and
``triton-mp stat --json`` no two instance rows of one name (docs/metrics.md, "Instance
labels").
"""

from __future__ import annotations

import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.repo_control import SEQ_START, config_pbtxt, load_with
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.stat_cli import stat_models
from tests.helpers.triton_peer import RealTriton, side_by_side

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton

CONFIG = {
    "backend": "python",
    "max_batch_size": 4,
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [
        {"name": "PID", "data_type": "TYPE_INT32", "dims": [1]},
        {"name": "NAME", "data_type": "TYPE_STRING", "dims": [1]},
    ],
    "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    "sequence_batching": {
        "max_sequence_idle_microseconds": 60000000,
        "oldest": {"max_candidate_sequences": 4},
        "control_input": [{"name": "START", "control": [SEQ_START]}],
    },
}
SOURCE = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        out = []
        for _ in requests:
            pid = pb_utils.Tensor("PID", np.array([[os.getpid()]], np.int32))
            name = pb_utils.Tensor("NAME", np.array([[self.name.encode()]], np.object_))
            out.append(pb_utils.InferenceResponse([pid, name]))
        return out
"""
"""names_py: a sequence model that answers its instance's pid and ``model_instance_name``."""

STEPS = (
    (2, ["names_py_0_0", "names_py_0_1"]),
    (1, ["names_py_0_1"]),
    (2, ["names_py_0_1"] * 2),
    (1, ["names_py_0_1"]),
    (3, ["names_py_0_1", "names_py_0_1", "names_py_0_2"]),
)
"""Count changes from the repository's 1 and the sorted names of the live instances after
each. Each count-down keeps the instance registered last: the one added by the count-up
before it (core registers a kept instance at once and a created one when it is made). The
repository starts at 1 because 2.51's python backend creates the instances of a first load
in parallel: from 2 there, a count-down kept ``<group>_0`` in some runs, ``<group>_1`` in
others."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed, explicit model
    control with names_py loaded (count 1)."""
    repo = tmp_path_factory.mktemp("names") / "repo"
    write_python_model(repo, "names_py", config_pbtxt(CONFIG), SOURCE)
    flags = ("--model-control-mode=explicit", "--load-model=*")
    with side_by_side(repo, tmp_path_factory.mktemp("logs"), *flags) as found:
        yield found


def _count(n: int) -> dict:
    return {**CONFIG, "instance_group": [{"count": n, "kind": "KIND_CPU"}]}


def _step(server: Server, sequence_id: int, **flags: object) -> tuple[int, str]:
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[1]], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        r = c.infer("names_py", [t], sequence_id=sequence_id, **flags)  # type: ignore[arg-type]
    return int(r.as_numpy("PID")[0][0]), r.as_numpy("NAME")[0][0].decode()


def _live_names(server: Server, first_id: int, count: int) -> list[str]:
    """The names of the live instances, by pid: ``4 * count`` sequences live at once fill
    every slot (4 per instance), so each instance runs one."""
    by_pid: dict[int, str] = {}
    ids = range(first_id, first_id + 4 * count)
    for s in ids:
        pid, name = _step(server, s, sequence_start=True)
        by_pid[pid] = name
    for s in ids:
        _step(server, s, sequence_end=True)
    return sorted(by_pid.values())


def _duplicates(metrics_text: str) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Samples of one name with the same labels, as Prometheus would reject them."""
    seen = Counter(
        (s.name, tuple(sorted(s.labels.items())))
        for fam in text_string_to_metric_families(metrics_text)
        for s in fam.samples
    )
    return [key for key, n in seen.items() if n > 1]


def _stat(server: ServerProcess) -> dict:
    """``triton-mp stat --json``'s names_py entry."""
    return dict(stat_models(server.url)["names_py"])


def test_a_count_change_back_up_reuses_the_kept_name_as_2_51(
    servers: dict[str, Server],
) -> None:
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        try:
            first_id = 1000
            for count, names in STEPS:
                assert load_with(server.http_url, "names_py", _count(count), SOURCE) == 200
                # NOTE: 2.51 races a removed instance's teardown (test_s18_regroup.py).
                time.sleep(1)
                first_id += 100
                got = _live_names(server, first_id, count)
                assert got == names, (name, count, got)
        finally:
            load_with(server.http_url, "names_py", _count(1), SOURCE)


def test_metrics_and_stat_tell_instances_of_one_name_apart(servers: dict[str, Server]) -> None:
    ours = servers["triton-mp"]
    assert isinstance(ours, ServerProcess)
    for count in (2, 1, 2):  # from any one instance: the second is <group>_1 twice
        assert load_with(ours.http_url, "names_py", _count(count), SOURCE) == 200
    assert _live_names(ours, 5000, 2) == ["names_py_0_1"] * 2
    with urllib.request.urlopen(f"http://127.0.0.1:{ours.metrics_port}/metrics") as r:
        text = r.read().decode()
    assert _duplicates(text) == []
    live = [
        s.labels["instance"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "triton_mp_instance_live" and s.labels["model"] == "names_py"
    ]
    assert sorted(live) == ["names_py_0_1", "names_py_0_1#2"], live
    workers = [
        s.labels["instance"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "triton_mp_process_resident_memory_bytes"
        and s.labels["instance"].startswith("names_py")
    ]
    assert sorted(workers) == ["names_py_0_1", "names_py_0_1#2"], workers
    stat = _stat(ours)
    names = [i["name"] for i in stat["instances"]]
    assert sorted(names) == ["names_py_0_1", "names_py_0_1#2"], names
    ran = {b["instance"] for b in stat["recent_batches"]}
    assert {"names_py_0_1", "names_py_0_1#2"} <= ran, ran
