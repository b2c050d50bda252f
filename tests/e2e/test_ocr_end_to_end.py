"""``examples/ocr_client.py`` reads rendered English text through a running triton-mp.

The example is run as a user runs it (a subprocess with ``--url``), against
``triton-mp start`` serving the PP-OCRv4 detector, classifier and recogniser; every model
call goes through gRPC, the shared-memory rings and the worker processes. Large print is
checked word for word (see tests/integration/test_ocr_pipeline_ort.py for why small print is
checked letter for letter), and the server's answers must give the same lines as the same
pipeline run on onnxruntime in-process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ocr_images
from tests.helpers.repos import copy_models
from tests.helpers.server import REPO_ROOT, ServerProcess, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

CASES = [
    ("pillow-default", 40, ("Hello World", "Inference Server 2026")),
    ("DejaVuSans", 36, ("The quick brown fox jumps", "over the lazy dog")),
    ("DejaVuSerif", 48, ("Dynamic batching of requests", "Python processes share memory")),
    ("DejaVuSansMono", 40, ("Hello Triton", "Inference Server 2026")),
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_models(tmp_path_factory.mktemp("repo"), "ocr_det", "ocr_cls", "ocr_rec")


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def _image(tmp_path: Path, font_name: str, size: int, lines: tuple[str, ...]) -> Path:
    font = ocr_images.find_font(font_name)
    if font is None:
        pytest.skip(f"font {font_name} needs matplotlib's .ttf files")
    path = tmp_path / f"{font_name}-{size}.png"
    ocr_images.render_text_image(lines, font.path, size).save(path)
    return path


@pytest.mark.parametrize(("font_name", "size", "lines"), CASES, ids=[c[0] for c in CASES])
def test_ocr_client_prints_the_rendered_words(
    server: ServerProcess,
    repo: Path,
    tmp_path: Path,
    font_name: str,
    size: int,
    lines: tuple[str, ...],
) -> None:
    image = _image(tmp_path, font_name, size, lines)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "examples" / "ocr_client.py"),
            str(image),
            "--url",
            server.url,
            "--rec-model",
            str(repo / "ocr_rec" / "1" / "model.onnx"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == list(lines)


def test_server_and_onnxruntime_give_the_same_lines(
    server: ServerProcess, repo: Path, tmp_path: Path
) -> None:
    sys.path.insert(0, str(REPO_ROOT / "examples"))
    try:
        import ocr_client
    finally:
        sys.path.remove(str(REPO_ROOT / "examples"))
    characters = ocr_client.load_rec_characters(repo / "ocr_rec" / "1" / "model.onnx")
    image = ocr_images.to_bgr(
        ocr_images.render_text_image(("Inference Server 2026", "over the lazy dog"), None, 40)
    )
    via_server = ocr_client.OcrPipeline(ocr_client.grpc_infer(server.url), characters)(image)
    direct = ocr_client.OcrPipeline(ocr_client.onnxruntime_infer(repo), characters)(image)
    assert [line.text for line in via_server] == [line.text for line in direct]
    assert [round(line.score, 4) for line in via_server] == [
        round(line.score, 4) for line in direct
    ]
    assert ocr_client.join_lines(via_server) == ["Inference Server 2026", "over the lazy dog"]
