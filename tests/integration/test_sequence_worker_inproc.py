"""Sequence models through ``Worker`` in-process, on the real onnxruntime backend.

The model is a tiny accumulator (``tests.helpers.sequence_worker`` builds it with
``onnx.helper``): ``OUTPUT = INPUT + STATE_IN`` and ``STATE_OUT = OUTPUT`` (implicit state),
and each control input comes back as an output (``START_OUT``, ...) so the test sees what
onnxruntime was fed. The harness plays the frontend (inputs in its own arena, outputs read
back through the worker's TensorRefs) and the scheduler (``BatchAssign`` with rows, slots
and released IDs). Arenas are named
``/triton_mp_<pid>_test_*`` and unlinked in fixture teardown.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.sequence_worker import (
    INSTANCE,
    acc_spec,
    accumulator_onnx,
    make_client,
    msgspec_replace,
)
from triton_mp.backends.base import BackendRequest, PhaseTimes, Result, SequenceBatch
from triton_mp.backends.onnxruntime.backend import OnnxRuntimeBackend
from triton_mp.common.errors import ConfigError
from triton_mp.ipc.protocol.messages import (
    InferRequest,
    ReplyTo,
    Requester,
    SequenceFlags,
    TensorRef,
)
from triton_mp.ipc.tensor_pool import (
    ArenaAllocator,
    SegmentCache,
)
from triton_mp.model_config.loader import load_repository
from triton_mp.model_config.plan import plan_models

PID = os.getpid()
START, END = SequenceFlags.START, SequenceFlags.END


@pytest.fixture
def arenas() -> Iterator[tuple[ArenaAllocator, ArenaAllocator, SegmentCache]]:
    """(frontend arena, worker arena, cache that reads both)."""
    cache = SegmentCache()
    front = ArenaAllocator(f"/triton_mp_{PID}_test_seqfront", 1 << 16, 1 << 20, cache=cache)
    back = ArenaAllocator(f"/triton_mp_{PID}_test_seqworker", 1 << 16, 1 << 20, cache=cache)
    yield front, back, cache
    assert front.live_blocks() == 0
    assert back.live_blocks() == 0
    cache.close()
    front.close_and_unlink()
    back.close_and_unlink()


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "acc.onnx"
    accumulator_onnx(path)
    return path


def _value(answer: dict[str, Any], name: str = "OUTPUT") -> Any:
    assert "error" not in answer, answer
    return answer[name].reshape(-1)[0]


# --------------------------------------------------------------------------- state


@pytest.mark.parametrize(
    ("corrid", "ids"), [("UINT64", (7, 2**64 - 2)), ("BYTES", ("seq-a", "seq-b"))]
)
def test_two_interleaved_sequences_each_carry_their_own_state(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache],
    tmp_path: Path,
    corrid: str,
    ids: tuple[int | str, int | str],
) -> None:
    path = tmp_path / "acc.onnx"
    accumulator_onnx(path, corrid=corrid)
    client, _, _ = make_client(arenas, acc_spec(path, corrid=corrid))
    a, b = ids
    # Direct: sequence a in slot 0, b in slot 1; batches mix them and leave slots empty
    r = client.run([client.request(a, 1, START), client.request(b, 10, START)], 2, (0, 1))
    assert [_value(x) for x in r] == [1, 10]
    r = client.run([client.request(b, 20)], 2, (1,))
    assert [_value(x) for x in r] == [30]
    r = client.run([client.request(a, 2)], 2, (0,))
    assert [_value(x) for x in r] == [3]
    r = client.run([client.request(b, 30, END), client.request(a, 3, END)], 2, (1, 0))
    assert [_value(x) for x in r] == [60, 6]
    assert client.worker._states is not None
    assert len(client.worker._states) == 0  # both ended

    # an ended sequence has no state left: a later request starts from the initial state
    r = client.run([client.request(a, 5)], 2, (0,))
    assert [_value(x) for x in r] == [5]


def test_oldest_strategy_rows_follow_the_requests(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache], model_file: Path
) -> None:
    client, _, recorder = make_client(arenas, acc_spec(model_file, strategy="oldest"))
    r = client.run([client.request(1, 1, START), client.request(2, 100, START)])
    assert [_value(x) for x in r] == [1, 100]
    # another order, another batch size: each request still gets its own sequence's state
    r = client.run([client.request(2, 100), client.request(3, 7, START), client.request(1, 1)])
    assert [_value(x) for x in r] == [200, 7, 2]
    feeds = recorder.feeds[-1]
    assert feeds["READY"].tolist() == [[True], [True], [True]]
    assert feeds["START"].tolist() == [[0], [1], [0]]
    assert feeds["CORRID"].tolist() == [[2], [3], [1]]


def test_state_is_not_returned_unless_requested(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache], model_file: Path
) -> None:
    client, _, _ = make_client(arenas, acc_spec(model_file))
    (r,) = client.run([client.request(4, 2, START)])
    assert set(r) == {"OUTPUT"}
    (r,) = client.run([client.request(4, 3, outputs=("OUTPUT", "STATE_OUT"))])
    assert set(r) == {"OUTPUT", "STATE_OUT"}
    assert _value(r, "STATE_OUT") == 5
    (r,) = client.run([client.request(4, 1, END, outputs=("STATE_OUT",))])
    assert set(r) == {"STATE_OUT"}
    assert _value(r, "STATE_OUT") == 6


def test_start_resets_a_live_sequence_to_the_initial_state(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache], model_file: Path
) -> None:
    client, _, _ = make_client(arenas, acc_spec(model_file))
    client.run([client.request(9, 5, START)])
    client.run([client.request(9, 5)])
    (r,) = client.run([client.request(9, 1, START)])
    assert _value(r) == 1


def test_released_sequences_lose_their_state(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache], model_file: Path
) -> None:
    client, _, _ = make_client(arenas, acc_spec(model_file))
    client.run([client.request(1, 5, START), client.request(2, 50, START)], 2, (0, 1))
    client.run([client.request("s", 7, START)], 2, (1,), released=(2,))
    # sequence 1 was not released: it goes on; 2's next request finds no state
    r = client.run([client.request(1, 1), client.request(2, 1)], 2, (0, 1))
    assert [_value(x) for x in r] == [6, 1]
    # a batch may release an ID and START a new sequence under it at once
    r = client.run([client.request("s", 1, START)], 2, (1,), released=("s",))
    assert [_value(x) for x in r] == [1]
    # released without any request to run: the state still goes
    client.run([], released=(1, "s"))
    r = client.run([client.request(1, 1), client.request("s", 1)], 2, (0, 1))
    assert [_value(x) for x in r] == [1, 1]


def test_an_end_request_that_fails_still_ends_its_state(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache], model_file: Path
) -> None:
    class FailOnce:
        def __init__(self, real: OnnxRuntimeBackend) -> None:
            self.real = real
            self.fail = False

        def execute(
            self, requests: Sequence[BackendRequest], sequence: SequenceBatch | None = None
        ) -> tuple[list[Result], PhaseTimes]:
            if self.fail:
                self.fail = False
                raise RuntimeError("boom")
            return self.real.execute(requests, sequence)

        def close(self) -> None:
            pass

    front, back, cache = arenas
    model = acc_spec(model_file)
    real = OnnxRuntimeBackend(model, INSTANCE)
    flaky = FailOnce(real)
    client, _, _ = make_client(arenas, model, backend=flaky)
    client.run([client.request(1, 5, START), client.request(2, 5, START)], 2, (0, 1))
    flaky.fail = True
    r = client.run([client.request(1, 1, END), client.request(2, 1)], 2, (0, 1))
    assert r == [{"error": "RuntimeError: boom"}] * 2
    # 1 ended (its state is gone); 2 failed mid-sequence and keeps its last state
    r = client.run([client.request(1, 1), client.request(2, 1)], 2, (0, 1))
    assert [_value(x) for x in r] == [1, 6]


# --------------------------------------------------------------------------- null rows


def test_direct_null_rows_are_fed_with_ready_false_and_not_returned(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache], model_file: Path
) -> None:
    client, _, recorder = make_client(arenas, acc_spec(model_file))
    client.run([client.request(5, 1, START), client.request(6, 10, START)], 4, (1, 3))
    r = client.run([client.request(6, 2, END, outputs=("OUTPUT", "END_OUT", "READY_OUT"))], 4, (3,))
    assert len(r) == 1
    assert _value(r[0]) == 12
    assert _value(r[0], "END_OUT") == 1.0
    assert bool(_value(r[0], "READY_OUT"))

    first, second = recorder.feeds
    assert first["INPUT"].shape == (4, 1)
    assert first["READY"].tolist() == [[False], [True], [False], [True]]
    assert first["START"].tolist() == [[0], [1], [0], [1]]
    assert first["END"].tolist() == [[0.0], [0.0], [0.0], [0.0]]
    assert first["CORRID"].tolist() == [[0], [5], [0], [6]]
    assert first["CORRID"].dtype == np.uint64
    # null rows carry a real request's data (garbage the model must ignore)
    assert first["INPUT"].tolist() == [[1.0], [1.0], [1.0], [10.0]]

    assert second["READY"].tolist() == [[False], [False], [False], [True]]
    assert second["END"].tolist() == [[0.0], [0.0], [0.0], [1.0]]
    assert second["STATE_IN"][3].tolist() == [10.0]
    assert second["CORRID"].tolist() == [[0], [0], [0], [6]]


def test_a_request_that_fails_before_the_run_leaves_a_null_row(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache], model_file: Path
) -> None:
    client, _, recorder = make_client(arenas, acc_spec(model_file))
    good = client.request(1, 3, START)
    bad = client.request(2, 4, START)
    # the input of the second request points into a client region that does not exist
    bad_input = TensorRef("INPUT", "FP32", (1, 1), f"/triton_mp_{PID}_test_gone", 0, 4, 99)
    broken = InferRequest(
        request_id=bad.request_id,
        reply_to=ReplyTo(Requester.FRONTEND, 0),
        model="acc",
        version=1,
        batch_size=1,
        inputs=(bad_input,),
        outputs=("OUTPUT",),
        block=bad.block,
        arrival_ns=0,
        sequence_id=2,
        sequence_flags=START,
    )
    r = client.run([good, broken], 2, (0, 1))
    assert _value(r[0]) == 3
    assert "Unable to map shared memory object" in r[1]["error"]
    (feeds,) = recorder.feeds
    assert feeds["READY"].tolist() == [[True], [False]]
    assert client.done[-1].failed == (1,)


def test_slots_that_do_not_fit_the_batch_fail_it(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache], model_file: Path
) -> None:
    client, _, _ = make_client(arenas, acc_spec(model_file))
    r = client.run([client.request(1, 1, START), client.request(2, 1, START)], 2, (1, 1))
    assert all("rows overlap" in x["error"] for x in r)
    r = client.run([client.request(1, 1, START)], 2, (0, 1))
    assert "has 1 requests but 2 slots" in r[0]["error"]


# --------------------------------------------------------------------------- initial state


def test_initial_state_from_a_data_file_starts_each_sequence(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache],
    model_file: Path,
    tmp_path: Path,
) -> None:
    data = tmp_path / "initial_state" / "acc.bin"
    data.parent.mkdir()
    data.write_bytes(np.array([100.0], "<f4").tobytes())
    client, _, _ = make_client(arenas, acc_spec(model_file, initial="file", data_file=str(data)))
    r = client.run([client.request(1, 1, START), client.request(2, 2, START)], 2, (0, 1))
    assert [_value(x) for x in r] == [101, 102]
    r = client.run([client.request(1, 1, END)], 2, (0,))
    assert [_value(x) for x in r] == [102]


def test_a_bad_initial_state_file_fails_the_load(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache],
    model_file: Path,
    tmp_path: Path,
) -> None:
    data = tmp_path / "short.bin"
    data.write_bytes(b"\0\0")
    with pytest.raises(ConfigError, match="is 2 bytes, expected 4"):
        make_client(arenas, acc_spec(model_file, initial="file", data_file=str(data)))


def test_a_model_without_batching_gets_shape_1_controls_and_state(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache], tmp_path: Path
) -> None:
    path = tmp_path / "acc0.onnx"
    accumulator_onnx(path, batched=False, corrid="BYTES")
    client, _, recorder = make_client(arenas, acc_spec(path, batched=False, corrid="BYTES"))
    outputs = ("OUTPUT", "CORRID_OUT", "START_OUT")
    (r,) = client.run([client.request("x", 2, START, outputs=outputs)])
    assert _value(r) == 2
    assert r["CORRID_OUT"].tolist() == [b"x"]
    assert r["START_OUT"].tolist() == [1]
    (r,) = client.run([client.request("x", 3, END)])
    assert _value(r) == 5
    first, second = recorder.feeds
    assert first["STATE_IN"].shape == (1,)
    assert first["READY"].shape == (1,)
    assert second["START"].tolist() == [0]
    assert second["END"].tolist() == [1.0]


# --------------------------------------------------------------------------- loading


@pytest.mark.parametrize(
    ("leave_out", "message"),
    [
        ("READY", r"sequence control 'READY' \(READY\) but the model does not provide that"),
        ("STATE_IN", "state input 'STATE_IN' but the model does not provide it"),
    ],
)
def test_a_graph_without_a_control_or_state_input_fails_to_load(
    tmp_path: Path, leave_out: str, message: str
) -> None:
    path = tmp_path / "acc.onnx"
    accumulator_onnx(path, leave_out=leave_out)
    model = acc_spec(path)
    if leave_out == "READY":
        outputs = tuple(t for t in model.outputs if t.name != "READY_OUT")
        model = msgspec_replace(model, outputs=outputs)
    with pytest.raises(ConfigError, match=message):
        OnnxRuntimeBackend(model, INSTANCE)


def test_a_control_of_another_type_or_rank_fails_to_load(tmp_path: Path) -> None:
    path = tmp_path / "acc.onnx"
    accumulator_onnx(path, corrid="UINT64")
    bad_type = acc_spec(path, corrid="INT32")
    bad_type = msgspec_replace(
        bad_type,
        outputs=tuple(t for t in bad_type.outputs if t.name != "CORRID_OUT"),
    )
    with pytest.raises(ConfigError, match="TYPE_INT32 for sequence control 'CORRID'"):
        OnnxRuntimeBackend(bad_type, INSTANCE)
    # the unbatched graph's [1] controls do not fit a batching model's [-1, 1]
    flat = tmp_path / "flat.onnx"
    accumulator_onnx(flat, batched=False)
    with pytest.raises(ConfigError, match=r"dims \[-1, 1\] \(batch dimension included\)"):
        OnnxRuntimeBackend(acc_spec(flat), INSTANCE)


def test_a_state_of_another_type_fails_to_load(tmp_path: Path) -> None:
    path = tmp_path / "acc.onnx"
    accumulator_onnx(path)
    model = acc_spec(path)
    assert model.sequence is not None
    (state,) = model.sequence.states
    seq = msgspec_replace(model.sequence, states=(msgspec_replace(state, datatype="INT32"),))
    with pytest.raises(ConfigError, match="TYPE_INT32 for state input 'STATE_IN'"):
        OnnxRuntimeBackend(msgspec_replace(model, sequence=seq), INSTANCE)


# --------------------------------------------------------------------------- from a repository

ACC_CONFIG = """
backend: "onnxruntime"
max_batch_size: 4
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "STATE_IN"
      output_name: "STATE_OUT"
      data_type: TYPE_FP32
      dims: [ 1 ]
      initial_state: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zeros" }
    }
  ]
}
"""


def test_a_repository_sequence_model_loads_and_runs_in_a_worker(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache], tmp_path: Path
) -> None:
    """config.pbtxt -> repository (auto-complete leaves controls and state out of the client
    inputs) -> supervisor's ModelVersionSpec -> onnxruntime backend and Worker."""
    model_dir = tmp_path / "repo" / "acc"
    (model_dir / "1").mkdir(parents=True)
    accumulator_onnx(model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(ACC_CONFIG)
    (repo_model,) = load_repository(tmp_path / "repo")
    assert repo_model.error is None, repo_model.error
    (plan,), _ = plan_models([repo_model])
    (model,) = plan.versions
    assert [t.name for t in model.inputs] == ["INPUT"]
    assert model.sequence is not None
    assert [(c.name, c.kind, c.datatype) for c in model.sequence.controls] == [
        ("START", "START", "INT32"),
        ("END", "END", "FP32"),
        ("READY", "READY", "BOOL"),
        ("CORRID", "CORRID", "UINT64"),
    ]
    client, _, recorder = make_client(arenas, model)
    r = client.run([client.request(3, 2, START), client.request(4, 5, START)], 2, (0, 1))
    assert [_value(x) for x in r] == [2, 5]
    r = client.run([client.request(4, 1, END)], 2, (1,))
    assert [_value(x) for x in r] == [6]
    assert recorder.feeds[-1]["READY"].tolist() == [[False], [True]]
