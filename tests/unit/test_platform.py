"""``common.process.platform``: prctl (parent-death signal, timer slack) and process titles.

Each check runs in a child interpreter, so this test process keeps its own slack, title and
parent-death signal. tune_malloc has its own file (test_malloc.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import triton_mp
from triton_mp.common.process.platform import process_title

SRC = os.path.dirname(os.path.dirname(triton_mp.__file__))
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


def _child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        check=False,
    )


@linux_only
def test_sets_the_slack_of_the_calling_thread() -> None:
    out = _child(
        "from triton_mp.common.process.platform import set_timer_slack_ns, timer_slack_ns\n"
        "before = timer_slack_ns()\n"
        "ok = set_timer_slack_ns(1000)\n"
        "print(before, ok, timer_slack_ns())\n"
    ).stdout.split()
    before, ok, after = int(out[0]), out[1], int(out[2])
    assert ok == "True"
    assert after == 1000
    assert before != 1000  # the kernel's default (50 µs unless the parent changed it)


def test_process_titles_name_the_role_and_the_process() -> None:
    assert process_title("worker", "simple_0_1") == "triton-mp: worker simple_0_1"
    assert process_title("frontend", "frontend0") == "triton-mp: frontend frontend0"
    assert process_title("scheduler", "scheduler") == "triton-mp: scheduler"


@linux_only
def test_the_title_shows_in_proc() -> None:
    done = _child(
        "from triton_mp.common.process.platform import set_process_title\n"
        "set_process_title('worker', 'm_0_1')\n"
        "print(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[0].decode())\n"
    )
    assert done.stdout.strip() == "triton-mp: worker m_0_1"


@linux_only
@pytest.mark.skipif(os.getpid() == 1, reason="the child's parent would be pid 1")
def test_a_child_whose_parent_is_gone_already_exits() -> None:
    # NOTE: pid 1 is never this child's parent: the call must see that and exit(1).
    done = _child(
        "from triton_mp.common.process.platform import die_with_parent\n"
        "die_with_parent(1)\n"
        "print('still running')\n"
    )
    assert done.returncode == 1
    assert "still running" not in done.stdout


@linux_only
def test_a_child_of_a_live_parent_goes_on() -> None:
    done = _child(
        "import os\n"
        "from triton_mp.common.process.platform import die_with_parent\n"
        "die_with_parent(os.getppid())\n"
        "print('still running')\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still running"


def test_tune_gc_freezes_what_start_up_made_and_collects_the_rest() -> None:
    """Start-up's objects go to the permanent generation; garbage made before is collected
    first (so it is not frozen alive); objects made after are collected as usual."""
    result = _child(
        "import gc, weakref\n"
        "from triton_mp.common.process.platform import tune_gc\n"
        "class C: pass\n"
        "kept = [C() for _ in range(1000)]\n"
        "dead = C(); dead.me = dead; ref = weakref.ref(dead); del dead\n"
        "tune_gc()\n"
        "print(ref() is None, gc.get_freeze_count() > 1000)\n"
        "later = C(); later.me = later; ref2 = weakref.ref(later); del later\n"
        "gc.collect(); print(ref2() is None)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"]
