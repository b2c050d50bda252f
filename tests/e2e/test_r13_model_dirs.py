"""Loading a model directory that has a config but no version directory, side by side with
the real Triton 2.51 (explicit model control).

Core ``ModelLifeCycle::AsyncLoad`` finds no version under the model's version policy and
refuses it, INVALID_ARG "at least one version must be available under the version policy of
model '<m>'", which the repository manager answers as "load failed for model '<m>': <that>"
and a newline (HTTP 400).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, side_by_side

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, ServerProcess | RealTriton]]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed; explicit model
    control, nothing loaded; ``no_versions`` has its config.pbtxt and no version directory."""
    repo = tmp_path_factory.mktemp("model_dirs") / "repo"
    (repo / "no_versions").mkdir(parents=True)
    (repo / "no_versions" / "config.pbtxt").write_text(CONFIG)
    logs = tmp_path_factory.mktemp("logs")
    with side_by_side(repo, logs, "--model-control-mode=explicit") as found:
        yield found


def _load(server: ServerProcess | RealTriton, model: str) -> tuple[int, str]:
    url = f"http://{server.http_url}/v2/repository/models/{model}/load"
    req = urllib.request.Request(url, data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())["error"]


def test_a_model_without_versions_is_refused_in_tritons_words(
    servers: dict[str, ServerProcess | RealTriton],
) -> None:
    expected = (
        400,
        "load failed for model 'no_versions': at least one version must be available under "
        "the version policy of model 'no_versions'\n",
    )
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        assert _load(server, "no_versions") == expected, name
