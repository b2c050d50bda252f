"""The process table's start handshake with a deadline (``supervisor.processes.children``), on tiny
real child processes that report Ready, report StartFailed, die first, or stay silent."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from triton_mp.ipc.handshake import report_ready, report_start_failed
from triton_mp.supervisor.processes.children import Child, ChildTable


def _ready(conn: Connection) -> None:
    report_ready(conn, "worker", "ok")
    time.sleep(30)


def _fails(conn: Connection) -> None:
    report_start_failed(conn, "worker", "bad", "failed to load model 'bad': no file")


def _dies(conn: Connection) -> None:
    raise SystemExit(3)


def _silent(conn: Connection) -> None:
    time.sleep(30)


def _child(name: str, target: object) -> Child:
    # NOTE: fork, not the server's spawn: a spawned child re-imports this module and
    # triton_mp, which under CI load took longer than the 3 s deadline these tests judge by.
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(send,), daemon=True)
    proc.start()
    send.close()
    return Child("worker", name, b"", process=proc, ready_conn=recv)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made = [_child("ok", _ready), _child("bad", _fails), _child("gone", _dies)]
    made.append(_child("quiet", _silent))
    yield made
    for c in made:
        assert c.process is not None
        c.process.kill()
        c.process.join(5)


def test_each_child_is_ready_failed_dead_or_late(children: list[Child]) -> None:
    table = ChildTable()
    started = time.monotonic()
    errors = table.await_ready(children, timeout_s=3.0)
    assert time.monotonic() - started < 10
    ok, bad, gone, quiet = children
    assert ok.ready
    assert "ok" not in errors
    assert errors["bad"] == "failed to load model 'bad': no file"
    assert errors["gone"] == "worker gone exited with code 3 before ready"
    assert errors["quiet"] == "worker quiet did not report ready within 3.0s"
    assert quiet.process is not None
    assert not quiet.process.is_alive()  # killed at the deadline
    assert [c.ready for c in (bad, gone, quiet)] == [False, False, False]
