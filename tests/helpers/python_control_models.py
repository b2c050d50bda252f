"""Python models that load, unload and query other models from ``execute`` (not a test module).

Served by ``tests/e2e/test_python_model_control.py`` to triton-mp and the real Triton 2.51
(``CONTROL_MODELS``), written with ``tests.helpers.python_api_models.write_api_models``.
Split from ``python_api_models`` (one concept per module).
"""

from __future__ import annotations

CTL_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "ACTION" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "TARGET" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "ARG" data_type: TYPE_STRING dims: [ 1 ] }
]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
CTL_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def run(action, target, arg):
    if action == "load":
        return pb_utils.load_model(target)
    if action == "load_config":
        return pb_utils.load_model(target, config=arg)
    if action == "load_files":
        files = {"file:1/model.py": arg.encode()}
        return pb_utils.load_model(target, config=TARGET_JSON, files=files)
    if action == "load_files_noconfig":
        return pb_utils.load_model(target, files={"file:1/model.py": b"x"})
    if action == "load_bad_files":
        return pb_utils.load_model(target, config=TARGET_JSON, files=["file:1/model.py"])
    if action == "unload":
        return pb_utils.unload_model(target)
    if action == "ready":
        return pb_utils.is_model_ready(target, arg)
    raise ValueError(action)


TARGET_JSON = (
    '{"backend": "python", "max_batch_size": 0,'
    ' "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],'
    ' "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}'
)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action, target, arg = (
                pb_utils.get_input_tensor_by_name(request, n).as_numpy()[0].decode()
                for n in ("ACTION", "TARGET", "ARG")
            )
            try:
                text = repr(run(action, target, arg))
            except Exception as e:
                text = type(e).__name__ + ": " + str(e)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("RESULT", np.array([text.encode()], np.object_))]))
        return responses
"""
"""Calls ``pb_utils.load_model`` / ``unload_model`` / ``is_model_ready`` on TARGET as ACTION
says (ARG: a JSON config, a model.py source, or a version) and answers the call's result
(``repr``) or ``"<exception class>: <message>"``."""

TARGET_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
TARGET_MODEL = """
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]

    def is_ready(self):
        return not os.path.exists(os.path.join(self.dir, "not_ready"))

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests
        ]
"""
"""``OUTPUT0 = 2 * INPUT0``; ``is_ready()`` is False while ``<model dir>/not_ready`` exists."""

INIT_LOADER_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # The README's "Model Loading API" example: load what execute calls
        if not pb_utils.is_model_ready(model_name="target_py", model_version="1"):
            pb_utils.load_model(model_name="target_py")

    def execute(self, requests):
        responses = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="target_py", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")],
            ).exec()
            responses.append(answer)
        return responses
"""
"""Loads ``target_py`` from ``initialize`` (when not ready) and answers through it."""

CONTROL_MODELS: dict[str, tuple[str, str]] = {
    "ctl_py": (CTL_CONFIG, CTL_MODEL),
    "target_py": (TARGET_CONFIG, TARGET_MODEL),
    "init_loader_py": (TARGET_CONFIG, INIT_LOADER_MODEL),
}
"""The models of ``test_python_model_control``."""
