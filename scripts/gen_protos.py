#!/usr/bin/env python3
"""Compile protos/*.proto into src/triton_mp/_proto/ and check that the committed copy is fresh.

Usage::

    python scripts/gen_protos.py           # regenerate src/triton_mp/_proto/ in place
    python scripts/gen_protos.py --check   # exit 1 if the committed files are stale

The sources: ``grpc_service.proto`` and ``model_config.proto`` (Triton's ``inference`` package,
wire-compatible), ``health.proto`` (``grpc.health.v1``) and ``admin.proto`` (``triton_mp.admin``,
our own service behind ``triton-mp stat``). A new file in ``protos/`` needs no change here.

What it produces, per ``protos/<name>.proto``: ``<name>_pb2.py``, ``<name>_pb2.pyi`` and, when the
file declares a service, ``<name>_pb2_grpc.py``; plus ``_pool.py`` and ``__init__.py``. It runs
``grpc_tools.protoc`` in-process, then rewrites the output in two ways described below. Output
depends only on the .proto sources and the grpcio-tools version (protoc stamps its own version
into the files), so two runs with the same grpcio-tools are byte-identical; ``--check`` relies on
that, and when it fails because of a different grpcio-tools it says so. The generated code
refuses to import on a runtime older than the generator: grpcio below the grpcio-tools version
(``GRPC_GENERATED_VERSION``) or protobuf below protoc's (``Protobuf Python Version``).

Rewrite 1, imports. protoc writes ``import model_config_pb2 as model__config__pb2``, which only
works with ``_proto/`` itself on ``sys.path``. Every import of a sibling generated module (in
``.py`` and ``.pyi``) becomes ``from . import model_config_pb2 as model__config__pb2``, so the
modules import as ``triton_mp._proto.grpc_service_pb2`` and nothing is added to ``sys.path``.

Rewrite 2, the descriptor pool. What we found: our .proto files must use Triton's package and
message names (``inference.ModelConfig`` ...) to be wire- and config-compatible, and tritonclient
registers its own copies of the same files in protobuf's *default* descriptor pool under the
file names ``model_config.proto`` and ``grpc_service.proto``. With the upb runtime (protobuf 6.x,
the default), importing both sets in one process fails at import time, whichever comes first:

* same file name but a FileDescriptorProto that differs in anything (declaration order,
  options, a field one side lacks; comments do not count) -> ``TypeError: Couldn't build proto
  file into descriptor pool: duplicate file name model_config.proto``;
* different file name -> ``TypeError: ... duplicate symbol 'inference.DataType'``.

The pool ignores a re-add only when the two FileDescriptorProtos are equal message-for-message.
Relying on that would tie triton-mp to one tritonclient release (any upstream field addition, or
an older client, breaks the import), would force us to mirror Triton's declaration order, and
would make our classes *be* tritonclient's classes, so a compatibility test could prove nothing.
Running tritonclient in a subprocess would not help either: tests and tools use tritonclient as
the client in the same process as our server code.

What we do: every generated ``*_pb2.py`` registers into one private
``descriptor_pool.DescriptorPool()`` defined in the generated ``_pool.py`` (protoc's
``_descriptor_pool.Default()`` is replaced by ``_pool.POOL``). Our descriptors therefore carry
the same full names as Triton's but never meet tritonclient's (or grpcio-health-checking's
``grpc.health.v1``) in a pool, whatever versions are installed and whatever the import order.
Nothing on the wire names a pool: gRPC only calls ``SerializeToString``/``FromString``, and
``text_format`` / ``json_format`` work from the message's own descriptor. Consequences to know:

* Our ``ModelConfig`` and tritonclient's are different classes; convert with
  ``ours.FromString(theirs.SerializeToString())``. The bytes are identical, which
  ``tests/unit/test_proto_compat.py`` proves for both directions and for every descriptor.
* Code that looks names up in the default pool (``symbol_database``, ``google.protobuf.Any``
  unpacking, grpc server reflection) must be handed ``_pool.POOL`` explicitly.
* Under the pure-Python protobuf runtime (``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``)
  protobuf's builder also mirrors each generated message into the default pool, keyed by file
  name. Because our files keep Triton's names (``model_config.proto``, ``grpc_service.proto``)
  that is a silent re-registration rather than a "Conflict register" TypeError; if ours are
  imported first, tritonclient's modules then reuse our descriptors and classes, which is
  harmless while the two are field-for-field identical (the tests check that, and both import
  orders under both runtimes). Renaming our files would turn this case into an import error,
  and for the same reason grpcio-health-checking (file ``grpc_health/v1/health.proto``) and our
  ``health_pb2`` should not be imported together under this runtime.
* A .proto in ``protos/`` may import only other files in ``protos/``. An import such as
  ``google/protobuf/timestamp.proto`` would need that file in the private pool too; the script
  refuses it with an explanation rather than generate code that fails at import.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.resources
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = REPO_ROOT / "protos"
OUT_DIR = REPO_ROOT / "src" / "triton_mp" / "_proto"

# Files this script owns inside OUT_DIR; anything else there is left alone.
GENERATED_PATTERNS = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py", "_pool.py", "__init__.py")

INIT_PY = (
    '"""Generated code, do not edit: regenerate with scripts/gen_protos.py'
    ' (protos/*.proto is the source)."""\n'
)

