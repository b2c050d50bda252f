"""``common.onnx_file`` reads what ``onnx`` reads: graph inputs and outputs (initializers
left out), element types, dims (symbolic ones as None) and ``metadata_props``, on models
``onnx.helper`` builds and on the project's own ONNX files; malformed files are refused.
And the supervisor's side of it (auto-complete, the recogniser's dictionary) never imports
``onnx`` or numpy: one fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers.model_config_builders import batchable_onnx, fixed_onnx, onnx_model
from tests.helpers.server import PROJECT_REPOSITORY, REPO_ROOT
from triton_mp.common.onnx_file import (
    ELEM_TYPE_NAMES,
    GraphIO,
    OnnxFileError,
    elem_type_name,
    read_metadata,
    read_signature,
)


def _as_onnx_reads(model: onnx.ModelProto) -> tuple[list[GraphIO], list[GraphIO]]:
    """What ``onnx`` itself says about the model's inputs (initializers out) and outputs."""
    inits = {t.name for t in model.graph.initializer}

    def io(v: onnx.ValueInfoProto) -> GraphIO:
        if v.type.WhichOneof("value") != "tensor_type":
            return GraphIO(v.name, None, ())
        t = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
        return GraphIO(v.name, t.elem_type, dims)

    return [io(v) for v in model.graph.input if v.name not in inits], [
        io(v) for v in model.graph.output
    ]


def _odd_model() -> onnx.ModelProto:
    """Initializers among the inputs, an unknown and a negative dim, a sequence output,
    metadata with non-ASCII text."""
    model = onnx_model(
        [("X", TensorProto.INT64, ["n", 3]), ("W", TensorProto.FLOAT, [4])],
        [("Y", TensorProto.INT64, ["n", 3])],
        initializers=["W", "B"],
    )
    model.graph.input[0].type.tensor_type.shape.dim.add()  # neither value nor param
    model.graph.input[0].type.tensor_type.shape.dim.add().dim_value = -1
    seq = helper.make_tensor_sequence_value_info("S", TensorProto.FLOAT, None)
    model.graph.output.append(seq)
    helper.set_model_props(model, {"character": "a\nб\n字", "other": ""})
    return model


@pytest.mark.parametrize("build", [batchable_onnx, fixed_onnx, _odd_model])
def test_signature_and_metadata_as_onnx_reads_them(tmp_path: Path, build: object) -> None:
    model = build()  # type: ignore[operator]
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    sig = read_signature(path)
    assert sig.has_graph
    assert (list(sig.inputs), list(sig.outputs)) == _as_onnx_reads(model)
    assert read_metadata(path) == {p.key: p.value for p in model.metadata_props}


def test_the_odd_model_reads_as_expected(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_odd_model(), str(path))
    sig = read_signature(path)
    assert sig.inputs == (GraphIO("X", TensorProto.INT64, (None, 3, None, -1)),)
    assert sig.outputs[-1] == GraphIO("S", None, ())
    assert read_metadata(path)["character"] == "a\nб\n字"


def test_the_projects_onnx_files_read_as_onnx_reads_them() -> None:
    files = sorted(PROJECT_REPOSITORY.glob("*/1/*.onnx"))
    assert files, "no ONNX file in the project's repository"
    for path in files:
        model = onnx.load(str(path), load_external_data=False)
        sig = read_signature(path)
        assert (list(sig.inputs), list(sig.outputs)) == _as_onnx_reads(model), path
        assert read_metadata(path) == {p.key: p.value for p in model.metadata_props}, path


def test_malformed_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(batchable_onnx(), str(path))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(OnnxFileError, match="past the end"):
        read_signature(path)
    path.write_bytes(b"\xff\x00 not onnx")
    with pytest.raises(OnnxFileError, match="wire type"):
        read_metadata(path)
    path.write_bytes(b"")
    assert not read_signature(path).has_graph
    assert read_metadata(path) == {}
    with pytest.raises(OnnxFileError, match="FileNotFoundError"):
        read_signature(tmp_path / "absent.onnx")


def test_element_type_names_are_onnxs() -> None:
    """The names of the numbers both know agree (an older onnx knows fewer)."""
    known = dict((number, name) for name, number in TensorProto.DataType.items())
    for number in range(len(ELEM_TYPE_NAMES)):
        if number in known:
            assert elem_type_name(number) == known[number]
    assert elem_type_name(999) == "999"


def test_onnx_autocomplete_and_the_dictionary_import_neither_onnx_nor_numpy(
    tmp_path: Path,
) -> None:
    model_dir = tmp_path / "m" / "1"
    model_dir.mkdir(parents=True)
    model = batchable_onnx()
    helper.set_model_props(model, {"character": "a\nb"})
    onnx.save(model, str(model_dir / "model.onnx"))
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from triton_mp.cli.assets import rec_characters_from_onnx\n"
        "from triton_mp.model_config.loader import load_model\n"
        f"m = load_model(Path({str(tmp_path / 'm')!r}))\n"
        "assert m.config is not None and len(m.config.input) == 2, m.error\n"
        f"assert rec_characters_from_onnx(Path({str(model_dir / 'model.onnx')!r}))\n"
        "print(' '.join(n for n in ('onnx', 'numpy') if n in sys.modules))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "src"))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
