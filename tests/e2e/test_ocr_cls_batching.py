"""Dynamic batching under load: 32 concurrent clients on the OCR angle classifier.

Each client sends its own distinct crops; the server must form batches larger than 1
(visible in ModelStatistics batch_stats) and still give every client its own answer,
equal to what onnxruntime computes for that client's input alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repos import copy_models
from tests.helpers.server import ServerProcess, counted

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CLIENTS = 32
REQUESTS_PER_CLIENT = 6
OUTPUT = "save_infer_model/scale_0.tmp_1"


def test_32_clients_form_batches_and_get_their_own_answers(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "ocr_cls")
    server = start_server(repo)
    rng = np.random.default_rng(0)
    inputs = rng.uniform(-1, 1, (CLIENTS, REQUESTS_PER_CLIENT, 1, 3, 48, 192)).astype(np.float32)
    sess = ort.InferenceSession(str(repo / "ocr_cls" / "1" / "model.onnx"))
    expected = [[sess.run([OUTPUT], {"x": x})[0] for x in per_client] for per_client in inputs]

    results: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(CLIENTS)

    def client_main(k: int) -> None:
        try:
            client = server.client()
            barrier.wait(timeout=60)
            for j in range(REQUESTS_PER_CLIENT):
                inp = grpcclient.InferInput("x", [1, 3, 48, 192], "FP32")
                inp.set_data_from_numpy(inputs[k, j])
                res = client.infer("ocr_cls", [inp], request_id=f"{k}-{j}")
                assert res.get_response().id == f"{k}-{j}"
                results[(k, j)] = res.as_numpy(OUTPUT)
            client.close()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=client_main, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors[:3]
    assert len(results) == CLIENTS * REQUESTS_PER_CLIENT
    for k in range(CLIENTS):
        for j in range(REQUESTS_PER_CLIENT):
            np.testing.assert_allclose(results[(k, j)], expected[k][j], rtol=1e-4, atol=1e-5)

    client = server.client()
    stats = counted(
        lambda: client.get_inference_statistics("ocr_cls", as_json=True)["model_stats"][0],
        lambda st: int(st.get("inference_count", 0)) >= CLIENTS * REQUESTS_PER_CLIENT,
        "every inference counted",
    )
    client.close()
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert max(sizes) > 1, f"no batch larger than 1 formed: {sizes}"
    assert max(sizes) <= 32
    assert sum(size * count for size, count in sizes.items()) == CLIENTS * REQUESTS_PER_CLIENT
    assert int(stats["inference_count"]) == CLIENTS * REQUESTS_PER_CLIENT
    assert int(stats["execution_count"]) == sum(sizes.values())
