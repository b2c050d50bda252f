"""The model-change planner: pure decisions on what a load does to one model's versions.

Imported by ``supervisor.models.model_control`` (the shell that applies the plans); starts no
process and touches no shared memory, so every rule below has a unit test
(tests/unit/test_model_changes.py). A load reads the model's versions from disk, each with
a fingerprint (its effective config and files, ``load_requests.version_fingerprint``), and
decides in two steps, as Triton's model_lifecycle.cc does:

1. ``versions_to_start``: which versions need new instances: new ones, and served ones whose
   fingerprint changed. A version that failed before and is unchanged is not retried (a
   repository poll would retry it forever); it is *carried over* as failed.
2. ``plan_change``: once the new instances reported ready or failed, what becomes of each
   version: ``activate`` (the new instances serve it), ``keep`` (served, unchanged),
   ``replace`` (served; its old instances stop once the new ones serve), ``regroup`` (served,
   its config changed only in ``instance_group``: updated in place, ``supervisor.models.
   regroups``: kept instances go on, added ones join, removed ones stop), ``retire`` (served,
   gone from disk: its instances stop), ``discard`` (newly started, never to serve: kill).
   A reload in which any version failed while the model serves keeps every served version
   as it was (``Outcome.FAILED_RELOAD``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Set
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Served:
    """What the server holds of one model before the change."""

    versions: Mapping[int, str] = field(default_factory=dict)
    """Served version -> its fingerprint."""
    failed: Mapping[int, str] = field(default_factory=dict)
    """Version that failed to load -> why."""
    failed_fingerprints: Mapping[int, str] = field(default_factory=dict)
    """Failed version -> its fingerprint when it failed."""


def versions_to_start(served: Served, on_disk: Mapping[int, str]) -> frozenset[int]:
    """The versions of ``on_disk`` (version -> fingerprint) that need new instances."""
    return frozenset(
        v
        for v, fp in on_disk.items()
        if (v in served.versions and served.versions[v] != fp)
        or (
            v not in served.versions
            and not (v in served.failed and served.failed_fingerprints.get(v) == fp)
        )
    )


def failed_by_invalid_config(served: Served, version_dirs: Set[int], reason: str) -> dict[int, str]:
    """A reload whose config is invalid: the served versions stay; the version directories
    newer than all of them are what the reload would have added, so they are the failed
    (UNAVAILABLE) ones. Returns the model's failed versions after it."""
    failed = dict(served.failed)
    if served.versions:
        newest = max(served.versions)
        failed.update({v: reason for v in sorted(version_dirs) if v > newest})
    return failed


class Outcome(enum.Enum):
    """What a change does to one model."""

    FAILED_RELOAD = "failed_reload"
    """A started version failed while the model serves: everything served stays."""
    UNCHANGED = "unchanged"
    """Nothing to start, nothing to stop: the served versions are those on disk."""
    CHANGED = "changed"
    """Versions start serving, stop serving, or fail."""


@dataclass(frozen=True)
class ChangePlan:
    """What one change does to one model's versions (``plan_change``)."""

    outcome: Outcome
    activate: frozenset[int] = frozenset()
    """Started versions whose instances all came up: they serve from now on."""
    keep: frozenset[int] = frozenset()
    """Served versions that keep their instances."""
    replace: frozenset[int] = frozenset()
    """Served versions restarted with new instances: the old ones stop."""
    regroup: frozenset[int] = frozenset()
    """Served versions updated in place: their instance group changes."""
    retire: frozenset[int] = frozenset()
    """Served versions no longer on disk: their instances stop."""
    discard: frozenset[int] = frozenset()
    """Started versions that will not serve: their new instances are killed."""
    failed: Mapping[int, str] = field(default_factory=dict)
    """The model's failed versions after the change -> why."""
    failed_fingerprints: Mapping[int, str] = field(default_factory=dict)
    answer_failures: Mapping[int, str] = field(default_factory=dict)
    """The versions the load call's answer reports as UNAVAILABLE (empty: success)."""

    @property
    def served(self) -> frozenset[int]:
        """The versions served after the change."""
        return self.keep | self.activate | self.regroup


def plan_change(
    served: Served,
    on_disk: Mapping[int, str],
    started: Set[int],
    start_errors: Mapping[int, str],
    regrouped: Set[int] = frozenset(),
) -> ChangePlan:
    """Decide what one model's load does (step 2 of the module docstring).

    Args:
        served: the model before the change.
        on_disk: every version the load found -> its fingerprint.
        started: the versions started for it (``versions_to_start``).
        start_errors: started version -> the first failure among its instances (for a
            regrouped one, among its added instances).
        regrouped: the started versions that are served and updated in place
            (``regroups.in_place``).
    """
    failed = {v: start_errors[v] for v in started if v in start_errors}
    new = frozenset(v for v in started if v not in failed)
    # NOTE: versions that failed before and are unchanged: still failed, not retried.
    carry = {
        v: served.failed[v]
        for v in on_disk
        if v not in served.versions and v not in started and v in served.failed
    }
    wanted = set(on_disk)
    if failed and served.versions:
        # NOTE: a failed reload keeps every served version as it is.
        return ChangePlan(
            Outcome.FAILED_RELOAD,
            keep=frozenset(served.versions),
            discard=frozenset(started),
            failed={**served.failed, **failed},
            failed_fingerprints={
                **served.failed_fingerprints,
                **{v: on_disk[v] for v in failed},
            },
            answer_failures=failed,
        )
    if not new and not failed and set(served.versions) | set(carry) == wanted:
        return ChangePlan(
            Outcome.UNCHANGED,
            keep=frozenset(served.versions),
            failed=carry,
            failed_fingerprints={
                v: fp for v, fp in served.failed_fingerprints.items() if v in carry
            },
            answer_failures=carry,
        )
    gone = frozenset(v for v in served.versions if v not in wanted)
    regroup = frozenset(v for v in served.versions if v in new and v in regrouped)
    replaced = frozenset(v for v in served.versions if v in new) - regroup
    return ChangePlan(
        Outcome.CHANGED,
        activate=new - regroup,
        keep=frozenset(served.versions) - gone - replaced - regroup,
        replace=replaced,
        regroup=regroup,
        retire=gone,
        discard=frozenset(failed),
        failed={**carry, **failed},
        failed_fingerprints={v: on_disk[v] for v in (*carry, *failed)},
        answer_failures={**carry, **failed},
    )
