"""The repository loader on real-world config.pbtxt files (shared/reference/configs).

Each corpus file is placed as ``<tmp>/<model>/config.pbtxt`` with a version directory ``1``
holding the file its backend needs: for ONNX models an ONNX graph whose signature matches the
config (so auto-complete reads a real graph), for other backends an empty placeholder.

* ``load_model`` never raises: it returns a config or an error.
* Files that are invalid on purpose (SOURCES.md: TEMPLATED, SEMANTICALLY INVALID BY DESIGN,
  FRAGMENT, PARTIAL, and F12's runtime escape) fail with an error naming the model or file.
* Where a file loads, the effective config keeps every field the file set (a superset check:
  normalisation and auto-complete may only add).

The corpus lives next to the repository, not in it; the tests skip when it is absent.
"""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest
from google.protobuf import text_format
from google.protobuf.message import Message
from onnx import TensorProto, helper

from triton_mp._proto import model_config_pb2 as pb
from triton_mp.model_config.loader import RepositoryModel, load_model

CONFIGS_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "configs"
SOURCES_MD = CONFIGS_DIR / "SOURCES.md"
CONFIG_FILES = sorted(CONFIGS_DIR.glob("*.pbtxt")) if CONFIGS_DIR.is_dir() else []

GPU_IDS = (0,)
"""The corpus has KIND_GPU groups and ``gpus: [0]``; load as a one-GPU server."""

INVALID_MARKERS = ("TEMPLATED", "SEMANTICALLY INVALID BY DESIGN", "FRAGMENT", "PARTIAL")

# F12 sets `runtime` to a path escaping the model directory; SOURCES.md says Triton rejects it
# at load by design, without one of the markers above.
INVALID_EXTRA_IDS = frozenset({"F12"})

# Files triton-mp must load (backends onnxruntime, python, tensorrt, and ensembles), proving the
# superset check below is not vacuous.
MUST_LOAD_IDS = frozenset(
    {
        "F01",  # onnxruntime_onnx, max_batch_size 0, reshape, NCHW
        "F02",  # onnxruntime_onnx, sequence_batching oldest with controls
        "F03",  # python, TYPE_STRING, mbs 8
        "F05",  # pytorch, sequence controls and implicit state, all <name>__<index>
        "F07",  # python, decoupled, model_warmup
        "F11",  # pytorch_libtorch, KIND_MODEL, OUTPUT__n naming
        "F13",  # pytorch: both platform and backend, named instance_group
        "F17",  # empty file + model.py: everything from auto-complete
        "F19",  # ensemble with optional inputs
        "F21",  # python, sequence_batching oldest
        "F22",  # python, BF16
        "F23",  # onnxruntime, repeated `input [ ]` blocks, version_policy latest
        "F24",  # tensorrt_plan with profile, KIND_GPU
        "F25",  # ensemble, version_policy all
        "F26",  # python decoupled
        "F27",  # tensorrt_plan, label_filename
        "F30",  # ensemble dali -> tensorrt
        "F34",  # onnxruntime with optimization and warmup
        "F35",  # 5-step ensemble
        "F36",  # python, iterative sequence, oldest {}
        "F42",  # tensorrt_plan, cc_model_filenames
        "F43",  # pytorch_libtorch, reshape to scalar, optimization.cuda.graphs
        "F44",  # tensorrt_plan, `gpus: 0`
        "F45",  # python, optional inputs
        "F46",  # onnxruntime, dynamic batching, accelerators
        "F51",  # python, reshape to scalar, dynamic_batching { }
        "F53",  # ensemble, canonical text format
    }
)

# Model files the QA test that owns a file puts beside it, where the config names no backend.
EXTRA_MODEL_FILES = {"F17": "model.py"}

_DEFAULT_FILENAMES = {
    "onnxruntime": "model.onnx",
    "onnxruntime_onnx": "model.onnx",
    "python": "model.py",
    "pytorch": "model.pt",
    "pytorch_libtorch": "model.pt",
    "tensorrt": "model.plan",
    "tensorrt_plan": "model.plan",
}

