"""``triton-mp --help`` lists every command with one line each, and every command's ``--help``
works, run as a user runs them (the console script's module, a fresh process, 80 columns)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.docs_blocks import ROOT
from triton_mp.cli.main import build_parser

COMMANDS = ["start", "stat", "analyze", "trace"]


def _help(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "triton_mp.cli.main", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_every_command_is_listed() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert sorted(sub.choices) == sorted(COMMANDS)  # type: ignore[arg-type]


def test_top_level_help_lists_each_command_on_one_line() -> None:
    done = _help("--help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for command in COMMANDS:
        (line,) = [ln for ln in lines if ln.split()[:1] == [command]]
        following = lines[lines.index(line) + 1]
        assert len(line.split()) > 2, f"{command} has no help line"
        assert following.split()[:1] in ([], *([c] for c in COMMANDS), ["options:"]), (
            f"the help of {command} wraps onto a second line:\n{done.stdout}"
        )


@pytest.mark.parametrize(
    "argv",
    [["stat"], ["analyze"], ["trace"], ["trace", "summary"], ["trace", "timeline"]],
    ids=" ".join,
)
def test_each_command_help_works(argv: list[str]) -> None:
    done = _help(*argv, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: triton-mp {' '.join(argv)}"), done.stdout


def test_start_help_is_tritonservers_usage() -> None:
    """``start --help`` prints tritonserver's usage with every flag, on stderr, and exits 1,
    as ``tritonserver --help`` does."""
    done = _help("start", "--help")
    assert done.returncode == 1
    assert done.stderr.startswith("Usage: triton-mp start [options]")
    for flag in ("--model-repository", "--allow-client-shm", "--frontend-processes"):
        assert flag in done.stderr
