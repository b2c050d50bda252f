"""Reloading served models in explicit model control, side by side with the real Triton 2.51.

Core ``ModelLifeCycle::AsyncLoad`` updates a served (non-ensemble) version in place when its
version directory is unmodified and its config differs at most in ``instance_group`` /
``version_policy`` (``ConfigChangeRequiresReload``): its statistics and its instances' state
(live sequences) stay. Any other change loads a new model: its statistics start again (the
Prometheus counters go on). After a load, the repository manager checks the ensembles that
call the loaded model again and unloads those that no longer validate; they come back when a
later load makes them valid. RepositoryIndex lists the repository's directories only.

Loads here go through RepositoryModelLoad's ``config`` / ``file:`` overrides, so the
repository on disk, which both servers read, never changes.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repo_control import (
    config_pbtxt,
    load_with,
    post,
    seq_sum_config,
    seq_sum_source,
)
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, side_by_side

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton

IDENT_CONFIG = {
    "backend": "python",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
}
IDENT = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""
"""ident_py and plain_py: INT32 identities."""
ENSEMBLE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "ident_py" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""
"""ident_ens: one step, ident_py."""
SEQ_CONFIG = seq_sum_config()
SEQ = seq_sum_source()
"""seq_sum: a sequence model (Oldest, numeric CORRID) that answers each sequence's running sum,
kept in its instance."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed, explicit model
    control with every model loaded."""
    repo = tmp_path_factory.mktemp("reload") / "repo"
    write_python_model(repo, "ident_py", config_pbtxt(IDENT_CONFIG), IDENT)
    write_python_model(repo, "plain_py", config_pbtxt(IDENT_CONFIG), IDENT)
    write_python_model(repo, "seq_sum", config_pbtxt(SEQ_CONFIG), SEQ)
    (repo / "ident_ens" / "1").mkdir(parents=True)
    (repo / "ident_ens" / "config.pbtxt").write_text(ENSEMBLE)
    flags = ("--model-control-mode=explicit", "--load-model=*")
    with side_by_side(repo, tmp_path_factory.mktemp("logs"), *flags) as found:
        yield found


def _post(server: Server, path: str, body: dict) -> tuple[int, str]:
    status, text = post(server.http_url, path, body)
    return status, text.decode()


def _load(server: Server, model: str, config: dict | None = None, source: str = IDENT) -> int:
    """RepositoryModelLoad of ``model``: from the repository, or with ``config`` and
    ``source`` as its 1/model.py. Returns the HTTP status."""
    return load_with(server.http_url, model, config, source if config is not None else None)


def _get(server: Server, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _index(server: Server) -> dict[str, tuple[str, str]]:
    """RepositoryIndex: model -> (state, reason)."""
    status, body = _post(server, "/v2/repository/index", {})
    assert status == 200, body
    return {m["name"]: (m.get("state", ""), m.get("reason", "")) for m in json.loads(body)}


def _ens(server: Server, rows: int) -> str:
    t = grpcclient.InferInput("IN", [rows, 2], "INT32")
    t.set_data_from_numpy(np.ones((rows, 2), np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        try:
            return str(c.infer("ident_ens", [t]).as_numpy("OUT").shape)
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"


def test_an_ensemble_that_a_composing_reload_breaks_is_unloaded(
    servers: dict[str, Server],
) -> None:
    smaller = {**IDENT_CONFIG, "max_batch_size": 4}
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        try:
            assert _ens(server, 6) == "(6, 2)", name
            assert _load(server, "ident_py", smaller) == 200, name
            assert _ens(server, 1) == (
                "StatusCode.NOT_FOUND: Request for unknown model: 'ident_ens' has no available "
                "versions"
            ), name
            assert _get(server, "/v2/models/ident_ens/ready")[0] == 400, name
            assert _index(server)["ident_ens"] == ("UNAVAILABLE", "unloaded"), name
            # a load that makes it valid again brings it back
            assert _load(server, "ident_py") == 200, name
            assert _ens(server, 6) == "(6, 2)", name
        finally:
            _load(server, "ident_py")
            _load(server, "ident_ens")


def _stats(server: Server, model: str) -> tuple[int, int, int]:
    """``model``'s inference_count and success count, and the sum of its
    ``nv_inference_count`` series."""
    status, body = _get(server, f"/v2/models/{model}/stats")
    st = json.loads(body)["model_stats"][0]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        text = r.read().decode()
    pattern = rf'^nv_inference_count\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$'
    counter = sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))
    return st["inference_count"], st["inference_stats"]["success"].get("count", 0), int(counter)


def _ident(server: Server, model: str) -> None:
    """One call of the identity ``model``, and its statistics in (the python backend
    reports them after the answer is sent)."""
    before = _stats(server, model)[1]
    t = grpcclient.InferInput("INPUT0", [1, 2], "INT32")
    t.set_data_from_numpy(np.ones((1, 2), np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        c.infer(model, [t])
    deadline = time.monotonic() + 10
    while _stats(server, model)[1] == before and time.monotonic() < deadline:
        time.sleep(0.05)


def test_an_instance_count_change_keeps_the_statistics(servers: dict[str, Server]) -> None:
    more = {**IDENT_CONFIG, "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    for name, server in servers.items():
        try:
            _ident(server, "plain_py")
            before = _stats(server, "plain_py")
            assert _load(server, "plain_py", more) == 200, name
            _ident(server, "plain_py")
            assert _stats(server, "plain_py") == tuple(v + 1 for v in before), name
        finally:
            _load(server, "plain_py")


def test_statistics_start_again_at_a_real_reload(servers: dict[str, Server]) -> None:
    changed = {**IDENT_CONFIG, "parameters": {"note": {"string_value": "changed"}}}
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        try:
            _ident(server, "plain_py")
            counter = _stats(server, "plain_py")[2]
            assert _load(server, "plain_py", changed) == 200, name
            assert _stats(server, "plain_py") == (0, 0, counter), name
            _ident(server, "plain_py")
            assert _stats(server, "plain_py") == (1, 1, counter + 1), name
        finally:
            _load(server, "plain_py")


def _seq(server: Server, value: int, **flags: object) -> str:
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[value]], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        try:
            return str(c.infer("seq_sum", [t], **flags).as_numpy("OUTPUT0").tolist())  # type: ignore[arg-type]
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"


def test_an_instance_count_change_keeps_live_sequences(servers: dict[str, Server]) -> None:
    more = {**SEQ_CONFIG, "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        try:
            assert _seq(server, 1, sequence_id=11, sequence_start=True) == "[[1]]", name
            assert _load(server, "seq_sum", more, SEQ) == 200, name
            assert _seq(server, 2, sequence_id=11) == "[[3]]", name
            assert _seq(server, 3, sequence_id=11, sequence_end=True) == "[[6]]", name
        finally:
            _load(server, "seq_sum")


def test_the_index_lists_the_repositorys_models_only(servers: dict[str, Server]) -> None:
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        try:
            assert _load(server, "made_up", IDENT_CONFIG) == 200, name
            _ident(server, "made_up")
            assert "made_up" not in _index(server), name
        finally:
            _post(server, "/v2/repository/models/made_up/unload", {})


PLUS_ONE = IDENT.replace(".as_numpy()\n", ".as_numpy() + 1\n")


def _value(server: Server, model: str) -> str:
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[5]], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        return str(c.infer(model, [t]).as_numpy("OUTPUT0").tolist())


def test_a_load_with_the_same_config_and_new_files(servers: dict[str, Server]) -> None:
    """docs/differences.md: 2.51 does not reload (ConfigChangeRequiresReload is false and
    the override's version directory reads as unmodified), so its old model.py keeps
    serving; triton-mp loads the new files."""
    assert PLUS_ONE != IDENT
    for name, server in servers.items():
        try:
            assert _value(server, "plain_py") == "[[5]]", name
            assert _load(server, "plain_py", IDENT_CONFIG, PLUS_ONE) == 200, name
            served = "[[5]]" if name == "triton" else "[[6]]"
            assert _value(server, "plain_py") == served, name
        finally:
            _load(server, "plain_py")
