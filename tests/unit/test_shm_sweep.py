"""The start-up sweep of ``/dev/shm`` (``ipc.memory.shm``): what it removes is only what a server of
its own pid namespace left and can be proved dead; objects of a server in another pid
namespace sharing the same ``/dev/shm`` (a container run with ``--ipc=host``, or the host
seen from such a container) are left alone, since their pids mean nothing here (issue 39).

The decisions are checked on entry names (no processes, no objects); one test makes real
objects under ids no live process can have.
"""

from __future__ import annotations

import os

import posix_ipc
import pytest

from triton_mp.common.errors import TritonMPError
from triton_mp.common.process.process_dirs import pid_namespace
from triton_mp.ipc.memory.shm import (
    DEV_SHM,
    claim_server_id,
    list_objects,
    stale_entries,
    sweep_stale,
)
from triton_mp.ipc.memory.topology import Topology

OURS = 4026532001
"""A pid namespace inode (``/proc/self/ns/pid``) standing for this process's."""
HOST = 4026531836
"""Another one (the initial pid namespace's inode)."""
DEAD = {"111", "222", "333"}


def _alive(pid: int) -> bool:
    return str(pid) not in DEAD


def _objects(server_id: str, namespace: int | None) -> list[str]:
    top = Topology(server_id)
    names = [top.supervisor_ring(), "sem." + top.scheduler_wakeup().lstrip("/")]
    if namespace is not None:
        names.append(top.pid_namespace(namespace))
    return [n.lstrip("/") for n in names]


def _sweep(entries: list[str], own: str | None = "999", ns: int | None = OURS) -> set[str]:
    return set(stale_entries(entries, own, ns, alive=_alive))


def test_a_dead_server_of_this_namespace_is_removed_with_its_marker() -> None:
    entries = _objects("111", OURS)
    assert _sweep(entries) == set(entries)


def test_a_live_server_is_never_removed() -> None:
    assert _sweep(_objects("555", OURS) + _objects("556", HOST) + _objects("557", None)) == set()


def test_a_server_of_another_namespace_is_left_even_when_its_pid_looks_dead() -> None:
    """The container's sweep sees a host server's pid, which it cannot see, as dead."""
    assert _sweep(_objects("222", HOST)) == set()


def test_our_own_id_is_reclaimed_only_from_our_own_namespace() -> None:
    """A previous process with our pid left objects: ours to remove; a server of another
    namespace that happens to have the same pid number is not."""
    mine = _objects("999", OURS)
    assert _sweep(mine) == set(mine)
    assert _sweep(_objects("999", HOST)) == set()


def test_objects_without_a_marker_are_judged_by_pid_as_before() -> None:
    """A server of an older version (or one killed before it wrote its marker)."""
    entries = _objects("333", None) + _objects("555", None)
    assert _sweep(entries) == set(_objects("333", None))


def test_without_our_own_namespace_only_unmarked_objects_are_judged() -> None:
    """No /proc: a marked object cannot be placed, so it stays."""
    assert _sweep(_objects("111", OURS), ns=None) == set()
    assert _sweep(_objects("111", None), ns=None) == set(_objects("111", None))


def test_other_files_are_ignored() -> None:
    assert _sweep(["triton_mpx_111_a", "sem.other", "triton_mp_client_region"]) == set()


def test_the_namespace_is_this_process_s() -> None:
    ns = pid_namespace()
    if ns is None:
        pytest.skip("no /proc/self/ns/pid here")
    assert ns == os.stat(f"/proc/{os.getpid()}/ns/pid").st_ino


def test_claim_and_sweep_on_real_objects() -> None:
    """Real objects under ids above any pid_max (2**22) and below 2**31, so no live process
    has them: the sweep removes the dead server of our namespace and leaves the other
    namespace's; claiming an id that a server of another namespace holds is refused,
    creating nothing."""
    ns = pid_namespace()
    if ns is None:
        pytest.skip("no /proc/self/ns/pid here")
    dead, foreign = "2100000001", "2100000002"
    created: list[str] = []
    try:
        for sid, owner_ns in ((dead, ns), (foreign, ns + 1)):
            top = Topology(sid)
            for name in (top.supervisor_ring(), top.pid_namespace(owner_ns)):
                posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=0).close_fd()
                created.append(name)
        with pytest.raises(TritonMPError, match="another pid namespace"):
            claim_server_id(foreign)
        assert len(list_objects(foreign)) == 2
        removed = sweep_stale(own_server_id=None)
        assert {n for n in removed if dead in n or foreign in n} == {
            Topology(dead).supervisor_ring(),
            Topology(dead).pid_namespace(ns),
        }
        assert list_objects(dead) == []
        assert len(list_objects(foreign)) == 2
    finally:
        for name in created:
            if (DEV_SHM / name.lstrip("/")).exists():
                posix_ipc.unlink_shared_memory(name)
