"""Triton's ValidateEnsembleConfig (ensemble_utils.cc) against composing configs, with its
messages; and the supervisor's ensemble dependencies (polling chain, cycles, dependents)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ConfigError, ErrorCode
from triton_mp.model_config.ensemble import validate_ensemble_config
from triton_mp.supervisor.models.ensemble_deps import (
    broken_dependents,
    check_ensembles,
    composing_failure,
    composing_to_load,
    dependents,
    ensemble_load_failure,
    reloadable,
    unused_steps,
)


def _cfg(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


ADD = _cfg(
    'name: "add" backend: "python" max_batch_size: 8 '
    'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
    '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ] '
    'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]'
)
GEN = _cfg(
    'name: "gen" backend: "python" max_batch_size: 0 '
    "model_transaction_policy { decoupled: true } "
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 4 ] } ] '
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]'
)


def _ensemble(
    steps: str, mbs: int = 8, in_type: str = "TYPE_FP32", dims: str = "4"
) -> mc.ModelConfig:
    return _cfg(
        f'name: "ens" platform: "ensemble" max_batch_size: {mbs} '
        f'input [ {{ name: "I0" data_type: {in_type} dims: [ {dims} ] }}, '
        '{ name: "I1" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'output [ { name: "O" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        f"ensemble_scheduling {{ {steps} }}"
    )


def _add(a: str = "A", b: str = "B", out: str = "OUT", src: str = "I0", dst: str = "O") -> str:
    return (
        f'step [ {{ model_name: "add" model_version: -1 input_map {{ key: "{a}" value: "{src}" }} '
        f'input_map {{ key: "{b}" value: "I1" }} output_map {{ key: "{out}" value: "{dst}" }} }} ]'
    )


def test_a_fitting_ensemble_passes_and_is_not_decoupled() -> None:
    assert validate_ensemble_config(_ensemble(_add()), {"add": ADD}) is False


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            _ensemble(_add(a="NOPE")),
            "in ensemble ens, ensemble tensor I0 is mapping to non-existing input NOPE in "
            "model add",
        ),
        (
            _ensemble(
                'step [ { model_name: "add" input_map { key: "A" value: "I0" } '
                'output_map { key: "OUT" value: "O" } } ]'
            ),
            "in ensemble ens, input B in model add is not mapped to any ensemble tensors",
        ),
        (
            _ensemble(_add(out="GONE")),
            "in ensemble ens, ensemble tensor O is mapped from non-existing output GONE in "
            "model add",
        ),
        (
            _ensemble(_add(), mbs=16),
            "ensemble ens allows maximum batch size 16, but it contains model add which only "
            "allows maximum batch size to be 8",
        ),
        (
            _ensemble(_add(), in_type="TYPE_INT32"),
            "in ensemble ens, ensemble tensor I0: inconsistent data type: TYPE_INT32 is "
            "inferred from model ens while TYPE_FP32 is inferred from model add",
        ),
        (
            _ensemble(_add(), dims="5"),
            "in ensemble ens, ensemble tensor I0: inconsistent shape: [-1,5] is inferred from "
            "model ens while [-1,4] is inferred from model add",
        ),
    ],
)
def test_what_triton_refuses_it_refuses_with_triton_s_message(
    config: mc.ModelConfig, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        validate_ensemble_config(config, {"add": ADD})
    assert info.value.message == message


def test_a_non_batching_model_fits_a_batching_ensemble_by_its_full_shape() -> None:
    flat = _cfg(
        'name: "add" backend: "python" max_batch_size: 0 '
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ -1, 4 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ -1, 4 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]'
    )
    assert validate_ensemble_config(_ensemble(_add()), {"add": flat}) is False


def test_a_decoupled_step_makes_the_ensemble_decoupled_and_two_cannot_meet() -> None:
    one = _cfg(
        'name: "ens" platform: "ensemble" max_batch_size: 0 '
        'input [ { name: "I" data_type: TYPE_FP32 dims: [ -1, 4 ] } ] '
        'output [ { name: "O" data_type: TYPE_FP32 dims: [ -1, 4 ] } ] '
        'ensemble_scheduling { step [ { model_name: "gen" input_map { key: "X" value: "I" } '
        'output_map { key: "Y" value: "O" } } ] }'
    )
    assert validate_ensemble_config(one, {"gen": GEN}) is True
    two = _cfg(
        'name: "ens" platform: "ensemble" max_batch_size: 0 '
        'input [ { name: "I" data_type: TYPE_FP32 dims: [ -1, 4 ] } ] '
        'output [ { name: "O" data_type: TYPE_FP32 dims: [ -1, 4 ] } ] '
        "ensemble_scheduling { step [ "
        '{ model_name: "gen" input_map { key: "X" value: "I" } '
        'output_map { key: "Y" value: "a" } }, '
        '{ model_name: "gen" input_map { key: "X" value: "I" } '
        'output_map { key: "Y" value: "b" } }, '
        '{ model_name: "add2" input_map { key: "A" value: "a" } input_map { key: "B" value: "b" } '
        'output_map { key: "OUT" value: "O" } } ] }'
    )
    add2 = _cfg(
        'name: "add2" backend: "python" max_batch_size: 0 '
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ -1, 4 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ -1, 4 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]'
    )
    with pytest.raises(ConfigError) as info:
        validate_ensemble_config(two, {"gen": GEN, "add2": add2})
    # NOTE: as in Triton, the node of an ensemble output keeps the ensemble's name.
    assert info.value.message == (
        "in ensemble ens, step of model 'ens' receives inputs originated from different "
        "decoupled models"
    )


def test_the_polling_chain_names_every_composing_model_not_staged() -> None:
    """Served or not: core's PollModels polls them all again (a changed one reloads)."""
    ens = _ensemble(_add())
    assert composing_to_load({"ens": ens}) == ["add"]
    assert composing_to_load({"ens": ens, "add": ADD}) == []


