"""End to end: the Silero VAD on a running server, eight audio streams at once.

One server for the module serves the project's ``silero_vad`` (a python model over Silero's
ONNX file, sequence batching with the Oldest strategy). Eight synthetic speech-like streams
of different lengths run as eight sequences at the same time, through tritonclient: with
plain ``infer`` calls from eight threads, and interleaved over one ModelStreamInfer stream.
Each stream's probabilities must equal running the ONNX model on that stream alone (batch 1,
its own state), although the server batches the streams' chunks into shared onnxruntime
calls. Skipped when the ``silero-vad`` package is absent.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repos import copy_models
from tests.helpers.server import PROJECT_REPOSITORY, REPO_ROOT, ServerProcess, server_factory
from tests.helpers.vad import onnx_session, reference_probabilities, stream_audios, vad_client
from triton_mp.cli import assets

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODEL = assets.VAD_MODEL_NAME
ATOL = 1e-6
"""Tolerance against the direct run (batched and batch-1 runs agree to the bit here)."""
"""What a server without streaming answers (until it is served)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = copy_models(tmp_path_factory.mktemp("repo"), MODEL)
    with server_factory(Path(tmp_path_factory.mktemp("logs"))) as start:
        yield start(repo)


@pytest.fixture(scope="module")
def streams() -> dict[int | str, np.ndarray]:
    """Eight streams keyed by correlation ID: six integers and two strings."""
    ids: list[int | str] = [11, 12, 13, "mic-a", 15, 16, "mic-b", 2**40 + 3]
    return dict(zip(ids, stream_audios(len(ids)), strict=True))


@pytest.fixture(scope="module")
def expected(
    server: ServerProcess, streams: dict[int | str, np.ndarray]
) -> dict[int | str, np.ndarray]:
    """Each stream run alone through the same ONNX file (``server`` has materialised it)."""
    session = onnx_session(PROJECT_REPOSITORY / MODEL / "1" / assets.VAD_MODEL_FILE)
    return {cid: reference_probabilities(session, audio) for cid, audio in streams.items()}


def _compare(
    got: dict[int | str, np.ndarray], expected: dict[int | str, np.ndarray], how: str
) -> None:
    assert set(got) == set(expected)
    diff = max(float(np.abs(got[c] - expected[c]).max()) for c in expected)
    chunks = sum(len(e) for e in expected.values())
    print(f"{how}: {len(expected)} streams, {chunks} chunks, max abs diff {diff:.3g}")
    for cid in expected:
        np.testing.assert_allclose(got[cid], expected[cid], rtol=0, atol=ATOL, err_msg=str(cid))


def test_eight_concurrent_infer_streams_each_equal_the_onnx_model_alone(
    server: ServerProcess,
    streams: dict[int | str, np.ndarray],
    expected: dict[int | str, np.ndarray],
) -> None:
    ready = threading.Barrier(len(streams))

    def run(cid: int | str) -> np.ndarray:
        with grpcclient.InferenceServerClient(server.url) as client:
            ready.wait(timeout=60)
            return vad_client.infer_probabilities(client, streams[cid], cid, MODEL)

    with ThreadPoolExecutor(max_workers=len(streams)) as pool:
        got = dict(zip(streams, pool.map(run, streams), strict=True))
    _compare(got, expected, "infer")

    with grpcclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics(MODEL, as_json=True)
        # NOTE: a correlation ID whose sequence ended starts afresh with its next START.
        first = next(iter(streams))
        again = vad_client.infer_probabilities(client, streams[first], first, MODEL)
    np.testing.assert_allclose(again, expected[first], rtol=0, atol=ATOL)
    (model_stats,) = stats["model_stats"]
    sizes = {
        int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in model_stats["batch_stats"]
    }
    print(f"executions per batch size: {dict(sorted(sizes.items()))}")
    assert sum(size * count for size, count in sizes.items()) == sum(
        len(e) for e in expected.values()
    )
    assert max(sizes) > 1, "the streams' chunks shared onnxruntime calls"


def test_eight_sequences_interleaved_on_one_grpc_stream(
    server: ServerProcess,
    streams: dict[int | str, np.ndarray],
    expected: dict[int | str, np.ndarray],
) -> None:
    # the IDs differ from the other test's, so a sequence of it still idling there cannot clash
    renamed = {f"stream-{cid}": audio for cid, audio in streams.items()}
    with grpcclient.InferenceServerClient(server.url) as client:
        got = vad_client.stream_probabilities(client, renamed, MODEL, window=4)
    _compare({cid: got[f"stream-{cid}"] for cid in streams}, expected, "one stream, interleaved")


@pytest.mark.parametrize("mode", ["infer", "stream"])
def test_the_client_prints_where_the_speech_is(
    server: ServerProcess, tmp_path: Path, mode: str
) -> None:
    wav = tmp_path / "demo.wav"
    assert vad_client.main(["--synthesise", str(wav), "--seed", "0"]) == 0
    _, utterances = vad_client.synthesise_speech(0)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")) if p
    )
    args = [
        sys.executable,
        str(REPO_ROOT / "examples" / "vad_client.py"),
        str(wav),
        "--url",
        server.url,
    ]
    out = subprocess.run(
        [*args, *(["--stream"] if mode == "stream" else [])],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    found = [
        (float(m[1]), float(m[2]))
        for m in re.finditer(r"speech\s+([\d.]+) s -\s+([\d.]+) s", out.stdout)
    ]
    assert len(found) == len(utterances), out.stdout
    for (start_s, end_s), utterance in zip(found, utterances, strict=True):
        assert abs(start_s - utterance.start_s) < 0.3, out.stdout
        assert abs(end_s - utterance.end_s) < 0.3, out.stdout