POOL_PY = '''\
"""The private descriptor pool every triton_mp._proto module registers into.

Generated by scripts/gen_protos.py, do not edit. Our messages use Triton's full names
(inference.ModelConfig ...), which tritonclient also registers in protobuf's default pool;
keeping ours here lets both be imported in one process. See scripts/gen_protos.py for details.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
'''

POSTPROCESS_NOTE = (
    "# Post-processed by scripts/gen_protos.py: package-relative imports and the private"
    " descriptor pool in _pool.py.\n"
)

_IMPORT_RE = re.compile(r'^\s*import\s+"([^"]+)"\s*;', re.MULTILINE)
_SERVICE_RE = re.compile(r"^\s*service\s+\w+", re.MULTILINE)
_GRPC_VERSION_RE = re.compile(r"^GRPC_GENERATED_VERSION = '([^']+)'", re.MULTILINE)
_PB_VERSION_RE = re.compile(r"^# Protobuf Python Version: (\S+)", re.MULTILINE)


class GenerationError(RuntimeError):
    """The protos cannot be compiled into importable modules."""


def _proto_files() -> list[Path]:
    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise GenerationError(f"no .proto files in {PROTO_DIR}")
    local = {p.name for p in protos}
    for proto in protos:
        for imported in _IMPORT_RE.findall(proto.read_text(encoding="utf-8")):
            if imported not in local:
                raise GenerationError(
                    f"{proto.name} imports {imported!r}, which is not in protos/. Generated "
                    "modules register into a private descriptor pool (see this script's "
                    "docstring), so every imported file must be generated here as well."
                )
    return protos


def _run_protoc(protos: list[Path], out_dir: Path) -> None:
    from grpc_tools import protoc  # NOTE: imported late so --help works without grpcio-tools.

    well_known = importlib.resources.files("grpc_tools") / "_proto"
    base = ["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{well_known}"]
    names = [p.name for p in protos]
    rc = protoc.main([*base, f"--python_out={out_dir}", f"--pyi_out={out_dir}", *names])
    if rc != 0:
        raise GenerationError(f"protoc failed (exit {rc}) compiling {', '.join(names)}")
    with_service = [p.name for p in protos if _SERVICE_RE.search(p.read_text(encoding="utf-8"))]
    if with_service:
        rc = protoc.main([*base, f"--grpc_python_out={out_dir}", *with_service])
        if rc != 0:
            raise GenerationError(f"protoc grpc plugin failed (exit {rc})")


