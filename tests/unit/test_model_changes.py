"""The model-change planner (``supervisor.models.model_changes``): which versions a load starts,
keeps, replaces, retires, discards and carries over as failed. No process, no shared memory."""

from __future__ import annotations

from triton_mp.supervisor.models.model_changes import (
    Outcome,
    Served,
    failed_by_invalid_config,
    plan_change,
    versions_to_start,
)

NOTHING = Served()


def test_a_first_load_starts_every_version_on_disk() -> None:
    assert versions_to_start(NOTHING, {1: "a", 2: "b"}) == {1, 2}


def test_a_reload_starts_only_new_and_changed_versions() -> None:
    served = Served(versions={1: "a", 2: "b"})
    assert versions_to_start(served, {1: "a", 2: "B", 3: "c"}) == {2, 3}
    assert versions_to_start(served, {1: "a", 2: "b"}) == set()


def test_an_unchanged_failure_is_not_retried_but_a_changed_one_is() -> None:
    served = Served(versions={1: "a"}, failed={2: "boom"}, failed_fingerprints={2: "b"})
    assert versions_to_start(served, {1: "a", 2: "b"}) == set()
    assert versions_to_start(served, {1: "a", 2: "b2"}) == {2}


def test_first_load_all_up_activates_everything() -> None:
    plan = plan_change(NOTHING, {1: "a", 2: "b"}, {1, 2}, {})
    assert plan.outcome is Outcome.CHANGED
    assert plan.activate == {1, 2}
    assert plan.served == {1, 2}
    assert not (plan.keep | plan.replace | plan.retire | plan.discard)
    assert plan.failed == {}
    assert plan.answer_failures == {}


def test_first_load_with_a_failed_version_serves_the_others_and_reports_it() -> None:
    plan = plan_change(NOTHING, {1: "a", 2: "b"}, {1, 2}, {2: "no backend"})
    assert plan.outcome is Outcome.CHANGED
    assert plan.activate == {1}
    assert plan.discard == {2}
    assert plan.failed == {2: "no backend"}
    assert plan.failed_fingerprints == {2: "b"}
    assert plan.answer_failures == {2: "no backend"}


def test_first_load_with_every_version_failed_serves_nothing() -> None:
    plan = plan_change(NOTHING, {1: "a"}, {1}, {1: "boom"})
    assert plan.outcome is Outcome.CHANGED
    assert plan.served == set()
    assert plan.discard == {1}
    assert plan.failed == {1: "boom"}


def test_a_changed_version_is_replaced_and_the_others_kept() -> None:
    served = Served(versions={1: "a", 2: "b"})
    plan = plan_change(served, {1: "a", 2: "B"}, {2}, {})
    assert plan.outcome is Outcome.CHANGED
    assert plan.activate == {2}
    assert plan.replace == {2}
    assert plan.keep == {1}
    assert plan.retire == set()
    assert plan.served == {1, 2}


def test_a_version_gone_from_disk_is_retired() -> None:
    served = Served(versions={1: "a", 2: "b"})
    plan = plan_change(served, {2: "b", 3: "c"}, {3}, {})
    assert plan.outcome is Outcome.CHANGED
    assert plan.retire == {1}
    assert plan.keep == {2}
    assert plan.activate == {3}


def test_a_failed_reload_keeps_everything_served_and_discards_all_it_started() -> None:
    served = Served(versions={1: "a"}, failed={9: "old"}, failed_fingerprints={9: "z"})
    plan = plan_change(served, {1: "A", 2: "b"}, {1, 2}, {2: "boom"})
    assert plan.outcome is Outcome.FAILED_RELOAD
    assert plan.keep == {1}
    assert plan.activate == set()
    assert plan.discard == {1, 2}
    assert plan.failed == {9: "old", 2: "boom"}
    assert plan.failed_fingerprints == {9: "z", 2: "b"}
    assert plan.answer_failures == {2: "boom"}


def test_nothing_changed_is_unchanged_and_carries_old_failures_over() -> None:
    served = Served(versions={1: "a"}, failed={2: "boom"}, failed_fingerprints={2: "b"})
    on_disk = {1: "a", 2: "b"}
    started = versions_to_start(served, on_disk)
    plan = plan_change(served, on_disk, started, {})
    assert plan.outcome is Outcome.UNCHANGED
    assert plan.keep == {1}
    assert plan.failed == {2: "boom"}
    assert plan.answer_failures == {2: "boom"}


def test_a_carried_failure_stays_failed_when_another_version_changes() -> None:
    served = Served(versions={1: "a"}, failed={2: "boom"}, failed_fingerprints={2: "b"})
    plan = plan_change(served, {1: "a", 2: "b", 3: "c"}, {3}, {})
    assert plan.outcome is Outcome.CHANGED
    assert plan.activate == {3}
    assert plan.keep == {1}
    assert plan.failed == {2: "boom"}
    assert plan.failed_fingerprints == {2: "b"}
    assert plan.answer_failures == {2: "boom"}


def test_a_failure_no_longer_on_disk_is_forgotten() -> None:
    served = Served(versions={1: "a"}, failed={2: "boom"}, failed_fingerprints={2: "b"})
    plan = plan_change(served, {1: "a"}, set(), {})
    assert plan.outcome is Outcome.UNCHANGED
    assert plan.failed == {}
    assert plan.answer_failures == {}


def test_an_invalid_config_fails_only_the_versions_newer_than_those_served() -> None:
    served = Served(versions={1: "a", 3: "c"}, failed={7: "old"})
    assert failed_by_invalid_config(served, {1, 2, 3, 4, 5}, "bad") == {
        7: "old",
        4: "bad",
        5: "bad",
    }
    assert failed_by_invalid_config(NOTHING, {1, 2}, "bad") == {}


def test_a_version_regrouped_in_place_is_neither_replaced_nor_activated_anew() -> None:
    served = Served(versions={1: "a", 2: "b"})
    plan = plan_change(served, {1: "A", 2: "B", 3: "c"}, {1, 2, 3}, {}, regrouped={1})
    assert plan.outcome is Outcome.CHANGED
    assert plan.regroup == {1}
    assert plan.replace == {2}
    assert plan.activate == {2, 3}
    assert plan.served == {1, 2, 3}
    assert not (plan.keep | plan.retire | plan.discard)


def test_a_regroup_whose_added_instance_failed_keeps_everything_served() -> None:
    served = Served(versions={1: "a"})
    plan = plan_change(served, {1: "A"}, {1}, {1: "boom"}, regrouped={1})
    assert plan.outcome is Outcome.FAILED_RELOAD
    assert plan.keep == {1}
    assert plan.discard == {1}  # its added instances only (change_effects.apply_plan)
    assert plan.regroup == frozenset()
