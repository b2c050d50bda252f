"""bench_vs_triton.py's sides, workloads and model repositories: which servers run which
perf_analyzer command, and the temporary repository copies (``add_sub_py_nodelay``,
``ocr_cls``) a workload needs. Imported by bench_vs_triton.py and its report modules."""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common import (
    BENCH,
    ROOT,
    BenchError,
)

DEFAULT_REPOSITORY = BENCH / "model_repository"
DEFAULT_PNG = ROOT / "bench" / "results" / "vs_triton.png"
SIDES = (
    "Triton",
    "triton-mp",
    "triton-mp base",
    "triton-mp fp2",
    "triton-mp python",
    "floor",
    "native floor",
    "identity floor",
    "onnxruntime",
    "triton-mp core0",
    "onnxruntime core0",
)
"""Every server the bench can run: the real Triton, triton-mp (one frontend process),
triton-mp with ``--frontend-processes 2``, the Python floor (``floor_server.py``) and the
large-tensor floor (``bench/floor_identity.py``: identity_py echoed by one grpc.aio process
with triton-mp's wire handling); "triton-mp base" is triton-mp as committed at ``--baseline
REV``, run next to this checkout's on every workload triton-mp runs (an A/B in one run);
"onnxruntime" is no server: raw onnxruntime in this process on ocr_cls's ONNX file, its best
batched images/s (``raw_ort_record``), the bound of the ocr_cls workload. "triton-mp core0"
and "onnxruntime core0" are the same two on core 0 alone, perf_analyzer on core 1
(``vs_triton_pinned``)."""
SERVERLESS = ("onnxruntime", "onnxruntime core0")
"""Sides measured in this process, with nothing to start or stop."""
FLOORS = ("floor", "native floor", "identity floor", "onnxruntime", "onnxruntime core0")
"""The floor sides: the table's "vs floor" column shows a workload's ratio over any of them."""
FLOOR_IDENTITY = ROOT / "bench" / "floor_identity.py"
PAIR = ("Triton", "triton-mp")
"""The two sides every workload runs on."""
ADD_SUB_SIDES = tuple(
    s
    for s in SIDES
    if s not in ("identity floor", "triton-mp base", *SERVERLESS) and not s.endswith("core0")
)
"""add_sub_py over gRPC, the system-shared-memory issue's bench, runs on all four sides that
serve add_sub_py (the identity floor serves identity_py only)."""
RATIOS = (
    ("triton-mp", "Triton"),
    ("triton-mp", "triton-mp base"),
    ("triton-mp fp2", "Triton"),
    ("triton-mp", "floor"),
    ("triton-mp fp2", "floor"),
    ("triton-mp", "native floor"),
    ("triton-mp python", "Triton"),
    ("triton-mp", "triton-mp python"),
    ("triton-mp", "identity floor"),
    ("identity floor", "Triton"),
    ("triton-mp", "onnxruntime"),
    ("triton-mp base", "onnxruntime"),
    ("triton-mp core0", "onnxruntime core0"),
)
"""Throughput ratios reported per workload (numerator, denominator), when both ran."""
FP2_ARGS = ["--frontend-processes", "2"]
PYTHON_ARGS = ["--grpc-frontend", "python"]
"""The "triton-mp python" side: the Python gRPC server owns the port, as before the native
gRPC frontend (issue 33) became the default."""
SIDE_ARGS = {"triton-mp fp2": FP2_ARGS, "triton-mp python": PYTHON_ARGS}
"""The flags a triton-mp side adds to triton-mp's."""
MIB = 1 << 20
PRIVATE_SHM_ENV = "BENCH_VS_TRITON_PRIVATE_SHM"  # set inside the private /dev/shm namespace
MAX_RESTARTS = 2  # per round: a server that died under us is started again this many times
NODELAY_MODEL = "add_sub_py_nodelay"
"""add_sub_py with ``dynamic_batching { }`` (no batching delay), written by
``prepare_repositories`` into the run's repositories (issue 23's second c=1 goal)."""
OCR_MODEL = "ocr_cls"
"""The PP-OCR classifier (onnxruntime backend: triton-mp only; the Triton here has no
onnxruntime backend); ``prepare_repositories`` adds it to triton-mp's repository."""
OCR_2CORE_MODEL = "ocr_cls_2core"
"""ocr_cls as a user would configure it for this machine's 2 cores (issue 33's ocr_cls goal):
``ocr_2core_config``, written by ``prepare_repositories`` next to the shipped ocr_cls."""
OCR_SHM_ARGS = ("--shared-memory", "system")
"""ocr_cls's images through system shared memory, as a client on the server's host sends them:
perf_analyzer 2.51 writes its input data once into one region per input (``/x_0_0``, 110,592
bytes a request) and names it in every request; its output region is the output's fixed
batch-1 size (8 bytes), one region that every request names (``InferDataManagerShm``), so
``--output-shared-memory-size`` (for outputs of unknown size only) is not needed. The gRPC
messages then carry no tensor bytes: the serving CPU left is the call, the batching and the
worker's copy of each image out of the client's region."""
OCR_1CORE_MODEL = "ocr_cls_1core"
"""ocr_cls as a user would configure it for one core (``ocr_1core_config``), served by
"triton-mp core0" on core 0 alone (issue 33's ocr_cls goal with the client off the server's
core)."""
ORT_BATCHES = (8, 16, 32)
"""Batch sizes of the raw onnxruntime measurement (its best is the ocr_cls bound)."""


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    model: str
    concurrency: int
    pa_args: tuple[str, ...] = ()
    protocol: str = "grpc"
    """perf_analyzer's -i: ``grpc`` or ``http`` (KServe v2 REST, binary tensor data)."""
    sides: tuple[str, ...] = PAIR
    """The servers it runs on (the floors serve gRPC only: the add_sub floor add_sub_py, the
    identity floor identity_py, also through system shared memory)."""
    floor_model: str | None = None
    """The model the floor serves for this workload when its name differs (the floor has
    one model, add_sub_py, and no batcher: ``add_sub_py_nodelay`` is add_sub_py there)."""

    def model_for(self, side: str) -> str:
        """The model name ``side`` serves this workload under."""
        floor = side in ("floor", "native floor")
        return self.floor_model if floor and self.floor_model else self.model

    def args(self, side: str = "") -> list[str]:
        model = self.model_for(side)
        return ["-m", model, "--concurrency-range", str(self.concurrency), *self.pa_args]


