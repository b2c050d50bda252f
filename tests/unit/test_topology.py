"""The names of a server's shared-memory objects: built and parsed from one table
(``ipc.memory.topology``), and the cleanup sets it enumerates (no objects created)."""

from __future__ import annotations

import pytest

from triton_mp.ipc.memory.shm import client_object_refusal
from triton_mp.ipc.memory.topology import (
    Kind,
    ObjectId,
    Topology,
    arena_name,
    metric_board_name,
    process_arena_prefix,
    server_of,
)

TOP = Topology("4242")

FIELDS = {
    "frontend": 2,
    "peer": 4,
    "instance": 7,
    "client": 9,
    "pid": 31337,
    "arena": 3,
    "generation": 4,
    "namespace": 4026531836,
}


def _sample(kind: Kind) -> str:
    return TOP.name(kind, **FIELDS)


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_parses_back_to_itself_and_only_itself(kind: Kind) -> None:
    name = _sample(kind)
    assert name.startswith("/triton_mp_4242_")
    obj = TOP.parse(name)
    assert obj is not None
    assert obj.kind is kind
    assert all(FIELDS[k] == v for k, v in obj.fields.items())
    # As the /dev/shm entry (no slash; a semaphore's with ``sem.``) too.
    assert TOP.parse("sem." + name.lstrip("/")) == obj
    others = [k for k in Kind if k is not kind and TOP.parse(_sample(k)) == obj]
    assert others == []


def test_the_named_builders_match_the_table() -> None:
    assert TOP.frontend_inbox_ring(1) == "/triton_mp_4242_r_f1_s"
    assert TOP.supervisor_ring() == "/triton_mp_4242_r_sup_s"
    assert TOP.scheduler_wakeup() == "/triton_mp_4242_s_sem"
    assert TOP.frontend_wakeup(0) == "/triton_mp_4242_f0_fifo"
    assert TOP.scheduler_to_frontend(3) == "/triton_mp_4242_r_s_f3"
    assert TOP.heartbeat() == "/triton_mp_4242_heartbeat"
    assert TOP.worker_wakeup(5) == "/triton_mp_4242_w5_sem"
    assert TOP.scheduler_to_worker(5) == "/triton_mp_4242_r_s_w5"
    assert TOP.worker_to_scheduler(5) == "/triton_mp_4242_r_w5_s"
    assert TOP.worker_to_frontend(5, 1) == "/triton_mp_4242_r_w5_f1"
    assert TOP.bls_wakeup(6) == "/triton_mp_4242_w6_bls"
    assert TOP.scheduler_to_bls(6) == "/triton_mp_4242_r_s_c6"
    assert TOP.worker_to_bls(5, 6) == "/triton_mp_4242_r_w5_c6"
    assert TOP.frontend_to_frontend(0, 1) == "/triton_mp_4242_r_f0_f1"
    assert TOP.supervisor_to_worker(5) == "/triton_mp_4242_r_sup_w5"
    assert TOP.supervisor_to_bls(6) == "/triton_mp_4242_r_sup_c6"


def test_arena_names_compose_from_their_owner_prefix() -> None:
    frontend = arena_name(process_arena_prefix(TOP.frontend_arenas(1), 555), 4)
    assert TOP.parse(frontend) == ObjectId(
        Kind.FRONTEND_ARENA, {"frontend": 1, "pid": 555, "arena": 4}
    )
    assert frontend.startswith(TOP.frontend_process_segments(1, 555))
    # A restarted frontend's arenas are other objects: workers never read old mappings.
    assert not frontend.startswith(TOP.frontend_process_segments(1, 556))
    entries = [
        frontend.lstrip("/"),
        arena_name(process_arena_prefix(TOP.frontend_arenas(1), 556), 0),
    ]
    assert TOP.of_frontend_process(entries, 1, 555) == [frontend.lstrip("/")]
    process = process_arena_prefix(TOP.worker_arenas(12), 999)
    worker = arena_name(process, 0)
    assert TOP.parse(worker) == ObjectId(
        Kind.WORKER_ARENA, {"instance": 12, "pid": 999, "arena": 0}
    )
    assert worker.startswith(TOP.worker_segments(12))
    # Instance 1's segment prefix is not a prefix of instance 12's arenas.
    assert not worker.startswith(TOP.worker_segments(1))


def test_other_servers_and_scratch_names_are_not_parsed() -> None:
    assert Topology("1").parse(_sample(Kind.HEARTBEAT)) is None
    assert TOP.parse(TOP.scratch("test_ring0")) is None
    assert TOP.parse("/somebody_else") is None
    assert server_of("triton_mp_4242_r_sup_s") == "4242"
    assert server_of("sem.triton_mp_17_w1_sem") == "17"
    assert server_of("triton_mpx_1_a") is None


def test_an_instances_objects_include_its_bls_rings_both_ways_and_its_arenas() -> None:
    entries = sorted(
        e.lstrip("/")
        for e in (
            TOP.worker_wakeup(3),
            TOP.scheduler_to_worker(3),
            TOP.worker_to_scheduler(3),
            TOP.worker_to_frontend(3, 0),
            TOP.bls_wakeup(3),
            TOP.scheduler_to_bls(3),
            TOP.supervisor_to_worker(3),
            TOP.supervisor_to_bls(3),
            TOP.worker_to_bls(3, 4),
            TOP.worker_to_bls(4, 3),
            arena_name(process_arena_prefix(TOP.worker_arenas(3), 77), 0),
            metric_board_name(process_arena_prefix(TOP.worker_arenas(3), 77), 2),
            # not instance 3's:
            TOP.worker_to_bls(4, 5),
            TOP.frontend_to_frontend(0, 3),
            TOP.worker_wakeup(33),
            arena_name(process_arena_prefix(TOP.frontend_arenas(3), 8), 0),
            TOP.heartbeat(),
            TOP.scratch("test_x"),
        )
    )
    mine = TOP.of_instances(entries, {3})
    assert len(mine) == 12
    assert all("33" not in e and "r_w4_c5" not in e for e in mine)
    assert TOP.of_instances(entries, {4}) == sorted(
        e.lstrip("/")
        for e in (TOP.worker_to_bls(3, 4), TOP.worker_to_bls(4, 3), TOP.worker_to_bls(4, 5))
    )
    process = process_arena_prefix(TOP.worker_arenas(3), 77)
    assert TOP.of_worker_process(entries, 3, 77) == [
        arena_name(process, 0).lstrip("/"),
        metric_board_name(process, 2).lstrip("/"),
    ]
    assert TOP.of_worker_process(entries, 3, 78) == []
    prefix = TOP.worker_process_segments(3, 77)
    assert arena_name(process, 4).startswith(prefix)
    assert metric_board_name(process, 2).startswith(prefix)
    other = process_arena_prefix(TOP.worker_arenas(3), 771)  # pid 771 is not pid 77
    assert not arena_name(other, 0).startswith(prefix)


def test_clients_may_not_map_the_servers_own_objects() -> None:
    import os

    assert client_object_refusal(TOP.heartbeat(), os.geteuid(), "4242") is not None
    assert client_object_refusal(Topology("5").heartbeat(), os.geteuid(), "4242") is None
