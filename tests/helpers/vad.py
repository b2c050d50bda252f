"""Silero VAD helpers shared by the unit and e2e tests (not a test module).

``vad_client`` is ``examples/vad_client.py`` imported as a module. ``reference_probabilities``
runs the ONNX file directly, one stream at a time with its own state, exactly as Silero's
own ``OnnxWrapper`` feeds it: the answer the server must reproduce.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime as ort

from tests.helpers.server import REPO_ROOT


def _load_example(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # NOTE: registered before exec so dataclasses can resolve the module by name.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


vad_client = _load_example("vad_client", REPO_ROOT / "examples" / "vad_client.py")

CONTEXT_SAMPLES = 64
"""Samples of the previous chunk that Silero prepends to each 512-sample chunk."""


def onnx_session(onnx_file: Path) -> ort.InferenceSession:
    """A CPU session over the VAD's ONNX file, one thread (as the served model uses)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        str(onnx_file), sess_options=options, providers=["CPUExecutionProvider"]
    )


def reference_probabilities(session: ort.InferenceSession, audio: np.ndarray) -> np.ndarray:
    """Run one stream through the ONNX model directly, batch 1, with its own state.

    Args:
        session: from ``onnx_session``.
        audio: FP32 samples at 16 kHz, shape ``[samples]``.

    Returns:
        FP32 speech probabilities, shape ``[chunks]`` (chunks of ``vad_client.split_chunks``).
    """
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros((1, CONTEXT_SAMPLES), np.float32)
    sample_rate = np.array(vad_client.SAMPLE_RATE_HZ, np.int64)
    chunks = vad_client.split_chunks(audio)
    out = np.empty(len(chunks), np.float32)
    for i, chunk in enumerate(chunks):
        frame = np.concatenate([context, chunk[None]], axis=1)
        probability, state = session.run(
            ["output", "stateN"], {"input": frame, "state": state, "sr": sample_rate}
        )
        context = frame[:, -CONTEXT_SAMPLES:]
        out[i] = probability[0, 0]
    return out


def stream_audios(count: int, *, first_seed: int = 100) -> list[np.ndarray]:
    """``count`` different synthetic streams of different lengths (2 to 4.5 s).

    Each is speech-like audio from ``vad_client.synthesise_speech`` with its own seed, cut
    to its own length, so the streams end at different chunks.
    """
    audios = []
    for n in range(count):
        audio, _ = vad_client.synthesise_speech(first_seed + n)
        length = int((2.0 + 2.5 * n / max(1, count - 1)) * vad_client.SAMPLE_RATE_HZ)
        audios.append(audio[: length + 37 * n])  # NOTE: +37n: most end mid-chunk
    return audios