def identity(mib: int, shm: bool, protocol: str = "grpc") -> Workload:
    floats = mib * MIB // 4
    extra: tuple[str, ...] = ("--shape", f"INPUT0:{floats}")
    if shm:
        extra += ("--shared-memory", "system", "--output-shared-memory-size", str(mib * MIB))
    http = protocol == "http"
    sides = PAIR if http else (*PAIR, "identity floor")
    return Workload(
        f"id{mib}m" + ("_shm" if shm else "") + ("_http" if http else ""),
        f"identity_py {mib} MiB c=4" + (" shm" if shm else ""),
        "identity_py",
        4,
        extra,
        protocol,
        sides,
    )


WORKLOADS = [
    Workload("add_sub_c1", "add_sub_py c=1", "add_sub_py", 1, sides=ADD_SUB_SIDES),
    Workload(
        "add_sub_c1_nodelay",
        "add_sub_py c=1 no delay",
        NODELAY_MODEL,
        1,
        sides=ADD_SUB_SIDES,
        floor_model="add_sub_py",
    ),
    Workload("add_sub_c4", "add_sub_py c=4", "add_sub_py", 4, sides=ADD_SUB_SIDES),
    Workload("add_sub_c16", "add_sub_py c=16", "add_sub_py", 16, sides=ADD_SUB_SIDES),
    identity(1, shm=False),
    identity(1, shm=True),
    identity(16, shm=False),
    identity(16, shm=True),
    Workload("add_sub_c1_http", "add_sub_py c=1", "add_sub_py", 1, protocol="http"),
    Workload("add_sub_c16_http", "add_sub_py c=16", "add_sub_py", 16, protocol="http"),
    identity(1, shm=False, protocol="http"),
    identity(1, shm=True, protocol="http"),
    Workload("ocr_cls_c32", "ocr_cls c=32", OCR_MODEL, 32, sides=("triton-mp", "onnxruntime")),
    Workload(
        "ocr_cls_c32_2core",
        "ocr_cls c=32 2-core config",
        OCR_2CORE_MODEL,
        32,
        sides=("triton-mp", "onnxruntime"),
    ),
    Workload(
        "ocr_cls_c32_2core_shm",
        "ocr_cls c=32 2-core config shm",
        OCR_2CORE_MODEL,
        32,
        OCR_SHM_ARGS,
        sides=("triton-mp", "onnxruntime"),
    ),
    Workload(
        "ocr_cls_c32_core0",
        "ocr_cls c=32 1-core config on core 0",
        OCR_1CORE_MODEL,
        32,
        sides=("triton-mp core0", "onnxruntime core0"),
    ),
    Workload(
        "ocr_cls_c32_core0_shm",
        "ocr_cls c=32 1-core config on core 0 shm",
        OCR_1CORE_MODEL,
        32,
        OCR_SHM_ARGS,
        sides=("triton-mp core0", "onnxruntime core0"),
    ),
]


