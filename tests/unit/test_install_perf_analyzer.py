"""scripts/install-perf-analyzer.sh's libb64 check (README "Set up", the server command).

The check once read `ldconfig -p | grep -q` under `set -o pipefail`: on a machine whose library
list passes the pipe's 64 KiB, grep's early exit killed ldconfig with SIGPIPE and the script said
libb64.so.0d was missing although apt had just installed it (a clean CI machine). These tests run
the script with a stand-in ldconfig and a stand-in Python, so nothing is downloaded.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-perf-analyzer.sh"
TRITONCLIENT = "tritonclient==2.46.0"
CUDART = "nvidia-cuda-runtime-cu12==12.9.79"


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run(tmp_path: Path, lib_listed: bool) -> subprocess.CompletedProcess[str]:
    """Run the script with an ldconfig that lists ~300 KiB of libraries, libb64 first or not."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    first = "\tlibb64.so.0d (libc6,x86-64) => /nonexistent/libb64.so.0d\n" if lib_listed else ""
    _executable(
        fake / "ldconfig",
        "#!/bin/bash\n"
        f"printf '{first}'\n"
        "for i in $(seq 1 5000); do\n"
        '  echo "\tlibfake$i.so.1 (libc6,x86-64) => /nonexistent/libfake$i.so.1"\n'
        "done\n",
    )
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    _executable(fake / "python", f"#!/bin/sh\necho {scripts}\n")  # only asked for sysconfig
    dest = tmp_path / "peers"
    for folder, spec in (("perf_analyzer", TRITONCLIENT), ("cudart", CUDART)):
        (dest / folder).mkdir(parents=True)
        (dest / folder / ".installed").write_text(spec + "\n")  # unpacked already: no download
    pa = dest / "perf_analyzer" / "tritonclient-2.46.0.data" / "data" / "bin" / "perf_analyzer"
    pa.parent.mkdir(parents=True)
    _executable(pa, "#!/bin/sh\necho 'Perf Analyzer Version 2.46.0'\n")
    env = dict(os.environ, PATH=f"{fake}:/usr/bin:/bin", PYTHON=str(fake / "python"))
    return subprocess.run(
        ["bash", str(SCRIPT), str(dest)], env=env, capture_output=True, text=True, timeout=60
    )


def test_long_library_list_with_libb64_passes(tmp_path: Path) -> None:
    done = _run(tmp_path, lib_listed=True)
    assert done.returncode == 0, done.stderr
    assert "libb64.so.0d is missing" not in done.stderr
    assert (tmp_path / "scripts" / "perf_analyzer").exists()
    assert "Perf Analyzer Version 2.46.0" in done.stdout


def test_missing_libb64_is_named(tmp_path: Path) -> None:
    on_disk = [p for root in ("/usr/lib", "/lib") for p in Path(root).glob("*/libb64.so.0d")]
    done = _run(tmp_path, lib_listed=False)
    if on_disk:  # the folder check finds the real one: the script goes on
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1
        assert "libb64.so.0d is missing: apt-get install -y libb64-0d" in done.stderr
