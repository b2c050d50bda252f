"""Builds the native gRPC data path, ``triton_mp.frontend.native._native`` (C++17 on the
system's libgrpc++ and libprotobuf, found with pkg-config; the message classes generated from
``protos/`` with protoc at build time, when a native source includes one), and the REQUEST
record decoder, ``triton_mp.ipc._request_decoder``, the scheduler's plain request queueing,
``triton_mp.scheduler._queue_records`` (and its plain batches' ``BatchAssign`` writer), and
the python backend's request builder and result reader,
``triton_mp.backends.python._pb_requests`` and ``_pb_results`` (C++17 on the Python
headers only), and the workers' answer writer and batch gather,
``triton_mp.workers._answer_writer`` and ``_batch_gather`` (on numpy's headers too); without
them the workers decode records, build requests and write answers in Python. Everything else
is in pyproject.toml.

Every extension is optional: where the toolchain or the libraries are missing, or the build
fails, the build prints one line and goes on, and the server's Python frontend serves every
gRPC call (``frontend.native`` logs that at start). ``TRITON_MP_NATIVE=0`` skips it;
``TRITON_MP_NATIVE_SANITIZE=1`` builds it with ASan and UBSan (tests only).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
NATIVE = Path("src/triton_mp/frontend/native")
DECODER = "triton_mp.ipc._request_decoder"
ANSWER_WRITER = "triton_mp.workers._answer_writer"
PB_REQUESTS = "triton_mp.backends.python._pb_requests"
PB_RESULTS = "triton_mp.backends.python._pb_results"
BATCH_GATHER = "triton_mp.workers._batch_gather"
QUEUE_RECORDS = "triton_mp.scheduler._queue_records"
PLAIN = (DECODER, PB_REQUESTS, PB_RESULTS, QUEUE_RECORDS)
"""The extensions on the Python headers alone (built by build_ext as they are)."""
WITH_NUMPY = (ANSWER_WRITER, BATCH_GATHER)
"""The extensions on the Python and numpy headers (numpy: a build requirement in
pyproject.toml, so that pip's isolated build has its headers; without numpy they are not
built and the workers build the batch's views and write its answers in Python)."""
PROTOS = ("grpc_service.proto", "model_config.proto")
FLAGS = ["-std=c++17", "-O2", "-g0", "-fvisibility=hidden"]
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]


def _pkg_config(*args: str) -> list[str]:
    out = subprocess.run(
        ["pkg-config", *args, "grpc++", "protobuf"], check=True, capture_output=True, text=True
    )
    return shlex.split(out.stdout)


def _uses_messages() -> bool:
    """Whether a native source or header includes a message header generated from
    ``PROTOS`` (``grpc_service.pb.h``, ...). Only then are the classes generated and compiled:
    today the native server hands ModelInfer over as bytes and relays every other call, so
    nothing uses them, and the two generated files would be about 30 of the extension's 40
    CPU-seconds of compiling."""
    headers = [f'"{p.removesuffix(".proto")}.pb.h"' for p in PROTOS]
    return any(
        h in path.read_text()
        for path in sorted(NATIVE.glob("*.[ch]*"))
        if path.suffix in (".cc", ".h")
        for h in headers
    )


def _newer(sources: list[str], target: str) -> bool:
    """Whether ``target`` is missing or older than any of ``sources``."""
    if not os.path.exists(target):
        return True
    built = os.path.getmtime(target)
    return any(os.path.getmtime(s) > built for s in sources)


