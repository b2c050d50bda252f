"""The pure ensemble scheduler: event-driven steps, reference-counted blocks, errors."""

from __future__ import annotations

from triton_mp.common.errors import ErrorCode
from triton_mp.scheduler.policies.ensemble import (
    Call,
    Complete,
    EnsembleScheduler,
    Fail,
    Release,
    Step,
)

PIPE = [
    Step("pre", -1, (("IN", "raw"),), (("OUT", "x"),)),
    Step("cls", -1, (("x", "x"),), (("y", "y"),)),
    Step("post", -1, (("Y", "y"),), (("LABEL", "label"),)),
]
BRANCHES = [
    Step("a", -1, (("IN", "in"),), (("OUT", "mid"),)),
    Step("b", -1, (("IN", "mid"),), (("OUT", "left"),)),
    Step("c", -1, (("IN", "mid"),), (("OUT", "right"),)),
    Step("join", -1, (("L", "left"), ("R", "right")), (("OUT", "out"),)),
]


def _calls(actions):
    return [a for a in actions if isinstance(a, Call)]


def test_a_pipeline_runs_step_by_step_and_frees_each_intermediate_after_its_consumer() -> None:
    ens = EnsembleScheduler("pipe", PIPE, ["label"])
    (c1,) = _calls(ens.start("r", {"raw": "raw-ref"}))
    assert c1.step == 0
    assert c1.inputs == (("IN", "raw-ref"),)
    assert c1.outputs == ("OUT",)
    acts = ens.respond(c1.call_id, {"OUT": "x-ref"}, "B1", final=True)
    (c2,) = _calls(acts)
    assert c2.inputs == (("x", "x-ref"),)
    assert not [a for a in acts if isinstance(a, Release)]  # x still needed by cls
    acts = ens.respond(c2.call_id, {"y": "y-ref"}, "B2", final=True)
    assert Release("B1") in acts  # cls has read x
    (c3,) = _calls(acts)
    acts = ens.respond(c3.call_id, {"LABEL": "l-ref"}, "B3", final=True)
    assert Release("B2") in acts
    (done,) = [a for a in acts if isinstance(a, Complete)]
    assert done.outputs == {"label": "l-ref"}
    assert done.blocks == ("B3",)
    assert done.final
    assert Release("B3") not in acts  # it travels with the response
    assert ens.live_blocks() == 0
    assert ens.request_count() == 0


def test_one_tensor_feeds_two_branches_at_once_and_is_freed_after_both() -> None:
    ens = EnsembleScheduler("two", BRANCHES, ["out"])
    (a,) = _calls(ens.start("r", {"in": "i"}))
    acts = ens.respond(a.call_id, {"OUT": "mid"}, "A", final=True)
    b, c = _calls(acts)
    assert {b.step, c.step} == {1, 2}
    acts = ens.respond(b.call_id, {"OUT": "left"}, "B", final=True)
    assert Release("A") not in acts
    assert not _calls(acts)
    acts = ens.respond(c.call_id, {"OUT": "right"}, "C", final=True)
    assert Release("A") in acts
    (j,) = _calls(acts)
    assert dict(j.inputs) == {"L": "left", "R": "right"}
    acts = ens.respond(j.call_id, {"OUT": "o"}, "J", final=True)
    assert Release("B") in acts
    assert Release("C") in acts
    assert [a for a in acts if isinstance(a, Complete)][0].blocks == ("J",)
    assert ens.live_blocks() == 0


def test_a_failing_step_fails_the_request_once_nothing_is_in_flight() -> None:
    ens = EnsembleScheduler("two", BRANCHES, ["out"])
    (a,) = _calls(ens.start("r", {"in": "i"}))
    b, c = _calls(ens.respond(a.call_id, {"OUT": "mid"}, "A", final=True))
    acts = ens.respond(b.call_id, None, None, True, (ErrorCode.INTERNAL, "boom"))
    assert not [x for x in acts if isinstance(x, Fail)]  # c still runs
    acts = ens.respond(c.call_id, {"OUT": "right"}, "C", final=True)
    (fail,) = [x for x in acts if isinstance(x, Fail)]
    assert fail.message == "in ensemble 'two', boom"
    assert fail.code is ErrorCode.INTERNAL
    assert not _calls(acts)
    assert Release("A") in acts
    assert Release("C") in acts
    assert ens.live_blocks() == 0
    assert ens.request_count() == 0


