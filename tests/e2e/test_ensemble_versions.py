"""An ensemble step whose ``model_version`` is omitted, side by side with the real Triton 2.51.

The field is an ``int64`` whose proto default is 0, and Triton takes 0 as a version like any
other (``model_repository_manager.cc`` ``CheckNode``: only -1 means "latest"). So with a
composing model that has version 1 only, the ensemble fails to load ("... whose required
version 0 is not loaded."; a load answers "load failed for model '<e>': <why>" and a
newline), while a composing model with a version directory ``0`` serves it.

- ``scale_py`` (version 1) and ``zero_py`` (version 0): ``OUT = 2 * IN``.
- ``nover_ens`` -> ``scale_py`` and ``zero_ens`` -> ``zero_py``, neither naming a version.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import REPO_ROOT, ServerProcess
from tests.helpers.triton_peer import start_triton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SCALE = REPO_ROOT / "tests" / "ensemble_models" / "scale_py"

ENSEMBLE = """
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{
  step [
    {{
      model_name: "{model}"
      input_map {{ key: "IN" value: "INPUT0" }}
      output_map {{ key: "OUT" value: "OUTPUT0" }}
    }}
  ]
}}
"""

REFUSED = (
    "load failed for model 'nover_ens': ensemble 'nover_ens' depends on 'scale_py' whose "
    "required version 0 is not loaded.\n"
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("versions") / "repo"
    shutil.copytree(SCALE, root / "scale_py")
    shutil.copytree(SCALE, root / "zero_py")
    (root / "zero_py" / "1").rename(root / "zero_py" / "0")
    config = root / "zero_py" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "scale_py"', 'name: "zero_py"'))
    for name, model in (("nover_ens", "scale_py"), ("zero_ens", "zero_py")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(ENSEMBLE.format(name=name, model=model))
    return root


def _scenario(url: str) -> list[object]:
    """Load both ensembles (explicit mode) and call them: what each step answered."""
    client = grpcclient.InferenceServerClient(url)
    x = np.array([[1, 2, 3, 4]], np.float32)
    out: list[object] = []
    try:
        for name in ("nover_ens", "zero_ens"):
            try:
                client.load_model(name)
                out.append((name, "loaded", client.is_model_ready(name)))
            except InferenceServerException as e:
                out.append((name, e.status(), e.message()))
        t = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        out.append(client.infer("zero_ens", [t]).as_numpy("OUTPUT0").tolist())
        index = {m.name: m for m in client.get_model_repository_index().models}
        out.append((index["zero_py"].version, index["zero_py"].state))
        return out
    finally:
        client.close()


EXPECTED = [
    ("nover_ens", "StatusCode.INVALID_ARGUMENT", REFUSED),
    ("zero_ens", "loaded", True),
    [[2.0, 4.0, 6.0, 8.0]],
    ("0", "READY"),
]


def test_an_omitted_step_version_is_version_0_as_in_triton(
    repo: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(repo, "--model-control-mode=explicit")
    assert _scenario(server.url) == EXPECTED


def test_the_real_triton_does_the_same(repo: Path, tmp_path: Path) -> None:
    with start_triton(repo, tmp_path / "triton.log", "--model-control-mode=explicit") as peer:
        assert _scenario(peer.url) == EXPECTED, peer.log()[-2000:]
