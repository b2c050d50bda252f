"""A stop signal before the models at start have loaded ends the start by that signal, as
Triton 2.51 (no handler until its models load: exit status -signum, no drain, no port);
one after drains within the exit budget as before (``supervisor.processes.start_signal``;
end to end, side by side with 2.51: tests/e2e/test_signal_at_start.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import triton_mp.supervisor.main as supervisor_main
from triton_mp.cli.main import config_from_flags, parse_flags
from triton_mp.common.process.proc_tree import direct_children
from triton_mp.ipc.memory.shm import list_objects
from triton_mp.supervisor.main import Supervisor
from triton_mp.supervisor.processes.start_signal import StartInterrupted, kill_children


class _Died(Exception):
    """Stands for the process ending by a signal (``die_by``)."""


@pytest.fixture
def supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Supervisor]:
    """A supervisor with no child, whose ``die_by`` raises ``_Died`` and whose child killing
    is recorded (this test process's own children are not its to kill); the test
    process's signal handlers are put back after."""
    config = config_from_flags(
        parse_flags([f"--model-repository={tmp_path}", "--exit-timeout-secs=3"]).values
    )
    sup = Supervisor(config)
    calls: list[object] = []
    sup.calls = calls  # type: ignore[attr-defined]

    def die_by(signum: int) -> None:
        calls.append(("die_by", signum))
        raise _Died(signum)

    def stop_all() -> bool:
        calls.append("stop_all")
        return False

    monkeypatch.setattr(supervisor_main, "die_by", die_by)

    def kill_children(exclude: set[int]) -> list[int]:
        calls.append("kill")
        return []

    monkeypatch.setattr(supervisor_main, "kill_children", kill_children)
    monkeypatch.setattr(sup, "_stop_all", stop_all)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield sup
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        sup.wiring.remove_all()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_models_load_ends_the_start_by_it(
    supervisor: Supervisor, signum: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def loading() -> int:
        supervisor._on_signal(signum, None)  # NOTE: as the handler, in the main thread
        raise AssertionError("the start went on after the signal")

    monkeypatch.setattr(supervisor, "_run", loading)
    with pytest.raises(_Died):
        supervisor.run()
    assert supervisor.calls == ["kill", ("die_by", signum)]  # type: ignore[attr-defined]
    assert supervisor.children.stopping
    assert list_objects(supervisor.server_id) == []  # NOTE: its heartbeat board, unlinked


def test_a_second_signal_while_the_start_is_torn_down_is_ignored(supervisor: Supervisor) -> None:
    with pytest.raises(StartInterrupted) as first:
        supervisor._on_signal(signal.SIGTERM, None)
    assert first.value.signum == signal.SIGTERM
    supervisor._on_signal(signal.SIGINT, None)  # NOTE: no raise, no drain deadline
    assert supervisor._stop_deadline is None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_once_the_models_loaded_drains_within_the_budget(
    supervisor: Supervisor, signum: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def serving() -> int:
        supervisor._loading = False  # NOTE: as _run once the models at start loaded
        supervisor._on_signal(signum, None)
        return 0

    monkeypatch.setattr(supervisor, "_run", serving)
    assert supervisor.run() == 0
    assert supervisor.calls == ["stop_all"]  # type: ignore[attr-defined]
    assert supervisor._stop_deadline is not None


def test_a_failed_start_still_shuts_down_in_order(
    supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing() -> int:
        raise RuntimeError("no")

    monkeypatch.setattr(supervisor, "_run", failing)
    with pytest.raises(RuntimeError):
        supervisor.run()
    assert supervisor.calls == ["stop_all"]  # type: ignore[attr-defined]
    assert not supervisor._loading  # NOTE: a signal during that shutdown drains


def test_kill_children_kills_and_reaps_each_child_but_those_excluded() -> None:
    keep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    doomed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        others = set(direct_children(os.getpid())) - {doomed.pid}
        assert {keep.pid, doomed.pid} <= set(direct_children(os.getpid()))
        assert kill_children(others) == [doomed.pid]
        with pytest.raises(ProcessLookupError):
            os.kill(doomed.pid, 0)  # NOTE: reaped, not a zombie
        assert keep.poll() is None
    finally:
        for p in (keep, doomed):
            if p.poll() is None:
                p.kill()
                p.wait()
