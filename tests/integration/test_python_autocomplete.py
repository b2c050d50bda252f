"""Python ``auto_complete_config`` through ``model_config.loader.load_model``: the model's code
runs in a child process (``python -m triton_mp.backends.python.autocomplete``), never in this
one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from triton_mp.backends.python.autocomplete import run_auto_complete
from triton_mp.common.errors import ConfigError, ErrorCode
from triton_mp.common.json_form import config_to_json
from triton_mp.model_config.loader import load_model

pytestmark = pytest.mark.timeout(120)

COMPLETING = """
import os
import triton_python_backend_utils as pb_utils

PID = os.getpid()


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        print("this print must not corrupt the answer")
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.add_input(
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3], "optional": True}
        )
        auto_complete_model_config.add_input(
            {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [3]}
        )
        auto_complete_model_config.add_output(
            {"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": [-1]}
        )
        auto_complete_model_config.set_dynamic_batching()
        auto_complete_model_config.set_model_transaction_policy({"decoupled": False})
        return auto_complete_model_config

    def execute(self, requests):
        return []
"""


def _model(root: Path, source: str, config: str | None = None, name: str = "m") -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)
    return root / name


def test_no_config_pbtxt_is_completed_by_the_model(tmp_path: Path) -> None:
    model = load_model(_model(tmp_path, COMPLETING))
    assert model.error is None, model.error
    assert model.config is not None
    cfg = config_to_json(model.config)
    assert cfg["max_batch_size"] == 4
    assert [(i["name"], i["dims"], i["optional"]) for i in cfg["input"]] == [
        ("INPUT0", [3], True),
        ("INPUT1", [3], False),
    ]
    assert cfg["output"][0]["data_type"] == "TYPE_STRING"
    # normalised after completion, as Triton does: preferred size = max_batch_size
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [4]
    assert cfg["model_transaction_policy"] == {"decoupled": False}
    assert [g["kind"] for g in cfg["instance_group"]] == ["KIND_CPU"]


def test_partial_config_is_completed_and_kept(tmp_path: Path) -> None:
    config = 'backend: "python"\nmax_batch_size: 2\n'
    model = load_model(_model(tmp_path, COMPLETING, config))
    assert model.error is None, model.error
    assert model.config is not None
    assert model.config.max_batch_size == 2, "the config may ask for less than the model allows"
    assert [i.name for i in model.config.input] == ["INPUT0", "INPUT1"]


def test_auto_complete_off_never_runs_the_model(tmp_path: Path) -> None:
    source = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(c):
            raise RuntimeError("must not run")
    """
    config = 'backend: "python"\ninput [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    config += 'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    model = load_model(_model(tmp_path, source, config), auto_complete=False)
    assert model.error is None, model.error


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (
            """
            class TritonPythonModel:
                @staticmethod
                def auto_complete_config(c):
                    c.add_input({"name": "I", "data_type": "TYPE_FP32"})
                    return c
            """,
            "ValueError: input of model 'm' is missing property 'dims'",
        ),
        (
            """
            class TritonPythonModel:
                @staticmethod
                def auto_complete_config(c):
                    return None
            """,
            "auto_complete_config function in model 'm' must return a valid pb.ModelConfig object.",
        ),
        (
            """
            import does_not_exist
            class TritonPythonModel:
                auto_complete_config = None
            """,
            "ModuleNotFoundError",
        ),
        (
            """
            class TritonPythonModel:
                @staticmethod
                def auto_complete_config(c):
                    c.as_dict()["input"] = [{"name": "I", "data_type": "TYPE_NOPE", "dims": [1]}]
                    return c
            """,
            "auto_complete_config returned an invalid model configuration",
        ),
    ],
)
def test_failures_make_the_model_unavailable_with_the_reason(
    tmp_path: Path, source: str, reason: str
) -> None:
    model = load_model(_model(tmp_path, source))
    assert model.error is not None
    assert reason in model.error
    assert model.versions == ()
    if "returned an invalid model configuration" in reason:
        assert "failed to load 'm'" in model.error
        assert model.failed_versions == ()
    else:  # NOTE: the model's code failed: 2.51's stub fails the version, INTERNAL
        assert (model.failed_versions, model.error_code) == ((1,), ErrorCode.INTERNAL)


def test_a_hanging_model_times_out(tmp_path: Path) -> None:
    source = """
    import time
    time.sleep(60)
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(c):
            return c
    """
    d = _model(tmp_path, source)
    with pytest.raises(ConfigError, match="did not finish within 1 s"):
        run_auto_complete({"name": "m"}, d / "1" / "model.py", "m", timeout_s=1)


def test_an_inherited_hook_runs(tmp_path: Path) -> None:
    d = _model(tmp_path, "from base import Base\n\nclass TritonPythonModel(Base):\n    pass\n")
    (d / "1" / "base.py").write_text(
        "class Base:\n    @staticmethod\n    def auto_complete_config(c):\n"
        "        c.set_max_batch_size(3)\n        return c\n"
    )
    completed = run_auto_complete({"name": "m", "max_batch_size": 0}, d / "1" / "model.py", "m")
    assert completed == {"name": "m", "max_batch_size": 3}


def test_a_base_class_without_the_hook_leaves_the_config(tmp_path: Path) -> None:
    d = _model(tmp_path, "class Base:\n    pass\n\nclass TritonPythonModel(Base):\n    pass\n")
    assert run_auto_complete({"name": "m"}, d / "1" / "model.py", "m") is None
