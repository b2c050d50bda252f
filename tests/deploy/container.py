"""Podman for tests/e2e/test_container.py (issue 39): the tools installed with apt when they
are missing, a base image made from Debian packages (cached between runs on one machine), the
image built from this checkout, and the ``podman run`` argv of deploy/'s Deployment.

No registry is needed: the base is ``mmdebstrap --variant=minbase`` of Debian bookworm with
Debian's python3, imported with ``podman import``. The image is then built from the
repository's own Dockerfile with ``--build-arg BASE_IMAGE=<that base>``.

What podman needs on this machine (a cgroup v1/v2 hybrid host whose root lacks
CAP_SYS_RESOURCE), given through ``CONTAINERS_CONF``: explicit ulimits (podman's default
raises RLIMIT_NOFILE and RLIMIT_NPROC to the host's maxima, which needs that capability) and
runc as the OCI runtime. Inside the build, pip trusts the host's CA store: the base gets the
host's CA bundle and an ``/etc/pip.conf`` that names it (a TLS-intercepting proxy here; on an
ordinary host the bundle is Debian's own and changes nothing).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import DEPLOY, by_kind, render

ROOT = Path(__file__).resolve().parents[2]

TOOLS = ("podman", "mmdebstrap", "runc")
"""Commands the test needs; each is also the name of the Debian package that installs it."""

CONTAINERS_CONF = """\
# tests/deploy/container.py: ulimits given explicitly (podman's default raises them to the
# host's maxima, which needs CAP_SYS_RESOURCE), and runc as the OCI runtime.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
"""

SUITE = "bookworm"
"""The Debian release of the base (the slim Python image's too)."""

BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd")
"""What the base holds beyond minbase: Debian's python3 with venv (the build stage's
interpreter), CA certificates (pip's downloads) and useradd (the runtime stage's user)."""

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "triton-mp"
"""Where the base's root file system tarball is kept between runs."""


@dataclass(frozen=True)
class Podman:
    """``podman`` with this test's containers.conf."""

    env: dict[str, str]

    def __call__(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            ["podman", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {out.returncode}\n{out.stderr}")
        return out


def install_tools() -> str | None:
    """Install ``TOOLS`` with apt-get (as root, else ``sudo -n``) when any is missing.

    Returns:
        None when all are there; else why not (the test skips with it).
    """
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if not missing:
        return None
    apt = ["apt-get"] if os.geteuid() == 0 else ["sudo", "-n", "apt-get"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["update", "-qq"], ["install", "-y", "-qq", *TOOLS]):
        try:
            out = subprocess.run(
                [*apt, *step], env=env, capture_output=True, text=True, timeout=900, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{', '.join(missing)} missing and {' '.join(apt)} {step[0]} failed: {e}"
        if out.returncode != 0:
            return (
                f"{', '.join(missing)} missing and `{' '.join([*apt, *step])}` failed: "
                f"{out.stderr.strip()[-400:]}"
            )
    still = [t for t in TOOLS if shutil.which(t) is None]
    return f"{', '.join(still)} still missing after apt-get install" if still else None


def podman_for(directory: Path) -> Podman:
    """A ``Podman`` whose containers.conf is written into ``directory``."""
    conf = directory / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return Podman({**os.environ, "CONTAINERS_CONF": str(conf)})


def _mmdebstrap_argv(tar: Path) -> list[str]:
    hooks = []
    if HOST_CA_BUNDLE.is_file():
        hooks = [
            f'--customize-hook=cp {HOST_CA_BUNDLE} "$1{HOST_CA_BUNDLE}"',
            f'--customize-hook=printf "[global]\\ncert = {HOST_CA_BUNDLE}\\n" > "$1/etc/pip.conf"',
        ]
    include = ",".join(BASE_PACKAGES)
    return [
        "mmdebstrap", "--variant=minbase", "--format=tar", f"--include={include}",
        *hooks, SUITE, str(tar),
    ]  # fmt: skip


def base_image(podman: Podman) -> str:
    """The tag of the Debian base: made once per machine (mmdebstrap, about 30 s), its
    tarball kept under ``CACHE``, imported when podman's store lacks it.

    The tag and the tarball name carry a digest of the mmdebstrap command and the host's CA
    bundle, so a change to either makes a new base.
    """
    recipe = json.dumps(_mmdebstrap_argv(Path("-"))).encode()
    ca = HOST_CA_BUNDLE.read_bytes() if HOST_CA_BUNDLE.is_file() else b""
    key = hashlib.sha256(recipe + ca).hexdigest()[:16]
    tag = f"localhost/triton-mp-base:{SUITE}-{key}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    tar = CACHE / f"rootfs-{SUITE}-{key}.tar"
    if not tar.is_file():
        tar.parent.mkdir(parents=True, exist_ok=True)
        partial = tar.with_name(f"{tar.name}.partial")
        out = subprocess.run(
            ["nice", "-n", "10", *_mmdebstrap_argv(partial)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert out.returncode == 0, f"mmdebstrap failed:\n{out.stderr[-3000:]}"
        partial.rename(tar)
    podman("import", str(tar), tag, timeout=300)
    return tag


@dataclass(frozen=True)
class Built:
    """The image built from the checkout, and what it took."""

    tag: str
    image_id: str
    base: str
    build_s: float
    size_bytes: int
    base_size_bytes: int


BUILD_ARGS = ("--format=docker", "--layers=false", "--jobs=2")
"""``podman build`` as the test runs it: no intermediate images (a build from a clean clone
never finds them, and they are 0.7 to 1.3 GB each), and the Dockerfile's native and venv
stages side by side, as BuildKit runs them."""


def build_image(
    podman: Podman,
    base: str,
    tag: str,
    log: Path,
    running: Callable[[subprocess.Popen[bytes]], None] = lambda _proc: None,
) -> Built:
    """``podman build`` of the checkout's Dockerfile on ``base``, its output in ``log``;
    ``running`` gets the build's process (to stop it). The caller removes the image by
    ``Built.image_id``."""
    t0 = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(
            ["nice", "-n", "10", "podman", "build", *BUILD_ARGS]
            + ["--build-arg", f"BASE_IMAGE={base}", "-t", tag, str(ROOT)],
            env=podman.env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
        running(proc)
        try:
            proc.wait(timeout=1200)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    build_s = time.monotonic() - t0
    assert proc.returncode == 0, f"podman build failed:\n{log.read_text()[-4000:]}"

    def inspect(image: str, field: str) -> str:
        return podman("image", "inspect", "--format", f"{{{{.{field}}}}}", image).stdout.strip()

    return Built(
        tag,
        inspect(tag, "Id"),
        base,
        build_s,
        int(inspect(tag, "Size")),
        int(inspect(base, "Size")),
    )


class ImageBuild:
    """The tools, the base and the image of tests/e2e/test_container.py, made on a thread
    of their own from the test session's first e2e test on (the build is ``nice``: it takes
    the cores the other tests leave idle), while those tests run first.

    ``result()`` waits for it: the podman and the image, or the test's skip (the tools
    cannot be installed, podman cannot run a container here); ``close()`` stops a build
    still running and removes the image.
    """

    def __init__(self, work: Path) -> None:
        self._work = work
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop = False
        self.podman: Podman | None = None
        self.built: Built | None = None
        self.skip: str | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="image-build", daemon=True)
        self._thread.start()

    def _running(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        if self._stop:
            proc.kill()

    def _run(self) -> None:
        try:
            self.skip = install_tools()
            if self.skip is not None:
                return
            tool = podman_for(self._work)
            info = tool("info", check=False)
            if info.returncode != 0:
                self.skip = f"podman cannot run here: {info.stderr.strip()[-400:]}"
                return
            self.podman = tool
            base = base_image(tool)
            probe = tool("run", "--rm", base, "true", check=False)
            if probe.returncode != 0:
                self.skip = f"podman cannot run a container here: {probe.stderr.strip()[-400:]}"
                return
            tag = f"localhost/triton-mp:e2e-{os.getpid()}"
            self.built = build_image(tool, base, tag, self._work / "build.log", self._running)
        except BaseException as e:  # noqa: BLE001 - handed to the test that needs the image
            self.error = e

    def result(self) -> tuple[Podman, Built]:
        """The podman and the built image, once the build ends.

        Raises:
            pytest's Skipped: no podman here (the reason), or the build's own error.
        """
        self._thread.join()
        if self.skip is not None:
            pytest.skip(self.skip)
        if self.error is not None:
            raise self.error
        assert self.podman is not None
        assert self.built is not None
        return self.podman, self.built

    def close(self) -> None:
        """Stop a build still running, wait for the thread, remove the image (by id)."""
        self._stop = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        self._thread.join()
        if self.podman is not None and self.built is not None:
            self.podman("rmi", "-f", self.built.image_id, check=False)


def deployment() -> tuple[dict[str, Any], dict[str, Any]]:
    """deploy/kubernetes/base's Deployment (rendered) and its one container."""
    (dep,) = by_kind(render(DEPLOY / "kubernetes/base"), "Deployment")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return dep, container


def _mebibytes(quantity: str) -> int:
    units = {"Mi": 1, "Gi": 1024}
    return int(quantity[:-2]) * units[quantity[-2:]]


def run_argv(
    name: str, image: str, shm_dir: Path, host_ports: dict[str, int], extra_args: list[str]
) -> list[str]:
    """``podman run`` arguments that run ``image`` as the Deployment runs it.

    From the pod and container specs: the user and group, a read-only root file system (and
    no other writable place than the volumes), all capabilities dropped, no privilege
    escalation, the memory limit, the ``tmp`` emptyDir (a tmpfs of its size limit), the
    Deployment's args (the image's ENTRYPOINT runs them, as in the pod, which sets no
    command) and its named ports, published on 127.0.0.1 at ``host_ports``.

    The memory-backed ``dshm`` emptyDir is ``shm_dir``, a directory of the host's tmpfs
    ``/dev/shm`` bind-mounted at ``/dev/shm``, as the kubelet bind-mounts the tmpfs of an
    emptyDir: a client on the host shares it as a client container of the pod would.
    """
    dep, container = deployment()
    pod = dep["spec"]["template"]["spec"]
    user = pod["securityContext"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["allowPrivilegeEscalation"] is False
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert mounts["dshm"] == "/dev/shm"
    tmp_mib = _mebibytes(volumes["tmp"]["emptyDir"]["sizeLimit"])
    argv = [
        "run", "-d", f"--name={name}",
        f"--user={user['runAsUser']}:{user['runAsGroup']}",
        "--read-only", "--read-only-tmpfs=false",
        "--cap-drop=ALL", "--security-opt=no-new-privileges",
        f"--memory={_mebibytes(container['resources']['limits']['memory'])}m",
        f"--tmpfs={mounts['tmp']}:rw,size={tmp_mib}m,mode=1777",
        f"--volume={shm_dir}:{mounts['dshm']}",
    ]  # fmt: skip
    for port in container["ports"]:
        argv.append(f"--publish=127.0.0.1:{host_ports[port['name']]}:{port['containerPort']}")
    return [*argv, image, *container["args"], *extra_args]
