"""End to end: an ensemble step's request is checked against its model's config, as Triton's
core checks it (``ensemble_scheduler.cc`` ``InitStep``, then ``infer_request.cc``
``Normalize``), and an output a step leaves out is a placeholder (``AddTensor(nullptr)``).

The repository is ``tests/ensemble_check_models``: ``mode_py`` answers with OUT in the
datatype and shape the request parameter ``mode`` names (or without OUT), feeding
``flex`` (FP32 [-1]), ``flex_b`` (the same, batching: a batch dimension is added and taken
away again) or ``flex_r`` (dims [-1] reshaped to [-1,1]: the check is on dims). Where the
peers are installed the real Triton 2.51 serves the same directory and must give the same
answers, errors and counts.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import (
    REPO_ROOT,
    ServerProcess,
    counted,
    server_factory,
    settled_stats,
    wait_for,
)
from tests.helpers.triton_peer import start_triton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODELS = REPO_ROOT / "tests" / "ensemble_check_models"
ENSEMBLES = ("ens", "ens_b", "ens_r", "ens_last", "ens_pair", "ens_tap", "ens_in_r")
COMPOSING = ("mode_py", "flex", "flex_b", "flex_r")
MODES = ("fp32", "int32", "fp64", "2x3", "1x3", "empty", "bytes", "missing")
CASES = [(e, m, None) for e in ("ens", "ens_b", "ens_r") for m in MODES] + [
    ("ens_last", "missing", None),
    ("ens_last", "fp32", None),
    ("ens_pair", "fp32", None),
    ("ens_pair", "fp32", ("A", "B")),
    ("ens_pair", "missing", None),
    ("ens_pair", "missing", ("A",)),
]
"""(ensemble, mode, outputs requested or None for all)."""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("ensemble_checks") / "repo"
    shutil.copytree(MODELS, dest, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    return dest


def _wait_ready(url: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    try:
        names = ENSEMBLES + COMPOSING
        wait_for(lambda: all(client.is_model_ready(n) for n in names), 120, "models ready")
    finally:
        client.close()


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        srv = start(repo)
        _wait_ready(srv.url)
        yield srv


def _stats(client: grpcclient.InferenceServerClient) -> dict[str, tuple[int, int, int, int]]:
    """model -> (success count, fail count, execution count, inference count)."""
    out = {}
    for m in client.get_inference_statistics("").model_stats:
        st = m.inference_stats
        out[m.name] = (st.success.count, st.fail.count, m.execution_count, m.inference_count)
    return out


def _ask(
    client: grpcclient.InferenceServerClient,
    ensemble: str,
    mode: str,
    outputs: tuple[str, ...] | None = None,
) -> object:
    """One request: ("OK", [(output, datatype, shape)], Y's values) or (status, message)."""
    x = grpcclient.InferInput("IN", [3], "FP32")
    x.set_data_from_numpy(np.array([1, 2, 3], np.float32))
    wanted = None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs]
    try:
        r = client.infer(ensemble, [x], outputs=wanted, parameters={"mode": mode}, request_id="r1")
    except InferenceServerException as e:
        return (e.status(), e.message())
    outputs = [(o.name, o.datatype, list(o.shape)) for o in r.get_response().outputs]
    y = r.as_numpy("Y")
    return ("OK", outputs, None if y is None else y.tolist())


def _scenario(url: str) -> tuple[dict[tuple[str, str], object], dict[str, tuple[int, ...]]]:
    """Every case against one server: its answers, and the counts each model gained once
    every ensemble request is counted (Triton's request tracker reports an ensemble's
    statistics after its response) and two reads 0.3 s apart agree."""
    client = grpcclient.InferenceServerClient(url)
    try:
        before = _stats(client)
        answers = {case: _ask(client, *case) for case in CASES}
        sent = {e: sum(1 for c in CASES if c[0] == e) for e in ENSEMBLES}
        last = settled_stats(lambda: _stats(client), before, sent)
        gained = {m: tuple(a - b for a, b in zip(last[m], before[m], strict=True)) for m in last}
        return answers, gained
    finally:
        client.close()


def test_step_inputs_are_checked_and_a_left_out_output_is_a_placeholder(
    server: ServerProcess,
) -> None:
    """The strings 2.51 answered (same requests, same repository), pinned where the peers
    are not installed."""
    client = server.client()
    before = _stats(client)
    ask = {case[:2]: _ask(client, *case) for case in CASES if case[2] is None}
    prefix = "in ensemble 'ens', [request id: r1] "
    invalid = "StatusCode.INVALID_ARGUMENT"
    assert ask["ens", "int32"] == (
        invalid,
        prefix + "inference input 'IN' data-type is 'INT32', but model 'flex' expects 'FP32'",
    )
    assert ask["ens", "2x3"] == (
        invalid,
        prefix + "unexpected shape for input 'IN' for model 'flex'. Expected [-1], got [2,3]. ",
    )
    assert ask["ens", "missing"] == (
        invalid,
        prefix + "expected 1 inputs but got 0 inputs for model 'flex'. Got input(s) [], but "
        "missing required input(s) ['IN']. Please provide all required input(s).",
    )
    assert ask["ens_last", "missing"] == ("OK", [], None)
    # NOTE: [3] from the model that does not batch is [1,3] for flex_b and [3] again for
    # the ensemble, which does not batch either; [2,3] is a batch of 2 for flex_b.
    assert ask["ens_b", "fp32"] == ("OK", [("Y", "FP32", [3])], [2.0, 4.0, 6.0])
    assert ask["ens_b", "1x3"] == ("OK", [("Y", "FP32", [3])], [2.0, 4.0, 6.0])
    assert ask["ens_b", "2x3"] == (
        "OK",
        [("Y", "FP32", [2, 3])],
        [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]],
    )
    assert ask["ens_r", "fp32"] == ("OK", [("Y", "FP32", [3, 1])], [[2.0], [4.0], [6.0]])
    # NOTE: 2.51 lists an ensemble's outputs in its unordered_map's order: B before A.
    pair = [("B", "FP32", [3]), ("A", "FP32", [3])]
    assert ask["ens_pair", "fp32"] == ("OK", pair, None)
    assert _ask(client, "ens_pair", "fp32", ("A", "B")) == ("OK", pair, None)
    assert ask["ens_pair", "missing"] == ("OK", pair[:1], None)
    assert _ask(client, "ens_pair", "missing", ("A",)) == ("OK", [], None)
    # NOTE: flex ran for ens fp32 and empty and for ens_pair's 3 requests naming B.
    runs = counted(lambda: _stats(client), lambda st: st["flex"][0] == before["flex"][0] + 5, "5")
    assert _ask(client, "ens_pair", "fp32", ("A",)) == ("OK", [("A", "FP32", [3])], None)
    pair = runs["ens_pair"][0] + 1
    after = counted(lambda: _stats(client), lambda st: st["ens_pair"][0] == pair, "ens_pair")
    assert after["flex"] == runs["flex"]  # the step only B needs was pruned