def _calls(*models: str) -> mc.ModelConfig:
    """An ensemble whose steps call ``models`` (only its steps matter here)."""
    steps = " ".join(f'step [ {{ model_name: "{m}" model_version: -1 }} ]' for m in models)
    return _cfg(f'platform: "ensemble" ensemble_scheduling {{ {steps} }}')


def test_unload_dependents_takes_the_steps_nothing_else_holds() -> None:
    """core DependencyGraph::RemoveNodes, cascading: a step goes unless loaded by name or
    called by an ensemble left (served, or waiting for its steps); nested ones follow."""
    outer, inner, other = _calls("inner", "a"), _calls("b", "c"), _calls("c")
    served = {"outer": outer, "inner": inner, "a": ADD, "b": ADD, "c": ADD, "other": other}
    assert unused_steps({"outer": outer}, served, {}, ()) == ["inner", "a", "b"]
    assert unused_steps({"outer": outer}, served, {}, ("a", "inner")) == []
    assert unused_steps({"outer": outer}, served, {"late": ["b"]}, ()) == ["inner", "a"]
    gone = {n: c for n, c in served.items() if n != "other"}
    assert unused_steps({"outer": outer}, gone, {}, ()) == ["inner", "a", "b", "c"]
    assert unused_steps({"other": other}, served, {}, ()) == []
    assert unused_steps({"a": ADD}, served, {}, ()) == []