class BuildNative(build_ext):
    """build_ext that generates the protobuf classes first (where used), compiles in
    parallel, and never fails the install."""

    def build_extension(self, ext: Extension) -> None:
        try:
            if ext.name in WITH_NUMPY:
                import numpy  # noqa: PLC0415 (only this extension needs it, at build time)

                ext.include_dirs = [numpy.get_include()]
            if ext.name in PLAIN or ext.name in WITH_NUMPY:
                ext.extra_compile_args = FLAGS + WARNINGS + _sanitize()
                ext.extra_link_args = _sanitize()
                super().build_extension(ext)
            else:
                self._build_native(ext)
        except Exception as e:  # noqa: BLE001 (any failure: the Python frontend serves)
            detail = getattr(e, "stderr", "") or ""
            print(f"triton-mp: {ext.name} not built ({e}) {detail}"[:2000], file=sys.stderr)

    def _build_native(self, ext: Extension) -> None:
        cflags = _pkg_config("--cflags")
        extra = FLAGS + (SANITIZE if os.environ.get("TRITON_MP_NATIVE_SANITIZE") == "1" else [])
        ext.extra_compile_args = extra + WARNINGS + cflags
        ext.extra_link_args = _pkg_config("--libs") + (
            ["-fsanitize=address,undefined"] if "-fsanitize=address,undefined" in extra else []
        )
        sources = sorted(ext.sources)
        target = self.get_ext_fullpath(ext.name)
        if not (self.force or _newer([*sources, *ext.depends], target)):
            return
        units = [(s, self.build_temp, ext.extra_compile_args) for s in sources]
        if _uses_messages():
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
            ext.include_dirs = [str(gen)]
            # NOTE: generated code is compiled without -Werror (its warnings are protoc's).
            units += [
                (str(gen / p.replace(".proto", ".pb.cc")), str(gen), extra + cflags) for p in PROTOS
            ]
        objects = self._compile_in_parallel(units, ext)
        # The link only: build_ext compiles nothing (the sources are the up-to-date check).
        ext.sources, ext.depends = [], [*sources, *ext.depends]
        ext.extra_objects = objects
        try:
            super().build_extension(ext)
        finally:
            ext.sources = sources

    def _compile_in_parallel(
        self, units: list[tuple[str, str, list[str]]], ext: Extension
    ) -> list[str]:
        """Compile each (source, output directory, flags) as its own compiler process, as
        many at once as there are CPUs (each includes gRPC's headers; a container build
        waits for them)."""

        def one(unit: tuple[str, str, list[str]]) -> list[str]:
            source, output_dir, flags = unit
            objects: list[str] = self.compiler.compile(
                [source],
                output_dir=output_dir,
                macros=ext.define_macros,
                include_dirs=ext.include_dirs,
                debug=self.debug,
                extra_postargs=flags,
            )
            return objects

        with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
            return [o for objects in pool.map(one, units) for o in objects]


def _local_headers(sources: list[str]) -> list[str]:
    """The project's headers that ``sources`` include (``#include "..."``), directly or
    through another header: an extension's ``depends``, so that a change to a header alone
    rebuilds every extension that includes it (without it build_ext kept the stale build).
    Generated headers (``grpc_service.pb.h``) are not files here and are left out."""
    seen: set[Path] = set()
    todo = [Path(s) for s in sources]
    while todo:
        path = todo.pop()
        for name in re.findall(r'^#include "([^"]+)"', path.read_text(), re.MULTILINE):
            header = (path.parent / name).resolve()
            if header.is_file() and header not in seen:
                seen.add(header)
                todo.append(header)
    return sorted(os.path.relpath(h, HERE) for h in seen)


def _extension(name: str, sources: list[str]) -> Extension:
    return Extension(name, sources, depends=_local_headers(sources), language="c++")


def _sanitize() -> list[str]:
    return SANITIZE if os.environ.get("TRITON_MP_NATIVE_SANITIZE") == "1" else []


def _extensions() -> list[Extension]:
    if os.environ.get("TRITON_MP_NATIVE") == "0":
        return []
    sources = sorted(str(p) for p in NATIVE.glob("*.cc"))
    decoder = [
        "src/triton_mp/ipc/native/request_decoder.cc",
        "src/triton_mp/ipc/native/ring_records.cc",
    ]
    return [
        _extension("triton_mp.frontend.native._native", sources),
        _extension(DECODER, decoder),
        _extension(PB_REQUESTS, ["src/triton_mp/backends/python/native/pb_requests.cc"]),
        _extension(PB_RESULTS, ["src/triton_mp/backends/python/native/pb_results.cc"]),
        _extension(
            QUEUE_RECORDS,
            [
                "src/triton_mp/scheduler/native/queue_records.cc",
                "src/triton_mp/scheduler/native/assign_push.cc",
            ],
        ),
    ] + (
        [
            _extension(ANSWER_WRITER, ["src/triton_mp/workers/native/answer_writer.cc"]),
            _extension(BATCH_GATHER, ["src/triton_mp/workers/native/batch_gather.cc"]),
        ]
        if importlib.util.find_spec("numpy") is not None
        else []  # NOTE: no numpy headers here: the workers build the batch's views and
        # write its answers in Python
    )


# NOTE: pip's build backend and `python setup.py` both run this file as __main__; the
# unit tests import it for _extensions() alone
if __name__ == "__main__":
    setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildNative})
