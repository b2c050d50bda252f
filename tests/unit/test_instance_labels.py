"""Unique instance labels (``common.labels``): two live instances 2.51 names alike (an
in-place count change 1 -> 2 -> 1 -> 2 leaves two ``<group>_1``) are ``<name>`` and
``<name>#2`` in ``triton-mp stat``'s instance rows and recent batches
(``scheduler.status.queue_status``) and in the worker rows of
``triton_mp_process_resident_memory_bytes`` (``frontend.metrics.host``). No processes."""

from __future__ import annotations

import msgspec

from tests.unit.scheduler_harness import model_spec
from triton_mp.common.close_reason import CloseReason
from triton_mp.common.labels import unique_labels
from triton_mp.frontend.metrics.host import ProcessMemory, _labelled
from triton_mp.scheduler.instances import Generation, Instance, InstanceTable
from triton_mp.scheduler.registry import make_policy
from triton_mp.scheduler.status import BatchLogs, queue_status


def test_unique_names_are_their_own_labels() -> None:
    assert unique_labels(["m_0_0", "m_0_1"]) == ["m_0_0", "m_0_1"]
    assert unique_labels([]) == []


def test_the_kth_of_one_name_gets_a_suffix_and_the_first_keeps_it() -> None:
    assert unique_labels(["m_0_1", "m_0_1"]) == ["m_0_1", "m_0_1#2"]
    assert unique_labels(["m_0_1", "m_0_2", "m_0_1", "m_0_1"]) == [
        "m_0_1",
        "m_0_2",
        "m_0_1#2",
        "m_0_1#3",
    ]


def test_a_suffix_never_takes_a_name_that_is_listed() -> None:
    labels = unique_labels(["a", "a", "a#2", "a"])
    assert labels == ["a", "a#3", "a#2", "a#4"]
    assert len(set(labels)) == len(labels)


def test_stat_rows_of_two_instances_of_one_name_are_told_apart() -> None:
    spec = msgspec.structs.replace(
        model_spec("m", (7, 9, 4)), instance_names=("m_0_1", "m_0_1", "m_0_2")
    )
    gen = Generation(spec, make_policy(spec), spec.enforced_inputs, spec.has_optional_inputs)
    table = InstanceTable()
    for i, name in zip(spec.instance_ids, spec.instance_names, strict=True):
        table.add(Instance(i, name, ("m", 1)))
    logs = BatchLogs()
    gone = Instance(3, "m_0_0", ("m", 1))  # left the version since it ran its batch
    for inst, at_ns in ((gone, 1000), (table.get(9), 2000), (table.get(7), 3000)):
        assert inst is not None
        logs.get(("m", 1)).record_sizes(1, 1, CloseReason.DELAY, inst, at_ns)
    (status,) = queue_status({("m", 1): gen}, table, logs, "m", 4000)
    assert [(s.instance_id, s.name) for s in status.instances] == [
        (7, "m_0_1"),
        (9, "m_0_1#2"),
        (4, "m_0_2"),
    ]
    assert [b.instance for b in status.recent_batches] == ["m_0_1", "m_0_1#2", "m_0_0"]


def test_process_rows_are_unique_per_role() -> None:
    rows = [
        ProcessMemory("scheduler", "", 1),
        ProcessMemory("worker", "m_0_0", 2),
        ProcessMemory("frontend", "0", 3),
        ProcessMemory("worker", "m_0_0", 4),  # version 2 of m, or a name 2.51 reused
        ProcessMemory("resource_tracker", "", 5),
    ]
    assert [(r.role, r.instance, r.rss_bytes) for r in _labelled(rows)] == [
        ("scheduler", "", 1),
        ("worker", "m_0_0", 2),
        ("frontend", "0", 3),
        ("worker", "m_0_0#2", 4),
        ("resource_tracker", "", 5),
    ]
