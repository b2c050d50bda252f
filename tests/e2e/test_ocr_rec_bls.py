"""End to end: ``model_repository/ocr_rec_bls`` reads rendered text lines through BLS.

One server with ``ocr_rec`` (ONNX) and ``ocr_rec_bls`` (python, calls ``ocr_rec`` with
``async_exec`` and CTC-decodes its output). Text lines rendered in several fonts go in through
tritonclient as UINT8 images; the text that comes back must be the rendered string and the
same text and score as the recogniser run in-process on onnxruntime with the example client's
preprocessing and decoding (``examples/ocr_client.py``), whose dictionary is read from the ONNX
file's metadata, not from the ``ppocr_keys.txt`` the model reads. A bad image shape fails only
its request, with INVALID_ARG from the BLS model, and the server keeps serving.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers import ocr_images
from tests.helpers.repos import copy_models
from tests.helpers.server import REPO_ROOT, ServerProcess, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

MODEL = "ocr_rec_bls"
LINES = [
    ("pillow-default", 40, "Hello World"),
    ("DejaVuSans", 36, "The quick brown fox jumps"),
    ("DejaVuSerif", 48, "Dynamic batching of requests"),
    ("DejaVuSansMono", 40, "Inference Server 2026"),
    ("DejaVuSans-Bold", 32, "over the lazy dog"),
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_models(tmp_path_factory.mktemp("repo"), "ocr_rec", MODEL)


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def ocr_client() -> ModuleType:
    sys.path.insert(0, str(REPO_ROOT / "examples"))
    try:
        import ocr_client
    finally:
        sys.path.remove(str(REPO_ROOT / "examples"))
    return ocr_client


@pytest.fixture(scope="module")
def reference(repo: Path, ocr_client: ModuleType) -> Any:
    """``read(lines_bgr) -> [(text, score)]``: the recogniser on onnxruntime, in-process."""
    import onnxruntime as ort

    model_file = repo / "ocr_rec" / "1" / "model.onnx"
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    characters = ocr_client.load_rec_characters(model_file)

    def read(lines: list[np.ndarray]) -> list[tuple[str, float]]:
        batch = ocr_client.rec_preprocess(lines)
        probs = session.run([ocr_client.REC_OUTPUT], {ocr_client.REC_INPUT: batch})[0]
        return list(ocr_client.ctc_greedy_decode(probs, characters))

    return read


def _line(font_name: str, size: int, text: str) -> np.ndarray:
    font = ocr_images.find_font(font_name)
    if font is None:
        pytest.skip(f"font {font_name} needs matplotlib's .ttf files")
    image = ocr_images.render_text_image([text], font.path, size, margin=size // 4)
    return ocr_images.to_bgr(image)


def _infer(
    client: grpcclient.InferenceServerClient, images: np.ndarray
) -> tuple[list[str], np.ndarray]:
    inp = grpcclient.InferInput("IMAGE", list(images.shape), "UINT8")
    inp.set_data_from_numpy(images)
    result = client.infer(MODEL, [inp])
    text = result.as_numpy("TEXT")
    score = result.as_numpy("SCORE")
    assert text is not None
    assert score is not None
    assert text.shape == (images.shape[0], 1)
    assert score.shape == (images.shape[0], 1)
    return [t.decode("utf-8") for t in text[:, 0]], score[:, 0]


@pytest.mark.parametrize(("font_name", "size", "text"), LINES, ids=[c[0] for c in LINES])
def test_reads_the_rendered_line_as_onnxruntime_does(
    client: grpcclient.InferenceServerClient,
    reference: Any,
    font_name: str,
    size: int,
    text: str,
) -> None:
    line = _line(font_name, size, text)
    texts, scores = _infer(client, line[np.newaxis])
    [(want_text, want_score)] = reference([line])
    assert texts == [want_text]
    assert scores[0] == pytest.approx(want_score, abs=1e-4)
    # NOTE: the white margin may read as a leading or trailing space, as in PaddleOCR.
    assert texts[0].strip() == text
    assert 0.5 < scores[0] <= 1.0


def test_a_request_of_several_lines_and_concurrent_requests(
    client: grpcclient.InferenceServerClient, server: ServerProcess, reference: Any
) -> None:
    # NOTE: one request carries lines of one size: lines of one font, each padded with white
    # to the largest (a few pixels in height, where descenders differ).
    lines = [_line("DejaVuSans", 36, t) for _, _, t in LINES]
    height = max(x.shape[0] for x in lines)
    width = max(x.shape[1] for x in lines)
    padded = np.full((len(lines), height, width, 3), 255, dtype=np.uint8)
    for i, x in enumerate(lines):
        padded[i, : x.shape[0], : x.shape[1]] = x
    texts, scores = _infer(client, padded)
    want = reference(list(padded))
    assert texts == [t for t, _ in want]
    assert [t.strip() for t in texts] == [t for _, _, t in LINES]
    np.testing.assert_allclose(scores, [s for _, s in want], atol=1e-4)

    # Many clients at once: the BLS model's batches hold several requests, each fanned out to
    # ocr_rec with async_exec; every answer must still be its own line's text.
    def one(i: int) -> str:
        with grpcclient.InferenceServerClient(server.url) as c:
            got, _ = _infer(c, lines[i % len(lines)][np.newaxis])
            return got[0].strip()

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(24)))
    assert got == [LINES[i % len(LINES)][2] for i in range(24)]


def test_grey_lines_read_as_their_bgr_copy(client: grpcclient.InferenceServerClient) -> None:
    line = _line("DejaVuSans", 36, "The quick brown fox jumps")
    grey = line[:, :, :1]
    assert _infer(client, grey[np.newaxis]) == _infer(
        client, np.repeat(grey, 3, axis=2)[np.newaxis]
    )


def test_bad_image_shape_fails_its_request_and_the_server_keeps_serving(
    client: grpcclient.InferenceServerClient, server: ServerProcess
) -> None:
    line = _line("pillow-default", 40, "Hello World")
    rgba = np.concatenate([line, np.full(line.shape[:2] + (1,), 255, np.uint8)], axis=2)
    with pytest.raises(InferenceServerException) as info:
        _infer(client, rgba[np.newaxis])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "IMAGE must be [N, height, width, 3]" in str(info.value.message())
    assert "got shape [1, " in str(info.value.message())
    assert server.proc.poll() is None
    assert client.is_model_ready(MODEL)
    assert [t.strip() for t in _infer(client, line[np.newaxis])[0]] == ["Hello World"]


def test_a_line_too_long_for_the_recogniser_is_refused_at_once(
    client: grpcclient.InferenceServerClient,
) -> None:
    # NOTE: a 1 x 20000 strip would reach ocr_rec as a [1, 3, 48, 960000] tensor.
    strip = np.full((1, 1, 20000, 1), 255, np.uint8)
    with pytest.raises(InferenceServerException) as info:
        _infer(client, strip)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "more than the 3200 the recogniser is given: split the line" in str(info.value.message())
    line = _line("pillow-default", 40, "Hello World")
    assert [t.strip() for t in _infer(client, line[np.newaxis])[0]] == ["Hello World"]