def test_check_ensembles_sets_decoupled_and_names_what_is_missing_or_invalid() -> None:
    ens = _ensemble(_add())
    assert check_ensembles({"ens": ens, "add": ADD}, {}, {}) == {}
    assert check_ensembles({"ens": _ensemble(_add())}, {}, {}) == {
        "ens": "ensemble ens contains models that are not available: add"
    }
    assert check_ensembles({"ens": _ensemble(_add())}, {"add": "bad config"}, {}) == {
        "ens": "ensemble 'ens' depends on 'add' which is not valid. Model 'add' failed with "
        "error: bad config"
    }
    assert check_ensembles({"ens": _ensemble(_add())}, {}, {"add": ADD}) == {}
    outer = _cfg(
        'name: "outer" platform: "ensemble" max_batch_size: 8 '
        'input [ { name: "I0" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "I1" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'output [ { name: "O" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'ensemble_scheduling { step [ { model_name: "ens" input_map { key: "I0" value: "I0" } '
        'input_map { key: "I1" value: "I1" } output_map { key: "O" value: "O" } } ] }'
    )
    assert check_ensembles({"outer": outer, "ens": _ensemble(_add())}, {}, {"add": ADD}) == {}


def test_dependents_are_found_through_nested_ensembles() -> None:
    outer = _cfg(
        'name: "outer" platform: "ensemble" ensemble_scheduling { step [ { model_name: "ens" } ] }'
    )
    served = {"ens": _ensemble(_add()), "outer": outer, "add": ADD}
    assert dependents(["add"], served) == ["ens", "outer"]
    assert dependents(["ens"], served) == ["outer"]
    assert dependents(["outer"], served) == []


def test_a_reload_that_no_longer_fits_a_served_ensemble_breaks_it_and_its_outer_one() -> None:
    """2.51 checks the served ensembles that call a loaded model again and unloads those that
    fail (r13's F2: ident_py reloaded with max_batch_size 4 under an ensemble of 8)."""
    outer = _cfg(
        'name: "outer" platform: "ensemble" max_batch_size: 8 '
        'input [ { name: "I0" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "I1" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'output [ { name: "O" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'ensemble_scheduling { step [ { model_name: "ens" input_map { key: "I0" value: "I0" } '
        'input_map { key: "I1" value: "I1" } output_map { key: "O" value: "O" } } ] }'
    )
    smaller = mc.ModelConfig()
    smaller.CopyFrom(ADD)
    smaller.max_batch_size = 4
    fits = {"add": ADD, "ens": _ensemble(_add()), "outer": outer}
    assert broken_dependents(["add"], fits) == {}
    broken = broken_dependents(["add"], {**fits, "add": smaller})
    assert broken == {
        "ens": "ensemble ens allows maximum batch size 8, but it contains model add which "
        "only allows maximum batch size to be 4",
        "outer": "ensemble 'outer' depends on 'ens' which is not valid. Model 'ens' failed "
        "with error: ensemble ens allows maximum batch size 8, but it contains model add "
        "which only allows maximum batch size to be 4",
    }


def test_a_step_s_model_or_version_that_did_not_come_up_fails_the_ensemble() -> None:
    ens = _ensemble(_add())
    assert composing_failure("ens", ens, {"add": {1}}) == ""
    assert composing_failure("ens", ens, {"add": set()}) == (
        "ensemble 'ens' depends on 'add' which has no loaded version."
    )
    pinned = _ensemble(_add().replace("model_version: -1", "model_version: 2"))
    assert composing_failure("ens", pinned, {"add": {1}}) == (
        "ensemble 'ens' depends on 'add' whose required version 2 is not loaded."
    )
    # NOTE: an omitted model_version is 0, a version like any other (Triton 2.51 too).
    omitted = _ensemble(_add().replace("model_version: -1", ""))
    assert composing_failure("ens", omitted, {"add": {1}}) == (
        "ensemble 'ens' depends on 'add' whose required version 0 is not loaded."
    )
    assert composing_failure("ens", omitted, {"add": {0}}) == ""
    answer = ensemble_load_failure("ens", "why.")
    assert (answer.code, answer.message) == (
        ErrorCode.INVALID_ARG,
        "load failed for model 'ens': why.\n",
    )


def test_an_ensemble_a_step_s_unload_took_down_reloads_once_all_its_steps_serve() -> None:
    # NOTE: 2.51 loads pipe3 again when the last of add_py and scale_py loads again
    orphans = {"pipe3": ("scale_py", "add_py"), "outer": ("pipe3",), "solo": ()}
    assert reloadable(orphans, ["add_py"]) == ["solo"]
    assert reloadable(orphans, ["add_py", "scale_py", "other"]) == ["pipe3", "solo"]
    assert reloadable(orphans, ["add_py", "scale_py", "pipe3"]) == ["outer", "pipe3", "solo"]
    assert reloadable({}, ["add_py"]) == []
