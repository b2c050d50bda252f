"""A load whose output label file cannot be used, side by side with the real Triton 2.51
(python backend) on the session's shared pair.

2.51 reads an output's ``label_filename`` while it creates each version (core ``Model::Init``,
``LabelProvider::AddLabels``), so a file that cannot be read fails each version the policy
chose, as the other per-version checks (tests/e2e/test_r16_version_checks.py): the load
answers HTTP 400 "load failed for model '<m>': version <v> is at UNAVAILABLE state:
Internal: failed to open text file for read <path>: <strerror>;" and a newline, and
RepositoryIndex lists the version UNAVAILABLE with the reason "Internal: ...". triton-mp
failed the load before choosing versions: the bare message, and the index listed the model
without a version. A path outside the model directory is refused the same way, UNSUPPORTED.

And a difference kept: a python model version without its ``model.py`` (2.51 never answers
the load).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.repo_control import post_json
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, serve_models

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
SIDE_BY_SIDE_MODELS = {"r22_labels": PythonModel(CONFIG)}
"""r22_labels: INPUT0 FP32 [-1] answered as OUTPUT0, no batching, no labels (tests/e2e/
conftest.py's ``shared_side_by_side`` serves it)."""

Server = ServerProcess | RealTriton


def _config(label_filename: str) -> str:
    return json.dumps(
        {
            "name": "r22_labels",
            "backend": "python",
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [
                {
                    "name": "OUTPUT0",
                    "data_type": "TYPE_FP32",
                    "dims": [-1],
                    "label_filename": label_filename,
                }
            ],
        }
    )


def _post(server: Server, path: str, body: object, timeout_s: float = 120) -> tuple[int, object]:
    return post_json(server.http_url, path, body, timeout_s)


def _load(server: Server, config: str | None = None) -> tuple[int, object]:
    body = {"parameters": {"config": config}} if config is not None else {}
    return _post(server, "/v2/repository/models/r22_labels/load", body)


def _rows_of(server: Server, model: str) -> list[dict[str, str]]:
    status, rows = _post(server, "/v2/repository/index", {})
    assert status == 200
    assert isinstance(rows, list)
    return [r for r in rows if r["name"] == model]


def _rows(server: Server) -> list[dict[str, str]]:
    return _rows_of(server, "r22_labels")


@pytest.mark.parametrize(
    ("label_filename", "why"),
    [
        (
            "nope.txt",
            "Internal: failed to open text file for read {dir}/nope.txt: No such file or directory",
        ),
        (
            "../outside.txt",
            "Unsupported: label file path '{dir}/../outside.txt' for output 'OUTPUT0' in "
            "model 'r22_labels' is outside model directory",
        ),
    ],
    ids=["missing", "outside"],
)
def test_a_label_file_that_cannot_be_used_fails_each_version(
    shared_side_by_side: dict[str, Server], label_filename: str, why: str
) -> None:
    """A path outside the model directory is refused as upstream main refuses it (core
    ``Model::Init``'s check, docs/differences.md); 2.51 tries to open it."""
    ours = shared_side_by_side["triton-mp"]
    assert isinstance(ours, ServerProcess)
    folder = ours.repository / "r22_labels"
    ready = [{"name": "r22_labels", "version": "1", "state": "READY"}]
    for name, server in sorted(shared_side_by_side.items()):  # Triton first
        said = why
        if name == "triton" and label_filename.startswith(".."):
            said = f"Internal: failed to open text file for read {{dir}}/{label_filename}: "
            said += "No such file or directory"
        said = said.format(dir=folder)
        answer = f"load failed for model 'r22_labels': version 1 is at UNAVAILABLE state: {said};\n"
        try:
            # Served: the load fails, version 1 goes on serving.
            assert _load(server, _config(label_filename)) == (400, {"error": answer}), name
            assert _rows(server) == ready, name
            # Not served: version 1 is listed UNAVAILABLE with Triton's reason.
            assert _post(server, "/v2/repository/models/r22_labels/unload", {})[0] == 200
            assert _load(server, _config(label_filename)) == (400, {"error": answer}), name
            assert _rows(server) == [
                {"name": "r22_labels", "version": "1", "state": "UNAVAILABLE", "reason": said}
            ], name
        finally:
            assert _load(server) == (200, None), name
        assert _rows(server) == ready, name


NO_FILE_CONFIG = """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def test_a_python_version_without_its_model_file(tmp_path: Path) -> None:
    """docs/differences.md: 2.51's load of a python model whose version directory has no
    ``model.py`` never answers (its stub fails to preinitialize and the version stays
    LOADING); triton-mp refuses it, naming the missing file, and lists it UNAVAILABLE. Its
    own pair: the shared 2.51 would keep the hung load."""
    with serve_models(
        {"r22_other": PythonModel(CONFIG)}, tmp_path, "--model-control-mode=explicit"
    ) as servers:
        ours = servers["triton-mp"]
        assert isinstance(ours, ServerProcess)
        folder = ours.repository / "r22_nofile"
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(NO_FILE_CONFIG)
        why = (
            "failed to load 'r22_nofile', no version is available: version 1: unable to find "
            f"'{folder / '1' / 'model.py'}'"
        )
        assert _post(ours, "/v2/repository/models/r22_nofile/load", {}) == (400, {"error": why})
        assert _rows_of(ours, "r22_nofile") == [
            {"name": "r22_nofile", "state": "UNAVAILABLE", "reason": why}
        ]
        theirs = servers.get("triton")
        if theirs is None:
            return
        assert isinstance(theirs, RealTriton)
        with pytest.raises(TimeoutError):
            _post(theirs, "/v2/repository/models/r22_nofile/load", {}, timeout_s=3)
        assert _rows_of(theirs, "r22_nofile") == [
            {"name": "r22_nofile", "version": "1", "state": "LOADING"}
        ]
        assert (
            "Failed to preinitialize Python stub: Python model file not found in "
            f"'{folder / '1' / 'model.py'}'"
        ) in theirs.log()
