"""Shared fixtures: tmp repositories, a running server, and leak checks.

Every test is checked for leaked shared-memory objects (``/dev/shm/triton_mp_*`` and
``sem.triton_mp_*``) that it created; every server a test starts is stopped by PID and
process group in the fixture's teardown.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server import PROJECT_REPOSITORY, STARTED_PIDS, ServerProcess, group_alive
from triton_mp.cli.assets import (
    REC_BLS_MODEL_NAME,
    VAD_MODEL_NAME,
    materialise_ocr_models,
    materialise_rec_dictionary,
    materialise_vad_model,
)
from triton_mp.common.errors import TritonMPError
from triton_mp.ipc.shm import list_objects, remove_entry


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
    ``python -m pytest -m "not e2e"`` is the fast tier whatever a file's own marks say."""
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_after_the_session() -> Iterator[None]:
    before = set(list_objects())
    yield
    # NOTE: objects of servers still running belong to other sessions on this machine.
    left = sorted(n for n in set(list_objects()) - before if _ours(n) and not _owner_alive(n))
    _unlink_all(left)
    assert not left, f"the test session left shared-memory objects behind: {left}"


@pytest.fixture(autouse=True)
def _no_leaked_shared_memory() -> Iterator[None]:
    """Fail a test that leaves shm objects of its own or of a server that is gone.

    Objects of a server that still runs (a module-scoped fixture's) are not leaks yet; the
    session-wide check above catches them if that server never cleans up.
    """
    before = set(list_objects())
    yield
    leaked = sorted(n for n in set(list_objects()) - before if _ours(n) and not _owner_alive(n))
    _unlink_all(leaked)
    assert not leaked, f"test leaked shared-memory objects: {leaked}"


@contextlib.contextmanager
def server_factory(log_dir: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Context manager yielding ``start(repository, *flags)``; stops every server on exit."""
    servers: list[ServerProcess] = []

    def start(repository: Path, *flags: str, wait: bool = True, **kw: Any) -> ServerProcess:
        server = ServerProcess(repository, log_dir / f"server{len(servers)}.log", *flags, **kw)
        servers.append(server)
        if wait:
            server.wait_live()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()
            assert not group_alive(server.pid), f"server {server.pid} left processes behind"


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Factory: ``start_server(repository, *flags)`` -> a live ``ServerProcess``.

    Every server started is stopped at teardown (by pid and process group), and its
    process group must be gone.
    """
    with server_factory(tmp_path) as start:
        yield start


def write_python_model(repo: Path, name: str, config: str | None, source: str) -> Path:
    """Write a python-backend model into ``repo``: ``<name>/1/model.py`` from ``source`` and,
    unless ``config`` is None (auto-completed), ``<name>/config.pbtxt``; both are dedented.
    Returns the model's directory."""
    (repo / name / "1").mkdir(parents=True)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))
    return repo / name


def copy_models(dest: Path, *names: str) -> Path:
    """Copy models of the project's repository into ``dest`` (a new repository).

    The wheel-shipped ONNX files of the OCR models and of ``silero_vad`` (and the
    recogniser's dictionary for ``ocr_rec_bls``) are materialised first; the test is skipped
    when the package that ships them is absent.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if any(n.startswith("ocr_") for n in names):
        try:
            materialise_ocr_models(PROJECT_REPOSITORY)
            if REC_BLS_MODEL_NAME in names:
                materialise_rec_dictionary(PROJECT_REPOSITORY)
        except TritonMPError as e:
            pytest.skip(f"the OCR models are not available: {e.message}")
    if VAD_MODEL_NAME in names:
        try:
            materialise_vad_model(PROJECT_REPOSITORY)
        except TritonMPError as e:
            pytest.skip(f"the Silero VAD model is not available: {e.message}")
    for name in names:
        shutil.copytree(PROJECT_REPOSITORY / name, dest / name)
    return dest
