"""The default repository's ``ocr_cls_pipeline`` ensemble (python pre-processing -> ocr_cls ->
python post-processing) against the same three steps called one after another by a client,
and ``examples/ocr_client.py --cls-ensemble`` reading text through it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers import ocr_images
from tests.helpers.repos import copy_models
from tests.helpers.server import REPO_ROOT, ServerProcess, server_factory, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

MODELS = ("ocr_det", "ocr_cls", "ocr_rec", "ocr_cls_pre", "ocr_cls_post", "ocr_cls_pipeline")
CLS_OUTPUT = "save_infer_model/scale_0.tmp_1"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("cv2")
    return copy_models(tmp_path_factory.mktemp("repo"), *MODELS)


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        srv = start(repo)
        client = srv.client()
        wait_for(lambda: client.is_model_ready("ocr_cls_pipeline"), 120, "pipeline ready")
        yield srv


def _crops() -> list[np.ndarray]:
    out = []
    for i, text in enumerate(("Hello World", "Inference Server 2026", "upside down text")):
        image = ocr_images.to_bgr(ocr_images.render_text_image((text,), None, 32 + 4 * i))
        if i == 2:
            image = np.ascontiguousarray(image[::-1, ::-1])
        out.append(image)
    return out


def _infer(client, model: str, name: str, array: np.ndarray, dtype: str) -> grpcclient.InferResult:
    t = grpcclient.InferInput(name, list(array.shape), dtype)
    t.set_data_from_numpy(array)
    return client.infer(model, [t])


def test_the_ensemble_answers_as_the_three_steps_called_in_turn(server: ServerProcess) -> None:
    client = server.client()
    for crop in _crops():
        ens = _infer(client, "ocr_cls_pipeline", "crop", crop, "UINT8")
        x = _infer(client, "ocr_cls_pre", "crop", crop, "UINT8").as_numpy("x")
        probs = _infer(client, "ocr_cls", "x", x, "FP32").as_numpy(CLS_OUTPUT)
        post = _infer(client, "ocr_cls_post", "probs", probs, "FP32")
        assert ens.as_numpy("label").tolist() == post.as_numpy("label").tolist()
        np.testing.assert_array_equal(ens.as_numpy("score"), post.as_numpy("score"))
        assert ens.as_numpy("label")[0] in (b"0", b"180")
        assert 0.5 <= float(ens.as_numpy("score")[0]) <= 1.0


def test_concurrent_crops_share_ocr_cls_batches(server: ServerProcess) -> None:
    crops = _crops()
    client = server.client()
    expected = [
        _infer(client, "ocr_cls_pipeline", "crop", c, "UINT8").as_numpy("label")[0] for c in crops
    ]

    def one(i: int) -> bytes:
        c = grpcclient.InferenceServerClient(server.url)
        try:
            return _infer(c, "ocr_cls_pipeline", "crop", crops[i % 3], "UINT8").as_numpy("label")[0]
        finally:
            c.close()

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(96)))
    assert got == [expected[i % 3] for i in range(96)]
    stats = server.client().get_inference_statistics("ocr_cls").model_stats[0]
    assert max(bs.batch_size for bs in stats.batch_stats) > 1


def test_the_ocr_client_reads_through_the_ensemble(
    server: ServerProcess, repo: Path, tmp_path: Path
) -> None:
    path = tmp_path / "lines.png"
    lines = ("Hello World", "Inference Server 2026")
    ocr_images.render_text_image(lines, None, 40).save(path)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "examples" / "ocr_client.py"),
            str(path),
            "--url",
            server.url,
            "--rec-model",
            str(repo / "ocr_rec" / "1" / "model.onnx"),
            "--cls-ensemble",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == list(lines)
    stats = server.client().get_inference_statistics("ocr_cls_pipeline").model_stats[0]
    assert stats.inference_stats.success.count > 0
