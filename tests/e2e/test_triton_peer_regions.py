"""The side-by-side tests' real Triton (tests/helpers/triton_peer.py) leaves no python-backend
region in /dev/shm and no stub process, however it ends.

The python backend creates one region and one stub process per model instance and removes
both at a clean exit. A tritonserver killed keeps the region; one stopped while it loads its
models leaves the stub running (seen 20 minutes later). ``RealTriton`` names its regions from
its own prefix (the backend's ``shm-region-prefix-name``) and runs in its own process group:
``stop`` kills what is left of the group and removes the regions after the exit. Before, it
removed the regions it had seen mapped when it polled the server, so a server killed before
any poll left its region behind (seen after session 12's CI), and it left stubs running.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers.repos import FP32_PAIR_CONFIG
from tests.helpers.server import wait_for
from tests.helpers.triton_peer import (
    PythonModel,
    RealTriton,
    left_regions,
    require_peers,
    write_models,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SLOW_START = """
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3)

    def execute(self, requests):
        return []
"""


def _stubs(prefix: str) -> list[int]:
    """The stub processes given a region whose name starts with ``prefix`` (in their argv)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(a.startswith(prefix) for a in p.info["cmdline"] or []):
            found.append(p.pid)
    return found


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[RealTriton]:
    """A real Triton that started loading ``m`` (whose initialize takes 3 s): its stub runs."""
    env = require_peers()
    repo = write_models(tmp_path / "repo", {"m": PythonModel(FP32_PAIR_CONFIG, SLOW_START)})
    started = RealTriton(env, tmp_path / "triton.log", f"--model-repository={repo}")
    try:
        wait_for(lambda: bool(_stubs(started.region_prefix)), 120, "m's stub")
        yield started
    finally:
        started.stop()


def test_a_peer_killed_before_any_poll_leaves_no_region(peer: RealTriton) -> None:
    try:
        peer.proc.send_signal(signal.SIGKILL)
        peer.proc.wait(timeout=30)
        assert left_regions(peer.region_prefix), "the killed server's region went by itself"
    finally:
        peer.stop()
    assert left_regions(peer.region_prefix) == []
    assert _stubs(peer.region_prefix) == []


def test_a_peer_stopped_while_it_loads_leaves_no_stub(peer: RealTriton) -> None:
    peer.stop()
    assert _stubs(peer.region_prefix) == []
    assert left_regions(peer.region_prefix) == []
