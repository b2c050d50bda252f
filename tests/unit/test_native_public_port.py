"""Who owns the public gRPC port (``frontend.native.public_port.choose``), and the native
binding's fallback where the extension is absent."""

from __future__ import annotations

import subprocess
import sys

import pytest

from triton_mp.frontend.native.public_port import choose


@pytest.mark.parametrize(
    ("requested", "tls", "built", "expected"),
    [
        ("native", False, True, (True, "")),
        ("python", False, True, (False, "")),
        ("python", True, False, (False, "")),
        (
            "native",
            False,
            False,
            (False, "native gRPC frontend not built (boom): the Python frontend serves gRPC"),
        ),
        (
            "native",
            True,
            True,
            (False, "native gRPC frontend does not serve TLS: the Python frontend serves gRPC"),
        ),
    ],
)
def test_choose(requested: str, tls: bool, built: bool, expected: tuple[bool, str]) -> None:
    assert choose(requested, tls=tls, built=built, why_not_built="boom") == expected


def test_disabled_extension_reads_as_absent() -> None:
    code = "from triton_mp.frontend import native; print(native.available(), native.UNAVAILABLE)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"TRITON_MP_NATIVE": "0", "PYTHONPATH": "src"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False TRITON_MP_NATIVE=0"
