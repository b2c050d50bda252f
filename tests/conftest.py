"""Shared fixtures: tmp repositories, a running server, and leak checks.

Every test is checked for leaked shared-memory objects (``/dev/shm/triton_mp_*`` and
``sem.triton_mp_*``) that it created; every server a test starts is stopped by PID and
process group in the fixture's teardown.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.server import (
    STARTED_PIDS,
    ServerProcess,
    server_factory,
)
from tests.helpers.triton_peer import wait_stopped
from triton_mp.ipc.memory.shm import DEV_SHM, list_objects, remove_entry
from triton_mp.ipc.memory.topology import server_of


def pytest_configure(config: pytest.Config) -> None:
    """Every Python process the tests start (servers and their children, the analyzer,
    Model Analyzer's launcher) writes and reads its compiled modules, as a developer's does
    (``__pycache__`` folders, which git and the image's build context ignore), also where
    the environment says ``PYTHONDONTWRITEBYTECODE`` (CI's does): otherwise each process of
    every test server compiled triton_mp's modules again, about 0.4 CPU-s of a server's
    start and stop (2.1 -> 1.7 CPU-s for add_sub, measured). A python model's worker then
    writes the model's ``__pycache__`` too, which a repository poll must not take for a
    change (tests/e2e/test_model_control.py)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


SLOWEST_FILES = 20
"""How many test files ``pytest_terminal_summary`` lists."""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The slowest test files of the run (setup, call and teardown summed; a module's or the
    session's shared servers count where their first test sets them up): CI's test command
    has 20 minutes, and ``--durations`` names single tests only."""
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                path = report.nodeid.split("::", 1)[0]
                per_file[path] = per_file.get(path, 0.0) + report.duration
    if not per_file:
        return
    terminalreporter.write_sep("=", f"slowest {SLOWEST_FILES} test files")
    for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:SLOWEST_FILES]:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")
    terminalreporter.write_line(f"{sum(per_file.values()):8.1f}s in all {len(per_file)} files")


def _owner(name: str) -> int:
    return int(name.removeprefix("sem.").removeprefix("triton_mp_").split("_", 1)[0])


def _ours(name: str) -> bool:
    """Whether a shm object belongs to this test process or to a server this session started
    (other sessions' servers on the machine are none of this session's business)."""
    pid = _owner(name)
    return pid == os.getpid() or pid in STARTED_PIDS


def _owner_alive(name: str) -> bool:
    """Whether the server (or test process) named in a shm object's name still runs."""
    pid = _owner(name)
    if pid == os.getpid():
        return False  # NOTE: objects a test made itself must be gone when it ends
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _unlink_all(names: list[str]) -> None:
    for name in names:
        remove_entry(name)


E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e/ is marked ``e2e`` (it starts servers), so
    ``python -m pytest -m "not e2e"`` is the fast tier whatever a file's own marks say.

    tests/e2e/test_container.py's tests run last: their image builds in the background
    from the first e2e test on (tests/e2e/conftest.py), in the time the others leave idle.
    """
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.e2e)
    container = [item for item in items if item.path == E2E / "test_container.py"]
    if container:
        items[:] = [item for item in items if item.path != E2E / "test_container.py"]
        items.extend(container)


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_after_the_session() -> Iterator[None]:
    before = set(list_objects())
    yield
    regions = wait_stopped()  # the real Tritons stopped in the background
    # NOTE: objects of servers still running belong to other sessions on this machine.
    left = sorted(n for n in set(list_objects()) - before if _ours(n) and not _owner_alive(n))
    _unlink_all(left)
    assert not left, f"the test session left shared-memory objects behind: {left}"
    assert not regions, f"a real Triton of the session left python-backend regions: {regions}"


@pytest.fixture(autouse=True)
def _no_leaked_shared_memory() -> Iterator[None]:
    """Fail a test that leaves shm objects of its own or of a server that is gone.

    Objects of a server that still runs (a module-scoped fixture's) are not leaks yet; the
    session-wide check above catches them if that server never cleans up.
    """
    before = _entries()
    yield
    new = (n for n in _entries() - before if server_of(n) is not None)
    leaked = sorted(n for n in new if _ours(n) and not _owner_alive(n))
    _unlink_all(leaked)
    assert not leaked, f"test leaked shared-memory objects: {leaked}"


def _entries() -> set[str]:
    """Every name in ``/dev/shm`` (``list_objects``' own test, ``server_of``, runs only on the
    names a test added): the session's shared pair alone keeps some 3,200 objects there while
    it runs, and ``list_objects`` over them twice per test was 10-30 ms of every test after it
    starts (tests/unit/test_structure.py: 810 tests, 1.6 s alone, 25.8 s in CI)."""
    return set(os.listdir(DEV_SHM))


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Factory: ``start_server(repository, *flags)`` -> a live ``ServerProcess``.

    Every server started is stopped at teardown (by pid and process group), and its
    process group must be gone.
    """
    with server_factory(tmp_path) as start:
        yield start
