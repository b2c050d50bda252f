"""The side-by-side tests' real Triton (tests/helpers/triton_peer.py) leaves no python-backend
region in /dev/shm, however it ends.

The python backend creates one region per model instance and unlinks it at a clean exit; a
tritonserver killed (or dying) keeps it there. ``RealTriton`` names its regions from its own
prefix (the backend's ``shm-region-prefix-name``) and ``stop`` removes them after the exit:
before, it removed the regions it had seen mapped when it polled the server, so a server
killed before any poll left its region behind (seen after session 12's CI).
"""

from __future__ import annotations

import signal
from pathlib import Path

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


def test_a_peer_killed_before_any_poll_leaves_no_region(tmp_path: Path) -> None:
    env = require_peers()
    repo = write_models(tmp_path / "repo", {"m": PythonModel(FP32_PAIR_CONFIG)})
    peer = RealTriton(env, tmp_path / "triton.log", f"--model-repository={repo}")
    try:
        wait_for(lambda: bool(left_regions(peer.region_prefix)), 120, "m's stub region")
        peer.proc.send_signal(signal.SIGKILL)
        peer.proc.wait(timeout=30)
        assert left_regions(peer.region_prefix), "the killed server's region went by itself"
    finally:
        peer.stop()
    assert left_regions(peer.region_prefix) == []