# ---------------------------------------------------------------------------- vs Triton
@pytest.fixture(scope="module")
def triton_url(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real Triton (python backend) on the same repository, or a skip."""
    with start_triton(repo, tmp_path_factory.mktemp("triton") / "triton.log") as peer:
        _wait_ready(peer.url)
        yield peer.url


def test_same_answers_errors_and_counts_as_triton(server: ServerProcess, triton_url: str) -> None:
    ours, theirs = _scenario(server.url), _scenario(triton_url)
    assert ours[0] == theirs[0]
    assert {m: ours[1][m] for m in COMPOSING} == {m: theirs[1][m] for m in COMPOSING}
    # NOTE: a step refused by its check is never run: its model counts nothing (flex_b
    # counts the batch of 2 and the [0]-sized tensor given a batch dimension of 1).
    # NOTE: ens fp32 and empty, and 3 of ens_pair: asking for A alone prunes flex's step.
    assert theirs[1]["flex"] == (5, 0, 5, 5)
    assert theirs[1]["flex_b"] == (4, 0, 4, 5)
    # NOTE: Triton counts a failed ensemble request twice (RespondIfError and the request
    # tracker), triton-mp once (issue 16); the rest is the same.
    for e in ENSEMBLES:
        success, fail, executions, inferences = theirs[1][e]
        assert ours[1][e] == (success, fail // 2, executions, inferences), e
    assert ours[1]["ens"] == (2, 6, 2, 2)
    assert ours[1]["ens_last"] == (2, 0, 2, 2)


def test_a_requested_output_only_pruned_steps_read_is_answered_where_triton_deadlocks(
    server: ServerProcess, triton_url: str
) -> None:
    """A pinned difference: core's pruning also drops the step that makes a requested
    output when only pruned steps read it (2.51 and upstream main), failing a request that
    names only that output; ours keeps that step."""
    ours = _ask(server.client(), "ens_tap", "fp32", ("MID",))
    client = grpcclient.InferenceServerClient(triton_url)
    try:
        theirs = _ask(client, "ens_tap", "fp32", ("MID",))
        both = _ask(client, "ens_tap", "fp32")
    finally:
        client.close()
    assert ours == ("OK", [("MID", "FP32", [3])], None)
    assert theirs == (
        "StatusCode.INVALID_ARGUMENT",
        "in ensemble 'ens_tap', [request id: r1] unexpected deadlock, at least one output is "
        "not set while no more ensemble steps can be made",
    )
    assert _ask(server.client(), "ens_tap", "fp32") == both


def test_an_unrequested_output_a_kept_step_reads_is_made_where_triton_deadlocks(
    server: ServerProcess, triton_url: str
) -> None:
    """A pinned difference, the mirror image of the one above: asked for Y alone, core's
    pruning drops mode_py's step (its MID is not asked for) although flex reads MID to make
    Y (2.51 and upstream main); Triton's ensemble docs skip only steps no requested output
    depends on, and so do we."""
    ours = _ask(server.client(), "ens_tap", "fp32", ("Y",))
    client = grpcclient.InferenceServerClient(triton_url)
    try:
        theirs = _ask(client, "ens_tap", "fp32", ("Y",))
    finally:
        client.close()
    assert ours == ("OK", [("Y", "FP32", [3])], [2.0, 4.0, 6.0])
    assert theirs == (
        "StatusCode.INVALID_ARGUMENT",
        "in ensemble 'ens_tap', [request id: r1] unexpected deadlock, at least one output is "
        "not set while no more ensemble steps can be made",
    )


def _reshaped(url: str) -> object:
    client = grpcclient.InferenceServerClient(url)
    x = grpcclient.InferInput("IN", [2, 3], "FP32")
    x.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    try:
        r = client.infer("ens_in_r", [x])
        return [(o.name, list(o.shape)) for o in r.get_response().outputs], r.as_numpy("Y")
    finally:
        client.close()


def test_an_ensemble_input_reaches_its_step_reshaped_as_in_triton(
    server: ServerProcess, triton_url: str
) -> None:
    """ens_in_r's IN [2,3] is reshaped to [6] by its config: flex ([-1]) gets [6]."""
    ours, theirs = _reshaped(server.url), _reshaped(triton_url)
    assert ours[0] == theirs[0] == [("Y", [6])]
    np.testing.assert_array_equal(ours[1], theirs[1])