def _relativise_imports(text: str, modules: set[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        module, alias = match.group(1), match.group(2)
        if module not in modules:
            return match.group(0)
        return f"from . import {module} as {alias}"

    return re.sub(r"^import (\w+_pb2) as (\w+)$", replace, text, flags=re.MULTILINE)


def _use_private_pool(text: str, path: Path) -> str:
    default_pool = "_descriptor_pool.Default().AddSerializedFile("
    if text.count(default_pool) != 1:
        raise GenerationError(
            f"{path.name}: expected one '{default_pool}' in protoc output; this protoc "
            "version lays out generated code differently, update scripts/gen_protos.py"
        )
    text = text.replace(default_pool, "_pool.POOL.AddSerializedFile(")
    anchor = "# @@protoc_insertion_point(imports)\n"
    if anchor not in text:
        raise GenerationError(f"{path.name}: protoc output lacks {anchor.strip()!r}")
    return text.replace(anchor, anchor + "\nfrom . import _pool\n", 1)


def _postprocess(out_dir: Path, protos: list[Path]) -> None:
    modules = {f"{p.stem}_pb2" for p in protos}
    for path in sorted(out_dir.iterdir()):
        text = path.read_text(encoding="utf-8")
        text = _relativise_imports(text, modules)
        if path.name.endswith("_pb2.py"):
            text = _use_private_pool(text, path)
        if path.suffix == ".py":
            first, _, rest = text.partition("\n")
            text = f"{first}\n{POSTPROCESS_NOTE}{rest}"
        path.write_text(text, encoding="utf-8")
    (out_dir / "_pool.py").write_text(POOL_PY, encoding="utf-8")
    (out_dir / "__init__.py").write_text(INIT_PY, encoding="utf-8")


def generate(out_dir: Path) -> None:
    """Write the complete generated package into the empty directory ``out_dir``."""
    protos = _proto_files()
    _run_protoc(protos, out_dir)
    _postprocess(out_dir, protos)


def _owned_files(directory: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pattern in GENERATED_PATTERNS:
        for path in directory.glob(pattern):
            found[path.name] = path
    return found


def _toolchain_hint(fresh: dict[str, Path], committed: dict[str, Path]) -> str:
    def versions(files: dict[str, Path]) -> tuple[set[str], set[str]]:
        grpc_versions: set[str] = set()
        pb_versions: set[str] = set()
        for path in files.values():
            text = path.read_text(encoding="utf-8")
            grpc_versions.update(_GRPC_VERSION_RE.findall(text))
            pb_versions.update(_PB_VERSION_RE.findall(text))
        return grpc_versions, pb_versions

    fresh_grpc, fresh_pb = versions(fresh)
    old_grpc, old_pb = versions(committed)
    if (fresh_grpc, fresh_pb) == (old_grpc, old_pb):
        return ""
    return (
        f"\nnote: the committed files were generated by grpcio-tools {sorted(old_grpc)} "
        f"(protobuf {sorted(old_pb)}); this environment has {sorted(fresh_grpc)} "
        f"(protobuf {sorted(fresh_pb)}). Regenerate only if the bump is intended."
    )


def _clip(line: str, width: int = 160) -> str:
    """Shorten a diff line (serialized descriptors are one very long line)."""
    body = line.rstrip("\n")
    return (body if len(body) <= width else body[: width - 3] + "...") + "\n"


def check() -> int:
    """Return 0 if OUT_DIR matches a fresh generation, else print what is stale and return 1."""
    with tempfile.TemporaryDirectory(prefix="triton_mp_gen_protos_") as tmp:
        fresh_dir = Path(tmp)
        generate(fresh_dir)
        fresh = _owned_files(fresh_dir)
        committed = _owned_files(OUT_DIR)
        problems: list[str] = []
        for name in sorted(fresh.keys() - committed.keys()):
            problems.append(f"missing: {name}")
        for name in sorted(committed.keys() - fresh.keys()):
            problems.append(f"not produced by the current protos (delete it): {name}")
        for name in sorted(fresh.keys() & committed.keys()):
            new = fresh[name].read_text(encoding="utf-8")
            old = committed[name].read_text(encoding="utf-8")
            if new != old:
                diff = difflib.unified_diff(
                    old.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    f"committed/{name}",
                    f"fresh/{name}",
                    n=1,
                )
                shown = [_clip(line) for line in list(diff)[:40]]
                problems.append(f"stale: {name}\n" + "".join(shown).rstrip())
        if not problems:
            print(f"{OUT_DIR.relative_to(REPO_ROOT)} is up to date with protos/")
            return 0
        print(
            f"{OUT_DIR.relative_to(REPO_ROOT)} is stale relative to protos/ "
            "(run: python scripts/gen_protos.py):",
            file=sys.stderr,
        )
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        hint = _toolchain_hint(fresh, committed)
        if hint:
            print(hint, file=sys.stderr)
        return 1


def write() -> int:
    """Regenerate OUT_DIR in place, removing generated files whose .proto is gone."""
    with tempfile.TemporaryDirectory(prefix="triton_mp_gen_protos_") as tmp:
        fresh_dir = Path(tmp)
        generate(fresh_dir)
        fresh = _owned_files(fresh_dir)
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        for name, path in _owned_files(OUT_DIR).items():
            if name not in fresh:
                path.unlink()
                print(f"removed {path.relative_to(REPO_ROOT)}")
        for name, src in sorted(fresh.items()):
            dst = OUT_DIR / name
            if dst.exists() and dst.read_bytes() == src.read_bytes():
                continue
            shutil.copyfile(src, dst)
            print(f"wrote {dst.relative_to(REPO_ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory and exit 1 if the committed files differ",
    )
    args = parser.parse_args(argv)
    try:
        return check() if args.check else write()
    except GenerationError as exc:
        print(f"gen_protos: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
