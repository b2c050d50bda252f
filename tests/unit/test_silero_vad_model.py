"""``model_repository/silero_vad/1/model.py`` in-process: per-sequence state, one ORT call.

The wrapper is imported the way the python backend imports it (our ``pb_utils`` as
``triton_python_backend_utils``) and driven with ``pb_utils.InferenceRequest``s carrying
correlation IDs and START/END flags, as the sequence batcher hands them over. No process
is started. Skipped when the ``silero-vad`` package is absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.repos import copy_models
from tests.helpers.vad import (
    onnx_session,
    reference_probabilities,
    stream_audios,
    vad_client,
)
from triton_mp.backends.python import pb_utils
from triton_mp.backends.python.model_module import import_model_module, install_pb_utils
from triton_mp.cli import assets
from triton_mp.common.json_form import config_to_json
from triton_mp.model_config.loader import load_repository

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
CHUNK = vad_client.CHUNK_SAMPLES


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_models(tmp_path_factory.mktemp("repo"), assets.VAD_MODEL_NAME)


@pytest.fixture(scope="module")
def onnx_file(repository: Path) -> Path:
    return repository / assets.VAD_MODEL_NAME / "1" / assets.VAD_MODEL_FILE


def _load(repository: Path) -> Any:
    """A fresh ``TritonPythonModel`` initialised as the python backend does."""
    (model,) = load_repository(repository)
    assert model.error is None, model.error
    assert model.config is not None
    install_pb_utils()
    module = import_model_module(model.versions[0].model_file, model.name)
    instance = module.TritonPythonModel()
    instance.initialize(
        {
            "model_config": json.dumps(config_to_json(model.config)),
            "model_instance_kind": "CPU",
            "model_instance_name": "silero_vad_0",
            "model_instance_device_id": "0",
            "model_repository": str(repository / model.name),
            "model_version": "1",
            "model_name": model.name,
        }
    )
    return instance


@pytest.fixture
def model(repository: Path) -> Any:
    instance = _load(repository)
    yield instance
    instance.finalize()


def _request(corrid: int | str, chunk: np.ndarray, flags: int = 0) -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest(
        model_name="silero_vad",
        requested_output_names=["PROBABILITY"],
        inputs=[pb_utils.Tensor("AUDIO", np.ascontiguousarray(chunk, np.float32).reshape(1, -1))],
        correlation_id=corrid,
        flags=flags,
    )


def _probability(response: pb_utils.InferenceResponse) -> float:
    assert not response.has_error(), response.error().message()
    (tensor,) = response.output_tensors()
    assert tensor.name() == "PROBABILITY"
    out = tensor.as_numpy()
    assert (out.dtype, out.shape) == (np.float32, (1, 1))
    return float(out[0, 0])


def _error(response: pb_utils.InferenceResponse) -> str:
    assert response.has_error()
    assert response.error().code() == pb_utils.TritonError.INVALID_ARG
    return str(response.error().message())


def test_the_config_loads_under_the_repository_rules(repository: Path) -> None:
    (model,) = load_repository(repository)
    assert model.error is None, model.error
    assert model.config is not None
    config = config_to_json(model.config)
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 16
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("AUDIO", "TYPE_FP32", [512])
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("PROBABILITY", "TYPE_FP32", [1])
    ]
    batching = config["sequence_batching"]
    assert batching["max_sequence_idle_microseconds"] == 5_000_000
    assert batching["oldest"]["max_candidate_sequences"] == 64
    assert batching["oldest"]["preferred_batch_size"] == [4, 8, 16]


def test_interleaved_sequences_each_match_the_onnx_model_alone(model: Any, onnx_file: Path) -> None:
    """Six streams of different lengths, fed in calls of changing make-up, one ORT call each."""
    audios = stream_audios(6)
    session = onnx_session(onnx_file)
    expected = [reference_probabilities(session, a) for a in audios]
    chunks = [vad_client.split_chunks(a) for a in audios]
    got: list[list[float]] = [[] for _ in audios]
    rng = np.random.default_rng(7)
    calls = 0
    sizes = set()
    while any(len(g) < len(c) for g, c in zip(got, chunks, strict=True)):
        live = [s for s in range(len(audios)) if len(got[s]) < len(chunks[s])]
        picked = sorted(rng.choice(live, size=rng.integers(1, len(live) + 1), replace=False))
        requests = []
        for s in picked:
            i = len(got[s])
            flags = (START if i == 0 else 0) | (END if i == len(chunks[s]) - 1 else 0)
            requests.append(_request(1000 + s, chunks[s][i], flags))
        responses = model.execute(requests)
        assert len(responses) == len(requests)
        for s, response in zip(picked, responses, strict=True):
            got[s].append(_probability(response))
        calls += 1
        sizes.add(len(requests))
    assert len(sizes) > 3, "calls of several sizes"
    assert model.sequences == {}, "every sequence ended"
    diff = max(
        float(np.abs(np.array(g, np.float32) - e).max()) for g, e in zip(got, expected, strict=True)
    )
    print(f"max abs diff over {sum(len(c) for c in chunks)} chunks in {calls} calls: {diff:.3g}")
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(np.array(g, np.float32), e, rtol=0, atol=1e-6)


def test_one_call_is_one_onnxruntime_run(model: Any) -> None:
    runs: list[tuple[int, ...]] = []
    real_run = model.session.run

    class CountingSession:
        def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> Any:
            runs.append(feeds["state"].shape)
            return real_run(names, feeds)

    model.session = CountingSession()
    rng = np.random.default_rng(0)
    chunk = rng.uniform(-0.1, 0.1, CHUNK).astype(np.float32)
    model.execute([_request(c, chunk, START) for c in range(1, 9)])
    assert runs == [(2, 8, 128)]


def test_two_requests_of_one_sequence_in_one_call_run_in_order(
    model: Any, repository: Path
) -> None:
    audio = stream_audios(1)[0]
    chunks = vad_client.split_chunks(audio)[:4]
    one_by_one = _load(repository)
    expected = [
        _probability(one_by_one.execute([_request(5, c, START if i == 0 else 0)])[0])
        for i, c in enumerate(chunks)
    ]
    responses = model.execute(
        [
            _request(5, chunks[0], START),
            _request(6, chunks[0], START),
            _request(5, chunks[1]),
            _request(5, chunks[2]),
            _request(6, chunks[1]),
        ]
    )
    got = [_probability(r) for r in responses]
    assert got[0] == got[1] == expected[0]
    assert got[2:4] == expected[1:3]
    assert got[4] == expected[1]


def test_without_start_an_unknown_sequence_fails_alone(model: Any) -> None:
    chunk = np.zeros(CHUNK, np.float32)
    responses = model.execute([_request(1, chunk, START), _request(2, chunk)])
    _probability(responses[0])
    assert "sequence 2 has no state" in _error(responses[1])
    assert "START" in _error(responses[1])
    assert set(model.sequences) == {1}


def test_end_drops_the_state_and_start_restarts(model: Any) -> None:
    rng = np.random.default_rng(1)
    chunks = rng.uniform(-0.3, 0.3, (3, CHUNK)).astype(np.float32)
    first = _probability(model.execute([_request("s", chunks[0], START)])[0])
    _probability(model.execute([_request("s", chunks[1])])[0])
    again = _probability(model.execute([_request("s", chunks[0], START)])[0])
    assert again == first, "START forgets what came before"
    _probability(model.execute([_request("s", chunks[1], END)])[0])
    assert model.sequences == {}
    assert "no state" in _error(model.execute([_request("s", chunks[2])])[0])


def test_bad_requests_fail_alone(model: Any) -> None:
    chunk = np.zeros(CHUNK, np.float32)
    short = pb_utils.InferenceRequest(
        inputs=[pb_utils.Tensor("AUDIO", np.zeros((1, 100), np.float32))],
        correlation_id=3,
        flags=START | END,
    )
    responses = model.execute([short, _request(0, chunk, START), _request(4, chunk, START)])
    assert "AUDIO must have shape [1, 512], got [1, 100]" in _error(responses[0])
    assert "needs a sequence" in _error(responses[1])
    _probability(responses[2])
    assert set(model.sequences) == {4}


def test_a_failed_onnxruntime_run_keeps_every_state(model: Any) -> None:
    chunk = np.full(CHUNK, 0.1, np.float32)
    model.execute([_request(1, chunk, START)])
    before = model.sequences[1].state.copy()
    real = model.session

    class Failing:
        def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> Any:
            raise RuntimeError("boom")

    model.session = Failing()
    with pytest.raises(RuntimeError, match="boom"):
        model.execute([_request(1, chunk), _request(2, chunk, START)])
    model.session = real
    assert set(model.sequences) == {1}
    np.testing.assert_array_equal(model.sequences[1].state, before)


def test_states_unused_long_past_the_idle_time_are_forgotten(model: Any) -> None:
    now = [100.0]
    model.clock = lambda: now[0]
    chunk = np.zeros(CHUNK, np.float32)
    model.execute([_request(1, chunk, START), _request(2, chunk, START)])
    assert model.forget_after_s == 5.0 + 60.0, "max_sequence_idle_microseconds + a minute"
    now[0] += 40.0
    model.execute([_request(2, chunk)])
    now[0] += 30.0  # sequence 1: 70 s unused; sequence 2: 30 s
    model.execute([_request(3, chunk, START)])
    assert set(model.sequences) == {2, 3}


def test_a_missing_onnx_file_fails_initialize_with_the_pip_command(tmp_path: Path) -> None:
    repository = copy_models(tmp_path / "repo", assets.VAD_MODEL_NAME)
    (repository / assets.VAD_MODEL_NAME / "1" / assets.VAD_MODEL_FILE).unlink()
    with pytest.raises(pb_utils.TritonModelException, match="pip install --no-deps silero-vad"):
        _load(repository)


def test_ids_of_many_kinds_never_mix(model: Any, onnx_file: Path) -> None:
    """Integer and string correlation IDs, including 1 and "1", are separate sequences."""
    audios = stream_audios(3)
    session = onnx_session(onnx_file)
    ids: list[int | str] = [1, "1", 2**63 - 1]
    chunks = [vad_client.split_chunks(a)[:20] for a in audios]
    got = {corrid: [] for corrid in ids}
    for i in range(20):
        flags = START if i == 0 else 0
        responses = model.execute([_request(c, chunks[n][i], flags) for n, c in enumerate(ids)])
        for corrid, r in zip(ids, responses, strict=True):
            got[corrid].append(_probability(r))
    for n, corrid in enumerate(ids):
        expected = reference_probabilities(session, chunks[n].reshape(-1))
        np.testing.assert_allclose(got[corrid], expected, rtol=0, atol=1e-6)
    assert len(model.sequences) == 3


def test_through_the_python_backend_as_the_worker_runs_it(
    repository: Path, onnx_file: Path
) -> None:
    """``PythonBackend`` turns ``BackendRequest.sequence_id`` / ``sequence_flags`` into the
    ``correlation_id()`` / ``flags()`` the wrapper reads; Oldest batches have no null rows."""
    from triton_mp.backends.base import BackendRequest
    from triton_mp.backends.registry import load_backend
    from triton_mp.model_config.plan import plan_models
    from triton_mp.workers.sequence_state import sequence_batch

    (plan,), _ = plan_models(load_repository(repository))
    assert not plan.error, plan.error
    spec, instance = plan.versions[0], plan.instances[0]
    assert spec.sequence is not None
    assert spec.sequence.strategy == "oldest"
    backend = load_backend(spec, instance)
    audios = stream_audios(4)[:4]
    chunks = [vad_client.split_chunks(a)[:30] for a in audios]
    got: list[list[float]] = [[] for _ in audios]
    try:
        for i in range(30):
            flags = (START if i == 0 else 0) | (END if i == 29 else 0)
            requests = [
                BackendRequest(
                    {"AUDIO": chunks[s][i][None]},
                    ("PROBABILITY",),
                    1,
                    sequence_id=f"stream-{s}" if s % 2 else 10 + s,
                    sequence_flags=flags,
                )
                for s in range(len(audios))
            ]
            batch = sequence_batch(spec, requests, len(requests), tuple(range(len(requests))))
            results, _ = backend.execute(requests, batch)
            for s, result in enumerate(results):
                assert isinstance(result, dict), result
                got[s].append(float(result["PROBABILITY"][0, 0]))
    finally:
        backend.close()
    session = onnx_session(onnx_file)
    for s, audio in enumerate(audios):
        expected = reference_probabilities(session, audio[: 30 * CHUNK])
        np.testing.assert_allclose(got[s], expected, rtol=0, atol=1e-6)