_CONFIG_TO_ONNX_DTYPE = {
    pb.TYPE_BOOL: TensorProto.BOOL,
    pb.TYPE_UINT8: TensorProto.UINT8,
    pb.TYPE_UINT16: TensorProto.UINT16,
    pb.TYPE_UINT32: TensorProto.UINT32,
    pb.TYPE_UINT64: TensorProto.UINT64,
    pb.TYPE_INT8: TensorProto.INT8,
    pb.TYPE_INT16: TensorProto.INT16,
    pb.TYPE_INT32: TensorProto.INT32,
    pb.TYPE_INT64: TensorProto.INT64,
    pb.TYPE_FP16: TensorProto.FLOAT16,
    pb.TYPE_FP32: TensorProto.FLOAT,
    pb.TYPE_FP64: TensorProto.DOUBLE,
    pb.TYPE_STRING: TensorProto.STRING,
    pb.TYPE_BF16: TensorProto.BFLOAT16,
}


def _source_rows() -> dict[str, tuple[str, str]]:
    """file name -> (id, whole table row) from SOURCES.md."""
    rows: dict[str, tuple[str, str]] = {}
    if not SOURCES_MD.is_file():
        return rows
    for line in SOURCES_MD.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\| (F\d+) \| `([^`]+)`", line)
        if match:
            rows[match.group(2)] = (match.group(1), line)
    return rows


SOURCES = _source_rows()


def _file_id(path: Path) -> str:
    return SOURCES.get(path.name, ("F??", ""))[0]


def _invalid_on_purpose(path: Path) -> bool:
    file_id, row = SOURCES.get(path.name, ("", ""))
    return file_id in INVALID_EXTRA_IDS or any(marker in row for marker in INVALID_MARKERS)


def _parse(path: Path) -> pb.ModelConfig | None:
    config = pb.ModelConfig()
    try:
        text_format.Parse(path.read_text(encoding="utf-8"), config)
    except text_format.ParseError:
        return None
    return config


def _onnx_for(config: pb.ModelConfig) -> onnx.ModelProto:
    """An ONNX graph whose signature is what the config describes (reshape wins over dims)."""

    def value_info(io: pb.ModelInput | pb.ModelOutput, index: int) -> onnx.ValueInfoProto:
        shape = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
        if config.max_batch_size > 0:
            shape = [-1, *shape]
        dims: list[int | str] = [d if d >= 0 else f"d{index}_{i}" for i, d in enumerate(shape)]
        elem = _CONFIG_TO_ONNX_DTYPE.get(io.data_type, TensorProto.FLOAT)
        return helper.make_tensor_value_info(io.name, elem, dims)

    inputs = [value_info(io, i) for i, io in enumerate(config.input)]
    outputs = [value_info(io, 100 + i) for i, io in enumerate(config.output)]
    nodes = [helper.make_node("Identity", [inputs[0].name], [o.name]) for o in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _place(path: Path, root: Path) -> Path:
    """Lay ``path`` out as a one-model repository under ``root``; return the model directory."""
    parsed = _parse(path)
    name = parsed.name if parsed is not None and parsed.name else f"model_{_file_id(path).lower()}"
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_bytes(path.read_bytes())
    if parsed is None:
        return model_dir
    for out in parsed.output:
        if out.label_filename:
            # NOTE: the label file the config names, as its model directory holds it (Triton
            # reads it at load: without it the model fails to load).
            (model_dir / out.label_filename).write_text("label0\nlabel1\n")
    filename = (
        parsed.default_model_filename
        or _DEFAULT_FILENAMES.get(parsed.backend or parsed.platform)
        or EXTRA_MODEL_FILES.get(_file_id(path))
    )
    if filename is None:
        return model_dir
    target = model_dir / "1" / filename
    if filename.endswith(".onnx") and parsed.input and parsed.output:
        onnx.save(_onnx_for(parsed), str(target))
    else:
        target.write_text("")
    return model_dir


def _load(path: Path, root: Path, auto_complete: bool) -> RepositoryModel:
    return load_model(_place(path, root), auto_complete=auto_complete, gpu_ids=GPU_IDS)


def _assert_superset(original: Message, effective: Message, where: str = "config") -> None:
    """Every field set in ``original`` is set to the same value in ``effective``.

    Repeated fields may grow (auto-complete appends) but keep their leading elements; maps may
    gain keys; messages are compared field by field.
    """
    for field, value in original.ListFields():
        path = f"{where}.{field.name}"
        got = getattr(effective, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for key, item in value.items():
                assert key in got, f"{path}[{key!r}] missing"
                if isinstance(item, Message):
                    _assert_superset(item, got[key], f"{path}[{key!r}]")
                else:
                    assert got[key] == item, f"{path}[{key!r}]: {got[key]!r} != {item!r}"
        elif field.is_repeated:
            assert len(got) >= len(value), f"{path}: {len(got)} < {len(value)} elements"
            for index, (want, have) in enumerate(zip(value, got, strict=False)):
                if isinstance(want, Message):
                    _assert_superset(want, have, f"{path}[{index}]")
                else:
                    assert have == want, f"{path}[{index}]: {have!r} != {want!r}"
        elif field.message_type is not None:
            assert effective.HasField(field.name), f"{path} missing"
            _assert_superset(value, got, path)
        else:
            assert got == value, f"{path}: {got!r} != {value!r}"


pytestmark = pytest.mark.skipif(
    not CONFIG_FILES,
    reason="config corpus not present (../shared/reference/configs beside the clone)",
)


def _ids(paths: list[Path]) -> list[str]:
    return [f"{_file_id(p)}-{p.name[:50]}" for p in paths]


@pytest.mark.parametrize("auto_complete", [True, False], ids=["autocomplete", "strict"])
@pytest.mark.parametrize("path", CONFIG_FILES, ids=_ids(CONFIG_FILES))
def test_load_model_never_raises(tmp_path: Path, path: Path, auto_complete: bool) -> None:
    model = _load(path, tmp_path, auto_complete)
    if model.error is None:
        assert model.config is not None
        assert model.versions
    else:
        assert isinstance(model.error, str)
        assert model.error.strip()
        assert model.versions == ()


INVALID_FILES = [p for p in CONFIG_FILES if _invalid_on_purpose(p)]


@pytest.mark.parametrize("auto_complete", [True, False], ids=["autocomplete", "strict"])
@pytest.mark.parametrize("path", INVALID_FILES, ids=_ids(INVALID_FILES))
def test_invalid_on_purpose_fails_clearly(tmp_path: Path, path: Path, auto_complete: bool) -> None:
    model = _load(path, tmp_path, auto_complete)
    assert model.error is not None, f"{_file_id(path)} is invalid on purpose but loaded"
    assert model.versions == ()
    config_path = str(tmp_path / model.name / "config.pbtxt")
    assert model.name in model.error or config_path in model.error, model.error


LOADABLE_FILES = [p for p in CONFIG_FILES if _file_id(p) in MUST_LOAD_IDS]
OTHER_FILES = [p for p in CONFIG_FILES if _file_id(p) not in MUST_LOAD_IDS]


@pytest.mark.parametrize("auto_complete", [True, False], ids=["autocomplete", "strict"])
@pytest.mark.parametrize("path", LOADABLE_FILES, ids=_ids(LOADABLE_FILES))
def test_effective_config_keeps_every_field(
    tmp_path: Path, path: Path, auto_complete: bool
) -> None:
    original = _parse(path)
    assert original is not None
    model = _load(path, tmp_path, auto_complete)
    assert model.error is None, model.error
    assert model.config is not None
    assert model.versions
    assert model.config.name == model.name
    _assert_superset(original, model.config)


@pytest.mark.parametrize("auto_complete", [True, False], ids=["autocomplete", "strict"])
@pytest.mark.parametrize("path", OTHER_FILES, ids=_ids(OTHER_FILES))
def test_other_real_configs_fail_clearly(tmp_path: Path, path: Path, auto_complete: bool) -> None:
    """Unsupported backends, templates and invalid configs: an error naming the model or file."""
    model = _load(path, tmp_path, auto_complete)
    assert model.error is not None, f"{_file_id(path)} loaded; add it to MUST_LOAD_IDS"
    config_path = str(tmp_path / model.name / "config.pbtxt")
    assert model.name in model.error or config_path in model.error, model.error


def test_corpus_has_the_expected_files() -> None:
    present = {_file_id(p) for p in CONFIG_FILES}
    assert present >= MUST_LOAD_IDS
    assert "F??" not in present, "a corpus file is missing from SOURCES.md"