def test_an_output_a_step_leaves_out_is_a_placeholder_the_next_step_is_called_with() -> None:
    """Core ConsumeResponse's ``AddTensor(nullptr)``: the next step is called (its model's
    input check decides), and the block of an answer with no output is freed at once."""
    ens = EnsembleScheduler("pipe", PIPE, ["label"])
    (c1,) = _calls(ens.start("r", {"raw": "raw"}))
    acts = ens.respond(c1.call_id, {}, "B1", final=True)
    assert Release("B1") in acts
    (c2,) = _calls(acts)
    assert c2.inputs == (("x", None),)
    acts = ens.respond(c2.call_id, None, None, True, (ErrorCode.INVALID_ARG, "no input"))
    (fail,) = [x for x in acts if isinstance(x, Fail)]
    assert fail.message == "in ensemble 'pipe', no input"
    assert ens.live_blocks() == 0


def test_a_last_step_that_leaves_the_output_out_completes_with_a_placeholder() -> None:
    ens = EnsembleScheduler("pipe", PIPE[:1], ["x"])
    (c1,) = _calls(ens.start("r", {"raw": "raw"}))
    acts = ens.respond(c1.call_id, {}, "B1", final=True)
    (done,) = [a for a in acts if isinstance(a, Complete)]
    assert (done.outputs, done.blocks, done.final) == ({"x": None}, (), True)
    assert Release("B1") in acts
    assert ens.live_blocks() == 0
    assert ens.request_count() == 0


def test_no_response_at_all_in_an_ensemble_that_is_not_decoupled_is_a_deadlock() -> None:
    steps = [Step("pre", -1, (("IN", "raw"),), (("OUT", "x"),), decoupled=True)]
    ens = EnsembleScheduler("pipe", steps, ["x"])
    (c1,) = _calls(ens.start("r", {"raw": "raw"}, label="[request id: 7] "))
    acts = ens.respond(c1.call_id, None, None, final=True)
    (fail,) = [x for x in acts if isinstance(x, Fail)]
    assert fail.message == (
        "in ensemble 'pipe', [request id: 7] unexpected deadlock, at least one output is not "
        "set while no more ensemble steps can be made"
    )
    assert fail.code is ErrorCode.INVALID_ARG


def test_max_inflight_requests_holds_calls_back_per_step_and_drops_none() -> None:
    ens = EnsembleScheduler("pipe", PIPE[:1], ["x"], max_inflight_requests=2)
    calls = [c for i in range(5) for c in _calls(ens.start(i, {"raw": i}))]
    assert len(calls) == 2
    assert ens.waiting() == [3]
    assert ens.step_inflight == [2]
    finished = 0
    while calls:
        call = calls.pop(0)
        acts = ens.respond(call.call_id, {"OUT": call.call_id}, f"B{call.call_id}", True)
        finished += len([a for a in acts if isinstance(a, Complete)])
        calls.extend(_calls(acts))
        assert ens.step_inflight[0] <= 2
    assert finished == 5
    assert ens.waiting() == [0]


def test_each_response_of_a_decoupled_step_drives_the_next_steps_once() -> None:
    steps = [
        Step("gen", -1, (("IN", "in"),), (("OUT", "tok"),), decoupled=True),
        Step("post", -1, (("IN", "tok"),), (("OUT", "out"),)),
    ]
    ens = EnsembleScheduler("stream", steps, ["out"], decoupled=True)
    (g,) = _calls(ens.start("r", {"in": "i"}))
    responses = []
    for n in range(3):
        (p,) = _calls(ens.respond(g.call_id, {"OUT": f"t{n}"}, f"G{n}", final=False))
        acts = ens.respond(p.call_id, {"OUT": f"o{n}"}, f"P{n}", final=True)
        assert Release(f"G{n}") in acts
        responses += [a for a in acts if isinstance(a, Complete)]
    assert [r.outputs["out"] for r in responses] == ["o0", "o1", "o2"]
    assert not any(r.final for r in responses)
    acts = ens.respond(g.call_id, None, None, final=True)
    assert acts == [Complete("r", {}, (), final=True)]
    assert ens.live_blocks() == 0
    assert ens.request_count() == 0


def test_abort_fails_a_request_whose_calls_end() -> None:
    ens = EnsembleScheduler("pipe", PIPE, ["label"])
    (c1,) = _calls(ens.start("r", {"raw": "raw"}))
    inflight, acts = ens.abort("r", ErrorCode.CANCELLED, "Request was cancelled")
    assert inflight == [c1.call_id]
    assert acts == []
    acts = ens.respond(c1.call_id, {"OUT": "x"}, "B1", final=True)
    assert not _calls(acts)
    assert Release("B1") in acts
    (fail,) = [a for a in acts if isinstance(a, Fail)]
    assert fail.code is ErrorCode.CANCELLED


