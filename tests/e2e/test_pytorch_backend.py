"""End to end: TorchScript models (``platform: "pytorch_libtorch"``) through ``triton-mp start``.

The models are built here with torch and saved as ``model.pt``; answers are compared with the
same module run directly by torch. Concurrent tritonclient requests are batched by the
dynamic batcher (the statistics show fewer executions than inferences).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess, counted, server_factory

torch = pytest.importorskip("torch")

from tests.helpers.torch_models import AddSub, Mlp, save  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

WIDTH = 32

MLP_CONFIG = f"""
platform: "pytorch_libtorch"
max_batch_size: 16
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 50000 }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "1" }} }}
"""

ADD_SUB_CONFIG = """
backend: "pytorch"
max_batch_size: 0
input [
  { name: "x" data_type: TYPE_INT64 dims: [ 3 ] },
  { name: "y" data_type: TYPE_INT64 dims: [ 3 ] }
]
output [
  { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ 3 ] },
  { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ 3 ] }
]
"""


def _model(repo: Path, name: str, config: str | None, module: torch.nn.Module) -> None:
    save(module, repo / name / "1" / "model.pt")
    if config is not None:
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    _model(repo, "mlp", MLP_CONFIG, Mlp(width=WIDTH, seed=3))
    _model(repo, "add_sub_pt", ADD_SUB_CONFIG, AddSub())
    _model(repo, "no_config", None, AddSub())
    _model(
        repo,
        "bad_param",
        MLP_CONFIG.replace('string_value: "1"', 'string_value: "lots"'),
        Mlp(width=WIDTH),
    )
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def test_torchscript_models_serve_as_torch_computes(server: ServerProcess, tmp_path: Path) -> None:
    direct = torch.jit.load(str(save(Mlp(width=WIDTH, seed=3), tmp_path / "direct.pt")))
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, WIDTH), dtype=np.float32) for _ in range(24)]

    def ask(x: np.ndarray) -> np.ndarray:
        with grpcclient.InferenceServerClient(server.url) as client:
            inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            return client.infer("mlp", [inp]).as_numpy("OUTPUT__0")

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, xs))
    with torch.no_grad():
        for x, got in zip(xs, answers, strict=True):
            # NOTE: a batched matmul may round differently from a single row.
            np.testing.assert_allclose(got, direct(torch.from_numpy(x)).numpy(), atol=1e-5)
    with server.client() as client:
        stats = counted(
            lambda: client.get_inference_statistics("mlp").model_stats[0],
            lambda st: st.inference_count >= 24,
            "24 inferences counted",
        )
        assert stats.inference_count == 24
        # NOTE: 8 concurrent clients and a 50 ms window: requests share executions.
        assert stats.execution_count < 24

    with httpclient.InferenceServerClient(server.http_url) as http:
        x = np.array([1, 2, 3], dtype=np.int64)
        y = np.array([10, 20, 30], dtype=np.int64)
        inputs = [
            httpclient.InferInput("x", [3], "INT64"),
            httpclient.InferInput("y", [3], "INT64"),
        ]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(y)
        result = http.infer("add_sub_pt", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x + y)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), x - y)
        meta = http.get_model_metadata("add_sub_pt")
        assert meta["platform"] == "pytorch_libtorch"


def test_pytorch_models_that_cannot_load_say_why(server: ServerProcess) -> None:
    with server.client() as client:
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["bad_param"].state == "UNAVAILABLE"
        assert "failed to convert 'lots' to integral number" in index["bad_param"].reason
        # NOTE: TorchScript holds no tensor names: no auto-complete, as in Triton.
        assert index["no_config"].state == "UNAVAILABLE"
        assert "skipping model configuration auto-complete for 'no_config'" in server.log()
        with pytest.raises(InferenceServerException, match="bad_param"):
            client.infer("bad_param", [])
        assert client.is_model_ready("mlp")
