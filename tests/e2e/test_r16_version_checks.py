"""A load whose config fails a check Triton makes per version, side by side with the real
Triton 2.51 (python backend) on the session's shared pair.

2.51 checks a model's config twice: while polling the repository (the model-level rules: a
failure there is INTERNAL "failed to poll from model repository", a documented difference)
and again while creating each version (core ``Model::Init``: the inputs and outputs, the
instance groups). A failure of the second kind fails each version the policy chose: the load
answers INVALID_ARG (HTTP 400) "load failed for model '<m>': version <v> is at UNAVAILABLE
state: Invalid argument: <why>;" and a newline, and RepositoryIndex lists each such version
UNAVAILABLE with the reason "Invalid argument: <why>". A model that serves keeps serving.
"""

from __future__ import annotations

import json

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from tests.helpers.repo_control import post_json
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
SIDE_BY_SIDE_MODELS = {"r16_checked": PythonModel(CONFIG)}
"""r16_checked: INPUT0 FP32 [-1] answered as OUTPUT0, no batching (tests/e2e/conftest.py's
``shared_side_by_side`` serves it)."""

Server = ServerProcess | RealTriton
WHY = (
    "model input 'INPUT0' dimension must be integer >= 1, or -1 to indicate a variable-size "
    "dimension for r16_checked"
)
"""core ValidateModelInput's words for a dimension of 0."""
ANSWER = (
    f"load failed for model 'r16_checked': version 1 is at UNAVAILABLE state: "
    f"Invalid argument: {WHY};\n"
)


def _bad_config() -> str:
    return json.dumps(
        {
            "name": "r16_checked",
            "backend": "python",
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [0]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        }
    )


def _post(server: Server, path: str, body: object) -> tuple[int, object]:
    return post_json(server.http_url, path, body)


def _load(server: Server, config: str | None = None) -> tuple[int, object]:
    body = {"parameters": {"config": config}} if config is not None else {}
    return _post(server, "/v2/repository/models/r16_checked/load", body)


def _rows(server: Server) -> list[dict[str, str]]:
    status, rows = _post(server, "/v2/repository/index", {})
    assert status == 200
    assert isinstance(rows, list)
    return [r for r in rows if r["name"] == "r16_checked"]


def test_a_config_failing_a_version_check_fails_each_version(
    shared_side_by_side: dict[str, Server],
) -> None:
    for name, server in sorted(shared_side_by_side.items()):  # Triton first
        try:
            # Served: the load fails, version 1 goes on serving.
            assert _load(server, _bad_config()) == (400, {"error": ANSWER}), name
            assert _rows(server) == [{"name": "r16_checked", "version": "1", "state": "READY"}], (
                name
            )
            # Not served: version 1 is listed UNAVAILABLE with Triton's reason.
            assert _post(server, "/v2/repository/models/r16_checked/unload", {})[0] == 200
            assert _load(server, _bad_config()) == (400, {"error": ANSWER}), name
            assert _rows(server) == [
                {
                    "name": "r16_checked",
                    "version": "1",
                    "state": "UNAVAILABLE",
                    "reason": f"Invalid argument: {WHY}",
                }
            ], name
        finally:
            assert _load(server) == (200, None), name
        assert _rows(server) == [{"name": "r16_checked", "version": "1", "state": "READY"}], name


def test_a_config_naming_an_input_twice_is_refused(
    shared_side_by_side: dict[str, Server],
) -> None:
    """2.51 loads such a config (docs/differences.md): asked of triton-mp alone, since a
    load that 2.51 takes would leave the shared 2.51 serving it."""
    ours = shared_side_by_side["triton-mp"]
    twice = json.loads(_bad_config())
    twice["input"] = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}] * 2
    why = "model input 'INPUT0' is specified more than once for r16_checked"
    assert _load(ours, json.dumps(twice)) == (
        400,
        {
            "error": "load failed for model 'r16_checked': version 1 is at UNAVAILABLE state: "
            f"Invalid argument: {why};\n"
        },
    )
    assert _rows(ours) == [{"name": "r16_checked", "version": "1", "state": "READY"}]