FORK = [
    Step("a", -1, (("IN", "in"),), (("OUT", "mid"),)),
    Step("b", -1, (("IN", "mid"),), (("OUT", "left"),)),
    Step("c", -1, (("IN", "mid"),), (("OUT", "right"),)),
]


def test_steps_no_requested_output_depends_on_are_pruned_as_triton_prunes_them() -> None:
    ens = EnsembleScheduler("fork", FORK, ["left", "right"])
    assert ens.pruned({"left", "right"}) == frozenset()
    assert ens.pruned({"left"}) == {2}
    # NOTE: pruning walks back: "mid" read only by pruned steps prunes its maker too.
    chain = [FORK[0], FORK[1], Step("d", -1, (("IN", "in"),), (("OUT", "other"),))]
    assert EnsembleScheduler("chain", chain, ["left", "other"]).pruned({"other"}) == {0, 1}


def test_a_request_for_one_output_never_calls_the_step_of_the_other() -> None:
    ens = EnsembleScheduler("fork", FORK, ["left", "right"])
    (a,) = _calls(ens.start("r", {"in": "i"}, outputs=("left",)))
    acts = ens.respond(a.call_id, {"OUT": "mid"}, "A", final=True)
    (b,) = _calls(acts)
    assert b.step == 1
    acts = ens.respond(b.call_id, {"OUT": "left"}, "B", final=True)
    assert Release("A") in acts
    (done,) = [x for x in acts if isinstance(x, Complete)]
    assert (done.outputs, done.blocks, done.final) == ({"left": "left"}, ("B",), True)
    assert ens.live_blocks() == 0
    assert ens.request_count() == 0
    (a,) = _calls(ens.start("r2", {"in": "i"}))  # none named: every output, no pruning
    assert len(_calls(ens.respond(a.call_id, {"OUT": "mid"}, "A2", final=True))) == 2


def test_a_requested_output_that_only_pruned_steps_read_keeps_its_maker() -> None:
    """branches asked for OUTPUT1 alone (its first step's output, read by the pruned
    others): 2.51 prunes that step too and answers "unexpected deadlock"; we answer."""
    steps = [
        Step("add", -1, (("IN", "in"),), (("OUT", "out1"),)),
        Step("scale", -1, (("IN", "out1"),), (("OUT", "left"),)),
        Step("sub", -1, (("IN", "out1"),), (("OUT", "right"),)),
        Step("join", -1, (("L", "left"), ("R", "right")), (("OUT", "out0"),)),
    ]
    ens = EnsembleScheduler("branches", steps, ["out0", "out1"])
    assert ens.pruned({"out1"}) == {1, 2, 3}
    (a,) = _calls(ens.start("r", {"in": "i"}, outputs=("out1",)))
    acts = ens.respond(a.call_id, {"OUT": "o1"}, "A", final=True)
    assert not _calls(acts)
    (done,) = [x for x in acts if isinstance(x, Complete)]
    assert (done.outputs, done.blocks, done.final) == ({"out1": "o1"}, ("A",), True)
    assert ens.live_blocks() == 0


def test_an_unrequested_output_a_kept_step_reads_keeps_its_maker() -> None:
    """A diamond: step 0 makes Y (an output), step 1 reads Y to make S; asked for S alone,
    core prunes step 0 (Y is not asked for) while step 1 waits for Y: 2.51 answers
    "unexpected deadlock". Triton's docs skip only steps no requested output depends on."""
    steps = [
        Step("make", -1, (("IN", "in"),), (("OUT", "y"),)),
        Step("read", -1, (("IN", "y"),), (("OUT", "s"),)),
        Step("side", -1, (("IN", "in"),), (("OUT", "t"),)),
    ]
    ens = EnsembleScheduler("diamond", steps, ["y", "s", "t"])
    assert ens.pruned({"s"}) == {2}
    assert ens.pruned({"y"}) == {1, 2}
    (a,) = _calls(ens.start("r", {"in": "i"}, outputs=("s",)))
    assert a.step == 0
    (b,) = _calls(ens.respond(a.call_id, {"OUT": "y0"}, "A", final=True))
    assert b.step == 1
    acts = ens.respond(b.call_id, {"OUT": "s0"}, "B", final=True)
    (done,) = [x for x in acts if isinstance(x, Complete)]
    assert (done.outputs, done.final) == ({"s": "s0"}, True)
    assert ens.request_count() == 0
    assert ens.live_blocks() == 0
