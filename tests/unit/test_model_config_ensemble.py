"""Unit tests for model_config.ensemble.ensemble_failures: pure, on names only."""

from __future__ import annotations

from triton_mp.model_config.ensemble import ensemble_failures


def test_available_steps_pass() -> None:
    assert ensemble_failures({"e": ["a", "b"]}, {"a", "b", "e"}, set()) == {}


def test_missing_and_failed_steps_are_named_sorted() -> None:
    failures = ensemble_failures({"e": ["z", "a", "b"]}, {"a", "b", "e"}, {"b"})
    assert failures == {"e": "ensemble e contains models that are not available: b, z"}


def test_a_failed_ensemble_is_not_judged_again() -> None:
    assert ensemble_failures({"e": ["missing"]}, {"e"}, {"e"}) == {}


def test_failure_propagates_to_a_fixpoint() -> None:
    ensembles = {"inner": ["gone"], "middle": ["inner"], "outer": ["middle", "a"]}
    failures = ensemble_failures(ensembles, {"a", *ensembles}, set())
    assert failures == {
        "inner": "ensemble inner contains models that are not available: gone",
        "middle": "ensemble middle contains models that are not available: inner",
        "outer": "ensemble outer contains models that are not available: middle",
    }


def test_order_decides_what_an_early_ensemble_names() -> None:
    # "a" is judged before "b" fails, so it names only the model missing from the start.
    ensembles = {"a": ["b", "gone"], "b": ["gone2"]}
    failures = ensemble_failures(ensembles, {"a", "b"}, set())
    assert failures["a"] == "ensemble a contains models that are not available: gone"


def test_cycles_are_reported_on_every_member() -> None:
    ensembles = {"x": ["y"], "y": ["x"], "z": ["x"]}
    failures = ensemble_failures(ensembles, set(ensembles), set())
    assert failures == {
        "x": "circular dependency between ensembles: x -> y -> x",
        "y": "circular dependency between ensembles: y -> x -> y",
        "z": "ensemble z contains models that are not available: x",
    }


def test_a_cycle_through_a_failed_ensemble_still_counts() -> None:
    failures = ensemble_failures({"x": ["y"], "y": ["x"]}, {"x", "y"}, {"y"})
    assert failures == {"x": "circular dependency between ensembles: x -> y -> x"}


def test_self_reference_is_a_cycle() -> None:
    assert ensemble_failures({"s": ["s"]}, {"s"}, set()) == {
        "s": "circular dependency between ensembles: s -> s"
    }
