"""Model repositories for tests: a python model written from source, copies of the project's
models (their wheel-shipped files put in place first)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from tests.helpers.server import PROJECT_REPOSITORY
from triton_mp.cli.assets import (
    REC_BLS_MODEL_NAME,
    VAD_MODEL_NAME,
    materialise_ocr_models,
    materialise_rec_dictionary,
    materialise_vad_model,
)
from triton_mp.common.errors import TritonMPError


def write_python_model(repo: Path, name: str, config: str | None, source: str) -> Path:
    """Write a python-backend model into ``repo``: ``<name>/1/model.py`` from ``source`` and,
    unless ``config`` is None (auto-completed), ``<name>/config.pbtxt``; both are dedented.
    Returns the model's directory."""
    (repo / name / "1").mkdir(parents=True)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))
    return repo / name


def copy_models(dest: Path, *names: str) -> Path:
    """Copy models of the project's repository into ``dest`` (a new repository).

    The wheel-shipped ONNX files of the OCR models and of ``silero_vad`` (and the
    recogniser's dictionary for ``ocr_rec_bls``) are materialised first; the test is skipped
    when the package that ships them is absent.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if any(n.startswith("ocr_") for n in names):
        try:
            materialise_ocr_models(PROJECT_REPOSITORY)
            if REC_BLS_MODEL_NAME in names:
                materialise_rec_dictionary(PROJECT_REPOSITORY)
        except TritonMPError as e:
            pytest.skip(f"the OCR models are not available: {e.message}")
    if VAD_MODEL_NAME in names:
        try:
            materialise_vad_model(PROJECT_REPOSITORY)
        except TritonMPError as e:
            pytest.skip(f"the Silero VAD model is not available: {e.message}")
    for name in names:
        shutil.copytree(PROJECT_REPOSITORY / name, dest / name)
    return dest


BYTES_PY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [
  { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "LENGTH" data_type: TYPE_INT32 dims: [ -1 ] }
]
"""
BYTES_PY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            assert text.dtype == np.object_
            upper = np.array([t.upper() for t in text], dtype=np.object_)
            length = np.array([len(t) for t in text], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTH", length)]
                )
            )
        return responses
"""
"""bytes_py: BYTES in (TEXT) and out (UPPER, its strings upper-cased; LENGTH, INT32 lengths)."""

IDENTITY_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t.as_numpy())]))
        return out
"""
"""A python model that answers each request's INPUT0 as OUTPUT0 (any datatype and shape)."""

FP32_PAIR_CONFIG = """
name: "m"
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ], optional: true }
]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
"""
"""Model ``m`` for ``IDENTITY_PY``: INPUT0 FP32 [4], optional INPUT1 FP32 [4], OUTPUT0 FP32 [4],
no batching (the side-by-side message tests send both servers the same repository)."""