def nodelay_config(text: str) -> str:
    """add_sub_py's config.pbtxt as ``add_sub_py_nodelay``: the same model with
    ``dynamic_batching { }`` (batches form only from requests already queued)."""
    out = re.sub(r'^name:\s*"add_sub_py"', f'name: "{NODELAY_MODEL}"', text, flags=re.M)
    out = re.sub(r"dynamic_batching\s*\{[^}]*\}", "dynamic_batching { }", out)
    if out == text or f'"{NODELAY_MODEL}"' not in out or "dynamic_batching { }" not in out:
        raise BenchError("add_sub_py's config.pbtxt: no name or dynamic_batching to rewrite")
    return "# bench_vs_triton.py: add_sub_py without its batching delay.\n" + out


def ocr_2core_config(text: str) -> str:
    """ocr_cls's config.pbtxt as ``ocr_cls_2core``, what a user would write for 2 cores: two
    instances of one intra-op thread each (one per core), ``max_batch_size`` 8 and
    ``preferred_batch_size: [ 8 ]``, a 2000 µs queue delay. Batch 8 is where one-thread
    onnxruntime spends the least CPU per image here (two sessions at once 503 µs at 8 against
    530 at 16, one alone 495 against 509: medians of the six raw measurements of the 14:29
    goal run) and raw onnxruntime's best is two one-thread sessions at batch 8. At c=32 two
    batches of 8 run while the next two wait queued, so an instance that ends a batch starts
    the next at once; with batches of 16 (the config until session 18) the 32 requests were
    the two running batches, and each instance slept while its own 16 clients sent their next
    requests (17-19% of the time in the 14:29 goal run: the machine's 0.22 idle cores). The
    shipped ocr_cls keeps one instance: it is the repository's batching demo."""
    out = re.sub(r'^name:\s*"ocr_cls"', f'name: "{OCR_2CORE_MODEL}"', text, flags=re.M)
    out = re.sub(r"max_batch_size:\s*\d+", "max_batch_size: 8", out)
    out = re.sub(r"preferred_batch_size:\s*\[[^]]*\]", "preferred_batch_size: [ 8 ]", out)
    out = re.sub(r"max_queue_delay_microseconds:\s*\d+", "max_queue_delay_microseconds: 2000", out)
    out = re.sub(r"count:\s*\d+", "count: 2", out)
    for want in (f'"{OCR_2CORE_MODEL}"', "max_batch_size: 8", "[ 8 ]", ": 2000", "count: 2"):
        if want not in out:
            raise BenchError(f"ocr_cls's config.pbtxt: nothing to rewrite into {want}")
    return "# bench_vs_triton.py: ocr_cls configured for 2 cores.\n" + out


OCR_1CORE_BATCH = 8
"""The 1-core config's ``max_batch_size`` and preferred batch size (bench/README.md, *ocr_cls
on core 0*: the batch measured cheapest per image there)."""


