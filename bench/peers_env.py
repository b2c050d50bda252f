"""Where the benchmarks live and the peers they compare with (real Triton 2.51, perf_analyzer).

- ``ROOT`` / ``BENCH`` / ``PEERS_SCRIPTS`` / ``DEFAULT_PA_RUN`` / ``DEFAULT_PEERS_ENV``: paths.
- ``ensure_peers`` / ``load_peers_env``: ``bench/peers/install-peers.sh`` and its env file.
- ``BenchError``: a benchmark cannot go on (a peer or server missing or failing).

Standard library only.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PEERS_SCRIPTS = BENCH / "peers"
DEFAULT_PA_RUN = BENCH / "pa_run.py"
DEFAULT_PEERS_ENV = ROOT / ".peers" / "peers.env"


class BenchError(Exception):
    pass


def ensure_peers(peers_env: Path, install: bool = True) -> None:
    """Run bench/peers/install-peers.sh (idempotent) when the env file or its programs
    are missing."""
    if peers_env.is_file():
        try:
            env = load_peers_env(peers_env)
            if env.get("TRITONSERVER") and os.access(env["TRITONSERVER"], os.X_OK):
                return
        except BenchError:
            pass
    script = PEERS_SCRIPTS / "install-peers.sh"
    if not install:
        raise BenchError(f"{peers_env} missing or incomplete: run bash {script} .peers")
    if not script.is_file():
        raise BenchError(f"{peers_env} missing and no {script} to install the peers with")
    print(f"installing the peers: bash {script} {peers_env.parent}", flush=True)
    p = subprocess.run(["bash", str(script), str(peers_env.parent)], cwd=ROOT)
    if p.returncode != 0:
        raise BenchError(f"install-peers.sh failed with status {p.returncode}")


def load_peers_env(path: Path) -> dict[str, str]:
    """The environment after sourcing peers.env (PERF_ANALYZER, LD_LIBRARY_PATH for libcudart,
    TRITONSERVER, ...)."""
    if not path.is_file():
        raise BenchError(f"{path} not found: run bash bench/peers/install-peers.sh .peers")
    out = subprocess.run(
        ["bash", "-c", 'set -a; . "$1"; env -0', "_", str(path)], check=True, capture_output=True
    ).stdout
    env = dict(kv.split("=", 1) for kv in out.decode().split("\0") if "=" in kv)
    if not env.get("PERF_ANALYZER") or not os.access(env["PERF_ANALYZER"], os.X_OK):
        raise BenchError(f"{path} names no executable PERF_ANALYZER")
    return env
