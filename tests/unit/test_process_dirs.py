"""A process's temporary directories, named by its pid (``common.process.process_dirs``): the
supervisor removes a dead frontend's by its pid, and only its."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from triton_mp.common.process import process_dirs


def test_a_directory_is_named_by_its_kind_and_pid() -> None:
    made = process_dirs.make("triton-mp-test")
    try:
        assert made.is_dir()
        assert made.name.startswith(f"triton-mp-test-{os.getpid()}-")
        assert (made / process_dirs.MARKER).read_text() == str(process_dirs.pid_namespace())
    finally:
        shutil.rmtree(made)


def test_remove_takes_the_dead_pids_directories_and_no_other(tmp_path: Path) -> None:
    kind = process_dirs.NATIVE_GRPC
    dead = [tmp_path / f"{kind}-41-abc", tmp_path / f"{kind}-41-def"]
    others = [tmp_path / f"{kind}-411-abc", tmp_path / f"{kind}-4-abc", tmp_path / "other-41-x"]
    for d in dead + others:
        d.mkdir()
    (dead[0] / "python.sock").write_text("")
    assert sorted(process_dirs.remove(kind, 41, tmp_path)) == sorted(dead)
    assert not any(d.exists() for d in dead)
    assert all(d.is_dir() for d in others)
    assert process_dirs.remove(kind, 41, tmp_path) == []


def test_remove_leaves_a_file_or_link_of_that_name_alone(tmp_path: Path) -> None:
    kind = process_dirs.NATIVE_GRPC
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / f"{kind}-7-link").symlink_to(target)
    (tmp_path / f"{kind}-7-file").write_text("x")
    assert process_dirs.remove(kind, 7, tmp_path) == []
    assert target.is_dir()


@pytest.mark.parametrize("pid", [1, 99999])
def test_remove_without_any_directory_is_a_no_op(tmp_path: Path, pid: int) -> None:
    assert process_dirs.remove(process_dirs.NATIVE_GRPC, pid, tmp_path) == []


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_takes_dead_processes_directories_of_this_pid_namespace_only(
    tmp_path: Path,
) -> None:
    kind = process_dirs.NATIVE_GRPC
    own = process_dirs.pid_namespace()
    if own is None:
        pytest.skip("/proc does not tell this process's pid namespace")
    dead = _dead_pid()

    def made(name: str, namespace: object = own) -> Path:
        path = tmp_path / name
        path.mkdir()
        if namespace is not None:
            (path / process_dirs.MARKER).write_text(str(namespace))
        return path

    stale = made(f"{kind}-{dead}-abc")
    (stale / "python.sock").write_text("")
    kept = [
        made(f"{kind}-{os.getpid()}-abc"),  # alive
        made(f"{kind}-{dead}-other", own + 1),  # another namespace's pid
        made(f"{kind}-{dead}-unmarked", None),  # made before markers: cannot judge
        made(f"other-{dead}-abc"),  # another kind
    ]
    assert process_dirs.sweep(kind, tmp_path) == [stale]
    assert not stale.exists()
    assert all(p.is_dir() for p in kept)
    assert process_dirs.sweep(kind, tmp_path) == []
