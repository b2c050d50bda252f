"""Builds the native gRPC data path, ``triton_mp.frontend.native._native`` (C++17 on the
system's libgrpc++ and libprotobuf, found with pkg-config; the message classes generated from
``protos/`` with protoc and grpc_cpp_plugin at build time), and the REQUEST record decoder,
``triton_mp.ipc._request_decoder`` (C++17 on the Python headers only; without it the workers
decode records in Python). Everything else is in pyproject.toml.

Both extensions are optional: where the toolchain or the libraries are missing, or the build
fails, the build prints one line and goes on, and the server's Python frontend serves every
gRPC call (``frontend.native`` logs that at start). ``TRITON_MP_NATIVE=0`` skips it;
``TRITON_MP_NATIVE_SANITIZE=1`` builds it with ASan and UBSan (tests only).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
NATIVE = Path("src/triton_mp/frontend/native")
DECODER = "triton_mp.ipc._request_decoder"
PROTOS = ("grpc_service.proto", "model_config.proto")
FLAGS = ["-std=c++17", "-O2", "-g0", "-fvisibility=hidden"]
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]


def _pkg_config(*args: str) -> list[str]:
    out = subprocess.run(
        ["pkg-config", *args, "grpc++", "protobuf"], check=True, capture_output=True, text=True
    )
    return shlex.split(out.stdout)


class BuildNative(build_ext):
    """build_ext that generates the protobuf classes first and never fails the install."""

    def build_extension(self, ext: Extension) -> None:
        try:
            if ext.name == DECODER:
                ext.extra_compile_args = FLAGS + WARNINGS + _sanitize()
                ext.extra_link_args = _sanitize()
                super().build_extension(ext)
            else:
                self._build_native(ext)
        except Exception as e:  # noqa: BLE001 (any failure: the Python frontend serves)
            detail = getattr(e, "stderr", "") or ""
            print(f"triton-mp: {ext.name} not built ({e}) {detail}"[:2000], file=sys.stderr)

    def _build_native(self, ext: Extension) -> None:
        gen = Path(self.build_temp) / "native_gen"
        gen.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "protoc",
                f"-I{HERE / 'protos'}",
                f"--cpp_out={gen}",
                *(str(HERE / "protos" / p) for p in PROTOS),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        cflags = _pkg_config("--cflags")
        extra = FLAGS + (SANITIZE if os.environ.get("TRITON_MP_NATIVE_SANITIZE") == "1" else [])
        # NOTE: generated code is compiled without -Werror (its warnings are protoc's).
        objects = self.compiler.compile(
            [str(gen / p.replace(".proto", ".pb.cc")) for p in PROTOS],
            output_dir=str(gen),
            extra_postargs=extra + cflags,
        )
        ext.extra_objects = [*objects]
        ext.include_dirs = [str(gen)]
        ext.extra_compile_args = extra + WARNINGS + cflags
        ext.extra_link_args = _pkg_config("--libs") + (
            ["-fsanitize=address,undefined"] if "-fsanitize=address,undefined" in extra else []
        )
        super().build_extension(ext)


def _sanitize() -> list[str]:
    return SANITIZE if os.environ.get("TRITON_MP_NATIVE_SANITIZE") == "1" else []


def _extensions() -> list[Extension]:
    if os.environ.get("TRITON_MP_NATIVE") == "0":
        return []
    sources = sorted(str(p) for p in NATIVE.glob("*.cc"))
    decoder = ["src/triton_mp/ipc/native/request_decoder.cc"]
    return [
        Extension("triton_mp.frontend.native._native", sources, language="c++"),
        Extension(DECODER, decoder, language="c++"),
    ]


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildNative})
