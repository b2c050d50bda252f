"""Ensembles with a decoupled model on their data path, and BLS and ensembles calling each
other (issue 16), through tritonclient against a running server.

- ``dec_ens``: ``repeat_py`` (decoupled: three responses ``k * IN``, k = 1..3, then the
  final flag) -> ``double_py``. The ensemble is decoupled: each response of the decoupled
  step drives the next step once, each completed output set is one response
  (``2 * k * INPUT0``), and the final flag ends the stream.
- ``outer_ens`` -> ``bls_py`` -> (BLS) ``inner_ens`` -> ``double_py`` twice: an ensemble
  step that calls an ensemble through BLS, so ``OUTPUT0 = 4 * INPUT0``.
- ``nest_ens`` -> ``inner_ens``: an ensemble step that is an ensemble (``4 * INPUT0``).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.ensemble_models import DOUBLE_PY, REPEAT_PY, write_ensemble_repo
from tests.helpers.server import ServerProcess, server_factory, settled_stats

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

VEC = "dims: [ 4 ]"

CONFIGS = {
    "repeat_py": f"""
        backend: "python"
        max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "IN" data_type: TYPE_FP32 {VEC} }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 {VEC} }} ]
    """,
    "double_py": f"""
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_FP32 {VEC} }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 {VEC} }} ]
    """,
    "bls_py": f"""
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_FP32 {VEC} }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 {VEC} }} ]
    """,
}

SOURCES = {
    "repeat_py": REPEAT_PY,
    "double_py": DOUBLE_PY,
    "bls_py": """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                responses = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                    call = pb_utils.InferenceRequest(
                        model_name="inner_ens",
                        requested_output_names=["OUTPUT0"],
                        inputs=[pb_utils.Tensor("INPUT0", x)],
                    )
                    answer = call.exec()
                    if answer.has_error():
                        responses.append(pb_utils.InferenceResponse(error=answer.error()))
                        continue
                    y = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
                    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", y)]))
                return responses
    """,
}


def _ensemble(name: str, steps: list[tuple[str, str, str]]) -> str:
    """An ensemble of one-input one-output FP32 [4] steps: (model, from tensor, to tensor)."""
    body = "".join(
        f"""
        {{
          model_name: "{model}"
          model_version: -1
          input_map {{ key: "IN" value: "{src}" }}
          output_map {{ key: "OUT" value: "{dst}" }}
        }},"""
        for model, src, dst in steps
    ).rstrip(",")
    return f"""
        name: "{name}"
        platform: "ensemble"
        max_batch_size: 0
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 {VEC} }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 {VEC} }} ]
        ensemble_scheduling {{ step [ {body} ] }}
    """


ENSEMBLES = {
    "dec_ens": _ensemble(
        "dec_ens", [("repeat_py", "INPUT0", "rep"), ("double_py", "rep", "OUTPUT0")]
    ),
    "inner_ens": _ensemble(
        "inner_ens", [("double_py", "INPUT0", "twice"), ("double_py", "twice", "OUTPUT0")]
    ),
    "outer_ens": _ensemble("outer_ens", [("bls_py", "INPUT0", "OUTPUT0")]),
    "nest_ens": _ensemble("nest_ens", [("inner_ens", "INPUT0", "OUTPUT0")])
    .replace('key: "IN" value', 'key: "INPUT0" value')
    .replace('key: "OUT" value', 'key: "OUTPUT0" value'),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_ensemble_repo(repo, CONFIGS, SOURCES, ENSEMBLES)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        srv = start(repo)
        client = srv.client()
        try:
            for name in (*CONFIGS, *ENSEMBLES):
                assert client.is_model_ready(name), srv.log()
        finally:
            client.close()
        yield srv


def _grpc_input(x: np.ndarray) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return [t]


def test_a_decoupled_step_makes_the_ensemble_decoupled_one_response_per_output_set(
    server: ServerProcess,
) -> None:
    x = np.array([1, 2, 3, 4], np.float32)
    client = server.client()
    config = client.get_model_config("dec_ens", as_json=True)["config"]
    assert config["model_transaction_policy"]["decoupled"] is True
    seen: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: seen.put(error or result))
    try:
        client.async_stream_infer(
            "dec_ens", _grpc_input(x), request_id="r1", enable_empty_final_response=True
        )
        outputs, finals = [], 0
        while True:
            item = seen.get(timeout=60)
            assert isinstance(item, grpcclient.InferResult), item
            response = item.get_response()
            assert response.id == "r1"
            final = response.parameters["triton_final_response"].bool_param
            out = item.as_numpy("OUTPUT0")
            if out is not None:
                outputs.append(out.tolist())
            if final:
                finals += 1
                break
    finally:
        client.stop_stream()
        client.close()
    assert sorted(outputs) == sorted([(2 * k * x).tolist() for k in (1, 2, 3)])
    assert finals == 1
    unary = server.client()
    try:
        with pytest.raises(InferenceServerException, match="(?i)decoupled|stream"):
            unary.infer("dec_ens", _grpc_input(x))
    finally:
        unary.close()


def test_an_ensemble_step_calls_an_ensemble_through_bls(server: ServerProcess) -> None:
    x = np.array([[0.5, -1, 2, 8]], np.float32)[0]
    client = server.client()

    def counts() -> dict[str, tuple[int, int]]:
        return {
            s.name: (s.inference_stats.success.count, s.inference_stats.fail.count)
            for s in client.get_inference_statistics().model_stats
        }

    try:
        before = counts()  # NOTE: the module's server; other tests ran double_py too
        out = client.infer("outer_ens", _grpc_input(x)).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, 4 * x)
        sent = {"outer_ens": 1, "bls_py": 1, "inner_ens": 1, "double_py": 2}
        after = settled_stats(counts, before, sent)
    finally:
        client.close()
    gained = {
        m: (after[m][0] - before[m][0], after[m][1] - before[m][1])
        for m in ("outer_ens", "bls_py", "inner_ens", "double_py")
    }
    assert gained == {
        "outer_ens": (1, 0),
        "bls_py": (1, 0),
        "inner_ens": (1, 0),
        "double_py": (2, 0),
    }
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        t = httpclient.InferInput("INPUT0", [4], "FP32")
        t.set_data_from_numpy(x)
        np.testing.assert_array_equal(http.infer("outer_ens", [t]).as_numpy("OUTPUT0"), 4 * x)
    finally:
        http.close()


def test_an_ensemble_step_that_is_an_ensemble(server: ServerProcess) -> None:
    x = np.array([1.5, -2, 3, 0.25], np.float32)
    client = server.client()
    try:
        before = {
            s.name: s.inference_stats.success.count
            for s in client.get_inference_statistics().model_stats
        }
        out = client.infer("nest_ens", _grpc_input(x)).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, 4 * x)
        after = {
            s.name: s.inference_stats.success.count
            for s in client.get_inference_statistics().model_stats
        }
    finally:
        client.close()
    gained = {m: after[m] - before[m] for m in ("nest_ens", "inner_ens", "double_py")}
    assert gained == {"nest_ens": 1, "inner_ens": 1, "double_py": 2}
