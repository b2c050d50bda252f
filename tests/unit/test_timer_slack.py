"""set_timer_slack_ns: the scheduler's timed waits end within ~1 µs of their deadline."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import triton_mp

SRC = os.path.dirname(os.path.dirname(triton_mp.__file__))

CHILD = """
from triton_mp.scheduler.clock import set_timer_slack_ns, timer_slack_ns
before = timer_slack_ns()
ok = set_timer_slack_ns(1000)
print(before, ok, timer_slack_ns())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_sets_the_slack_of_the_calling_thread() -> None:
    # NOTE: in a child, so that this test process keeps its own slack.
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    before, ok, after = int(out[0]), out[1], int(out[2])
    assert ok == "True"
    assert after == 1000
    assert before != 1000  # the kernel's default (50 µs unless the parent changed it)
