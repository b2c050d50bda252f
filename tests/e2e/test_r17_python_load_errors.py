"""A python model whose own code fails its load, side by side with the real Triton 2.51: the
load's answer and the repository index's reason, in the stub's words.

2.51's stub imports ``<version>/<file>`` as the module ``<version>.<file stem>``, takes its
``TritonPythonModel``, runs ``auto_complete_config`` (in a stub of its own), then constructs
the class and calls ``initialize``. Whatever fails there fails the version, INTERNAL, worded
by pybind11's ``error_already_set::what()``: "<Type>: <message>", then "\n\nAt:\n" and the
frames from the innermost Python frame outwards (an import's include the import system's
frozen frames, whose line numbers depend on the Python build: they are compared without
them); core answers the load "load failed for model '<m>': version 1 is at UNAVAILABLE
state: Internal: <that>;\n".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, serve_models

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

MODELS = {
    "no_class": PythonModel(CONFIG, "class SomethingElse:\n    pass\n"),
    "other_file": PythonModel(
        CONFIG + 'default_model_filename: "other.py"\n',
        "x = 1\n",
        (("1/other.py", "class NotIt:\n    pass\n"),),
    ),
    "not_callable": PythonModel(CONFIG, "TritonPythonModel = 5\n"),
    "syntax_error": PythonModel(CONFIG, "def broken(:\n"),
    "raises_at_import": PythonModel(
        CONFIG, 'raise ValueError("at import")\nclass TritonPythonModel:\n    pass\n'
    ),
    "raises_in_initialize": PythonModel(
        CONFIG,
        "def helper():\n"
        '    raise RuntimeError("weights missing")\n'
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        helper()\n"
        "    def execute(self, requests):\n"
        "        return []\n",
    ),
    "raises_in_auto_complete": PythonModel(
        CONFIG,
        "class TritonPythonModel:\n"
        "    @staticmethod\n"
        "    def auto_complete_config(config):\n"
        '        raise KeyError("dims")\n',
    ),
    "auto_complete_returns_none": PythonModel(
        CONFIG,
        "class TritonPythonModel:\n"
        "    @staticmethod\n"
        "    def auto_complete_config(config):\n"
        "        return None\n",
    ),
}
"""Models whose code fails their load in each of the stub's steps (``other_file``: its
``default_model_filename`` names the module)."""

_FROZEN_LINE = re.compile(r"(<frozen [^>]*>)\(\d+\)")


def _load(url: str, model: str) -> str:
    """The load's refusal, its status and message, frozen frames' line numbers left out."""
    with grpcclient.InferenceServerClient(url) as c:
        try:
            c.load_model(model)
        except InferenceServerException as e:
            return _FROZEN_LINE.sub(r"\1", f"{e.status()}: {e.message()}")
    return "loaded"


def _expected(repo: Path) -> dict[str, str]:
    """The stub's words for each model of ``MODELS`` in ``repo``."""
    at = "\n\nAt:\n"
    frozen = (
        "  <frozen importlib._bootstrap>: _call_with_frames_removed\n"
        "  <frozen importlib._bootstrap_external>: exec_module\n"
        "  <frozen importlib._bootstrap>: _load_unlocked\n"
        "  <frozen importlib._bootstrap>: _find_and_load_unlocked\n"
        "  <frozen importlib._bootstrap>: _find_and_load\n"
    )
    py = {m: repo / m / "1" / "model.py" for m in MODELS}
    return {
        "no_class": "AttributeError: module '1.model' has no attribute 'TritonPythonModel'",
        "other_file": "AttributeError: module '1.other' has no attribute 'TritonPythonModel'",
        "not_callable": "TypeError: 'int' object is not callable",
        "syntax_error": "SyntaxError: invalid syntax (model.py, line 1)",
        "raises_at_import": (
            f"ValueError: at import{at}  {py['raises_at_import']}(1): <module>\n{frozen}"
        ),
        "raises_in_initialize": (
            f"RuntimeError: weights missing{at}  {py['raises_in_initialize']}(2): helper\n"
            f"  {py['raises_in_initialize']}(5): initialize\n"
        ),
        "raises_in_auto_complete": (
            f"KeyError: 'dims'{at}  {py['raises_in_auto_complete']}(4): auto_complete_config\n"
        ),
        "auto_complete_returns_none": "auto_complete_config function in model "
        "'auto_complete_returns_none' must return a valid pb.ModelConfig object.",
    }


NO_EXECUTE = PythonModel(CONFIG, "class TritonPythonModel:\n    pass\n")
"""A model whose class defines no ``execute``: 2.51 loads it and fails each batch."""


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, dict[str, ServerProcess | RealTriton]]]:
    """Both servers on ``MODELS`` and ``no_execute``, in explicit mode, nothing loaded."""
    work = tmp_path_factory.mktemp("r17_load_errors")
    models = {**MODELS, "no_execute": NO_EXECUTE}
    with serve_models(models, work, "--model-control-mode=explicit") as found:
        yield work / "repo", found


def test_a_model_whose_code_fails_its_load_is_answered_in_the_stubs_words(
    servers: tuple[Path, dict[str, ServerProcess | RealTriton]],
) -> None:
    repo, found = servers
    expected = _expected(repo)
    for name, server in found.items():
        for model, why in expected.items():
            answer = _load(server.url, model)
            assert answer == (
                f"StatusCode.INVALID_ARGUMENT: load failed for model '{model}': version 1 "
                f"is at UNAVAILABLE state: Internal: {why};\n"
            ), (name, model)
        with grpcclient.InferenceServerClient(server.url) as c:
            index = {m.name: m for m in c.get_model_repository_index().models}
        for model, why in expected.items():
            entry = index[model]
            reason = _FROZEN_LINE.sub(r"\1", entry.reason)
            assert (entry.version, entry.state, reason) == (
                "1",
                "UNAVAILABLE",
                f"Internal: {why}",
            ), (name, model)


def test_a_model_without_execute_loads_and_fails_each_request(
    servers: tuple[Path, dict[str, ServerProcess | RealTriton]],
) -> None:
    repo, found = servers
    t = grpcclient.InferInput("INPUT0", [4], "FP32")
    t.set_data_from_numpy(np.zeros(4, np.float32))
    model_file = repo / "no_execute" / "1" / "model.py"
    for name, server in found.items():
        with grpcclient.InferenceServerClient(server.url) as c:
            c.load_model("no_execute")
            instance = c.get_model_config("no_execute").config.instance_group[0].name
            for _ in range(2):
                with pytest.raises(InferenceServerException) as e:
                    c.infer("no_execute", [t])
                assert (e.value.status(), e.value.message()) == (
                    "StatusCode.INTERNAL",
                    f"Failed to process the request(s) for model '{instance}_0', message: "
                    f"Python model {model_file} does not implement `execute` method.",
                ), name