def ocr_1core_config(text: str, batch: int = OCR_1CORE_BATCH) -> str:
    """ocr_cls's config.pbtxt as ``ocr_cls_1core``, what a user would write for one core: one
    instance with one intra-op thread (``intra_op_thread_count`` 1, said rather than left to
    the backend's default of the usable cores less one, which is 1 there too), ``batch`` as
    ``max_batch_size`` and ``preferred_batch_size``, a 2000 µs queue delay. At c=32 one
    instance always finds a full batch queued, so the delay never runs out."""
    out = re.sub(r'^name:\s*"ocr_cls"', f'name: "{OCR_1CORE_MODEL}"', text, flags=re.M)
    out = re.sub(r"max_batch_size:\s*\d+", f"max_batch_size: {batch}", out)
    out = re.sub(r"preferred_batch_size:\s*\[[^]]*\]", f"preferred_batch_size: [ {batch} ]", out)
    out = re.sub(r"max_queue_delay_microseconds:\s*\d+", "max_queue_delay_microseconds: 2000", out)
    out = re.sub(r"count:\s*\d+", "count: 1", out)
    want = (
        f'"{OCR_1CORE_MODEL}"',
        f"max_batch_size: {batch}",
        f"[ {batch} ]",
        ": 2000",
        "count: 1",
    )
    for w in want:
        if w not in out:
            raise BenchError(f"ocr_cls's config.pbtxt: nothing to rewrite into {w}")
    threads = 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
    return "# bench_vs_triton.py: ocr_cls configured for one core.\n" + out + threads


def _copy_repository(src: Path, dest: Path, nodelay: bool) -> None:
    shutil.copytree(src, dest, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    if nodelay:
        shutil.copytree(dest / "add_sub_py", dest / NODELAY_MODEL)
        cfg = dest / NODELAY_MODEL / "config.pbtxt"
        cfg.write_text(nodelay_config(cfg.read_text()))


def prepare_repositories(args: argparse.Namespace) -> Path | None:
    """Temporary copies of the repositories when a workload needs a model they lack:
    ``add_sub_py_nodelay`` in both, ``ocr_cls`` and ``ocr_cls_2core`` (their configs from the
    project's model_repository, the second through ``ocr_2core_config``; the ONNX file as
    ocr_cls_ort.locate_model finds it) in triton-mp's. Sets
    ``args.repository`` / ``args.mp_repository`` to the copies; returns their folder (None
    when no copy was needed)."""
    models = {w.model for w in args.workloads}
    nodelay = NODELAY_MODEL in models
    ocr = [m for m in (OCR_MODEL, OCR_2CORE_MODEL, OCR_1CORE_MODEL) if m in models]
    if not nodelay and not ocr:
        return None
    import ocr_cls_ort  # bench/: the model's location

    tmp = Path(tempfile.mkdtemp(prefix="bench_vs_triton_repo."))
    same = args.mp_repository == args.repository
    _copy_repository(args.repository, tmp / "triton", nodelay)
    if same:
        _copy_repository(args.repository, tmp / "mp", nodelay)
    else:
        _copy_repository(args.mp_repository, tmp / "mp", nodelay)
    if ocr:
        onnx, _where = ocr_cls_ort.locate_model(ROOT / "model_repository", None)
        shipped = (ROOT / "model_repository" / OCR_MODEL / "config.pbtxt").read_text()
        for name in ocr:
            dest = tmp / "mp" / name
            (dest / "1").mkdir(parents=True)
            text = {
                OCR_MODEL: shipped,
                OCR_2CORE_MODEL: ocr_2core_config(shipped),
                OCR_1CORE_MODEL: ocr_1core_config(
                    shipped, getattr(args, "core0_batch", OCR_1CORE_BATCH)
                ),
            }[name]
            (dest / "config.pbtxt").write_text(text)
            shutil.copy(onnx, dest / "1" / "model.onnx")
        args.ort_model = onnx
    args.repository, args.mp_repository = tmp / "triton", tmp / "mp"
    args.stand_in = not same
    return tmp