def test_a_warmup_sample_without_a_required_input_fails_the_load(
    shared_side_by_side: dict[str, Server],
) -> None:
    """core PrepareForInference checks each warmup request as a client's: an input the
    config does not list is no original input, so the required one is missing."""
    config = json.loads(_bad_config())
    config["input"][0]["dims"] = [4]
    zeros = {"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}
    config["model_warmup"] = [{"name": "w", "batch_size": 1, "inputs": {"NOPE": zeros}}]
    why = (
        "[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model "
        "'r16_checked'. Got input(s) [], but missing required input(s) ['INPUT0']. Please "
        "provide all required input(s)."
    )
    for name, server in sorted(shared_side_by_side.items()):  # Triton first
        assert _load(server, json.dumps(config)) == (
            400,
            {
                "error": "load failed for model 'r16_checked': version 1 is at UNAVAILABLE "
                f"state: Invalid argument: {why};\n"
            },
        ), name
        assert _rows(server) == [{"name": "r16_checked", "version": "1", "state": "READY"}], name


def test_a_failed_in_place_update_leaves_the_version_ready(
    shared_side_by_side: dict[str, Server],
) -> None:
    """A config that differs from the served one only in ``instance_group`` is an update in
    place to core: when it fails, the version it was updating is still READY."""
    config = json.loads(_bad_config())
    config["input"][0]["dims"] = [-1]
    config["instance_group"] = [{"kind": "KIND_CPU", "gpus": [0]}]
    why = "instance group r16_checked_0 of model r16_checked has kind KIND_CPU but specifies "
    for name, server in sorted(shared_side_by_side.items()):  # Triton first
        assert _load(server, json.dumps(config)) == (
            400,
            {
                "error": "load failed for model 'r16_checked': version 1 is at READY state: "
                f"Invalid argument: {why}one or more GPUs;\n"
            },
        ), name
        # 2.51 lists that READY row with the failure as its reason, and keeps it through a
        # load that changes nothing, until the version is loaded anew.
        row = {"name": "r16_checked", "version": "1", "state": "READY"}
        failed = {**row, "reason": f"Invalid argument: {why}one or more GPUs"}
        assert _rows(server) == [failed], name
        assert _load(server) == (200, None), name
        assert _rows(server) == [failed], name
        assert _post(server, "/v2/repository/models/r16_checked/unload", {})[0] == 200
        assert _load(server) == (200, None), name
        assert _rows(server) == [row], name


def test_model_files_without_a_config_are_refused(
    shared_side_by_side: dict[str, Server],
) -> None:
    """2.51 fails such a load as a poll failure over HTTP (and over gRPC gives no answer at
    all: docs/differences.md); triton-mp says what is missing."""
    body = {"parameters": {"file:1/model.py": "eA=="}}  # "x", base64 as HTTP carries bytes
    answers = {
        "triton": (500, "failed to load 'r16_checked', failed to poll from model repository"),
        "triton-mp": (
            400,
            "failed to load 'r16_checked': the 'config' parameter is required when model "
            "files are provided",
        ),
    }
    for name, server in sorted(shared_side_by_side.items()):
        status, error = _post(server, "/v2/repository/models/r16_checked/load", body)
        assert (status, error) == (answers[name][0], {"error": answers[name][1]}), name
        assert [(r["version"], r["state"]) for r in _rows(server)] == [("1", "READY")], name


def test_a_byte_size_past_int64_is_worded_as_core_wraps_it(
    shared_side_by_side: dict[str, Server],
) -> None:
    """core's GetByteSize multiplies in int64: [2**61] FP32 elements are -2**63 bytes."""
    request = pb.ModelInferRequest(model_name="r16_checked")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[2**61])
    assert tensor.name == "INPUT0"
    request.raw_input_contents.append(b"")
    for name, server in sorted(shared_side_by_side.items()):
        with grpc.insecure_channel(server.url) as channel, pytest.raises(grpc.RpcError) as e:
            pbg.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        assert (e.value.code(), e.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
            "'r16_checked'. Expected -9223372036854775808, got 0",
        ), name
