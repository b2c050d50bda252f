"""Materialising the PP-OCR ONNX files from the rapidocr-onnxruntime wheel into a repository.

Most tests point ``find_spec`` at a fake package of small files, so they need neither the real
wheel nor its 16 MB; one test checks the real install when it is present.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.machinery
import importlib.util
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from triton_mp.cli import assets
from triton_mp.common.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
OCR_MODELS = ("ocr_det", "ocr_rec", "ocr_cls")


def _repository_copy(tmp_path: Path) -> Path:
    """Copy the project's OCR config.pbtxt files (not any materialised ONNX) into tmp_path."""
    repo = tmp_path / "repo"
    for name in OCR_MODELS:
        (repo / name).mkdir(parents=True)
        shutil.copyfile(
            ROOT / "model_repository" / name / "config.pbtxt", repo / name / "config.pbtxt"
        )
    return repo


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``rapidocr_onnxruntime`` directory whose ``models/`` hold distinct bytes."""
    package_dir = tmp_path / "site-packages" / assets.RAPIDOCR_PACKAGE
    models = package_dir / "models"
    models.mkdir(parents=True)
    for i, asset in enumerate(assets.OCR_MODEL_ASSETS):
        (models / asset.wheel_file).write_bytes(bytes([i + 1]) * (100 + i))

    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec | None:
        if name == assets.RAPIDOCR_PACKAGE:
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(package_dir)]
            return spec
        return real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(assets, "_installed_version", lambda: assets.RAPIDOCR_VERSION)
    return models


@pytest.fixture
def no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec | None:
        if name == assets.RAPIDOCR_PACKAGE:
            return None
        return real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_materialises_each_model_as_a_real_file(tmp_path: Path, fake_package: Path) -> None:
    repo = _repository_copy(tmp_path)
    placed = assets.materialise_ocr_models(repo)
    assert placed == [repo / name / "1" / "model.onnx" for name in OCR_MODELS]
    for asset, path in zip(assets.OCR_MODEL_ASSETS, placed, strict=True):
        assert not path.is_symlink()
        assert path.read_bytes() == (fake_package / asset.wheel_file).read_bytes()
    assert sorted(p.name for p in (repo / "ocr_det" / "1").iterdir()) == ["model.onnx"]


def test_is_idempotent(tmp_path: Path, fake_package: Path) -> None:
    repo = _repository_copy(tmp_path)
    first = assets.materialise_ocr_models(repo)
    before = [(p.stat().st_ino, p.stat().st_mtime_ns) for p in first]
    second = assets.materialise_ocr_models(repo)
    assert second == first
    assert [(p.stat().st_ino, p.stat().st_mtime_ns) for p in second] == before


def test_replaces_a_file_of_another_size(tmp_path: Path, fake_package: Path) -> None:
    repo = _repository_copy(tmp_path)
    stale = repo / "ocr_rec" / "1" / "model.onnx"
    stale.parent.mkdir()
    stale.write_bytes(b"truncated")
    assets.materialise_ocr_models(repo)
    assert stale.read_bytes() == (fake_package / "ch_PP-OCRv4_rec_infer.onnx").read_bytes()


def test_copies_when_a_hard_link_is_impossible(
    tmp_path: Path, fake_package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_link(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    repo = _repository_copy(tmp_path)
    for asset, path in zip(
        assets.OCR_MODEL_ASSETS, assets.materialise_ocr_models(repo), strict=True
    ):
        source = fake_package / asset.wheel_file
        assert path.read_bytes() == source.read_bytes()
        assert path.stat().st_ino != source.stat().st_ino


def test_only_models_present_in_the_repository(tmp_path: Path, fake_package: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "ocr_cls").mkdir(parents=True)
    (repo / "add_sub").mkdir()
    assert assets.materialise_ocr_models(repo) == [repo / "ocr_cls" / "1" / "model.onnx"]
    assert not (repo / "ocr_det").exists()


def test_missing_package_names_the_pip_command(tmp_path: Path, no_package: None) -> None:
    repo = _repository_copy(tmp_path)
    with pytest.raises(ConfigError) as info:
        assets.materialise_ocr_models(repo)
    assert isinstance(info.value, assets.OcrModelsMissing)
    assert assets.RAPIDOCR_PIP_COMMAND in info.value.message
    assert f"rapidocr-onnxruntime=={assets.RAPIDOCR_VERSION}" in info.value.message
    assert "--no-deps" in info.value.message


def test_missing_package_is_fine_without_ocr_models(tmp_path: Path, no_package: None) -> None:
    repo = tmp_path / "repo"
    (repo / "add_sub" / "1").mkdir(parents=True)
    assert assets.materialise_ocr_models(repo) == []


def test_missing_package_keeps_files_already_materialised(
    tmp_path: Path, fake_package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repository_copy(tmp_path)
    placed = assets.materialise_ocr_models(repo)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    assert assets.materialise_ocr_models(repo) == placed


def test_package_without_a_model_file(tmp_path: Path, fake_package: Path) -> None:
    (fake_package / "ch_PP-OCRv4_det_infer.onnx").unlink()
    with pytest.raises(assets.OcrModelsMissing, match="ocr_det.*reinstall it with: pip install"):
        assets.materialise_ocr_models(_repository_copy(tmp_path))


def test_the_package_is_located_not_imported() -> None:
    if importlib.util.find_spec(assets.RAPIDOCR_PACKAGE) is None:
        pytest.skip(f"rapidocr-onnxruntime is not installed ({assets.RAPIDOCR_PIP_COMMAND})")
    import sys

    models = assets.rapidocr_models_dir()
    assert assets.RAPIDOCR_PACKAGE not in sys.modules
    for asset in assets.OCR_MODEL_ASSETS:
        assert (models / asset.wheel_file).is_file()


def test_real_wheel_materialises(tmp_path: Path) -> None:
    if importlib.util.find_spec(assets.RAPIDOCR_PACKAGE) is None:
        pytest.skip(f"rapidocr-onnxruntime is not installed ({assets.RAPIDOCR_PIP_COMMAND})")
    repo = _repository_copy(tmp_path)
    models = assets.rapidocr_models_dir()
    for asset, path in zip(
        assets.OCR_MODEL_ASSETS, assets.materialise_ocr_models(repo), strict=True
    ):
        assert path.stat().st_size == (models / asset.wheel_file).stat().st_size


# --- Silero VAD --------------------------------------------------------------------------


def _vad_repository(tmp_path: Path) -> Path:
    """Copy the project's silero_vad model (config and model.py, no ONNX) into tmp_path."""
    repo = tmp_path / "repo"
    model = repo / assets.VAD_MODEL_NAME
    (model / "1").mkdir(parents=True)
    source = ROOT / "model_repository" / assets.VAD_MODEL_NAME
    shutil.copyfile(source / "config.pbtxt", model / "config.pbtxt")
    shutil.copyfile(source / "1" / "model.py", model / "1" / "model.py")
    return repo


@pytest.fixture
def fake_silero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``silero_vad`` directory; returns its ONNX file."""
    package_dir = tmp_path / "site-packages" / assets.SILERO_PACKAGE
    onnx_file = package_dir / assets.VAD_WHEEL_FILE
    onnx_file.parent.mkdir(parents=True)
    onnx_file.write_bytes(b"\x07" * 321)
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec | None:
        if name == assets.SILERO_PACKAGE:
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(package_dir)]
            return spec
        return real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return onnx_file


@pytest.fixture
def no_silero(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec | None:
        return None if name == assets.SILERO_PACKAGE else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_vad_model_is_materialised_beside_model_py(tmp_path: Path, fake_silero: Path) -> None:
    repo = _vad_repository(tmp_path)
    placed = assets.materialise_vad_model(repo)
    assert placed == repo / "silero_vad" / "1" / "silero_vad.onnx"
    assert not placed.is_symlink()
    assert placed.read_bytes() == fake_silero.read_bytes()
    assert sorted(p.name for p in placed.parent.iterdir()) == ["model.py", "silero_vad.onnx"]
    inode = placed.stat().st_ino
    assert assets.materialise_vad_model(repo) == placed
    assert placed.stat().st_ino == inode, "idempotent"


def test_vad_file_of_another_size_is_replaced(tmp_path: Path, fake_silero: Path) -> None:
    repo = _vad_repository(tmp_path)
    stale = repo / "silero_vad" / "1" / "silero_vad.onnx"
    stale.write_bytes(b"old")
    assets.materialise_vad_model(repo)
    assert stale.read_bytes() == fake_silero.read_bytes()


def test_no_vad_model_needs_no_package(tmp_path: Path, no_silero: None) -> None:
    repo = tmp_path / "repo"
    (repo / "add_sub").mkdir(parents=True)
    assert assets.materialise_vad_model(repo) is None


def test_missing_silero_names_the_pip_command(tmp_path: Path, no_silero: None) -> None:
    with pytest.raises(ConfigError) as info:
        assets.materialise_vad_model(_vad_repository(tmp_path))
    assert isinstance(info.value, assets.VadModelMissing)
    assert assets.SILERO_PIP_COMMAND in info.value.message
    assert "pip install --no-deps silero-vad==6.2.3" in info.value.message


def test_missing_silero_keeps_a_file_already_there(
    tmp_path: Path, fake_silero: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _vad_repository(tmp_path)
    placed = assets.materialise_vad_model(repo)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    assert assets.materialise_vad_model(repo) == placed


def test_silero_without_its_onnx_file(tmp_path: Path, fake_silero: Path) -> None:
    fake_silero.unlink()
    with pytest.raises(assets.VadModelMissing, match="silero_vad.*reinstall it with: pip install"):
        assets.materialise_vad_model(_vad_repository(tmp_path))


def test_default_models_are_ocr_then_vad(
    tmp_path: Path, fake_package: Path, fake_silero: Path
) -> None:
    repo = _repository_copy(tmp_path)
    shutil.copytree(_vad_repository(tmp_path / "vad") / "silero_vad", repo / "silero_vad")
    placed = assets.materialise_default_models(repo)
    assert placed == [
        *(repo / name / "1" / "model.onnx" for name in OCR_MODELS),
        repo / "silero_vad" / "1" / "silero_vad.onnx",
    ]


def test_real_silero_wheel_is_located_not_imported(tmp_path: Path) -> None:
    if importlib.util.find_spec(assets.SILERO_PACKAGE) is None:
        pytest.skip(f"silero-vad is not installed ({assets.SILERO_PIP_COMMAND})")
    import sys

    source = assets.silero_vad_file()
    assert assets.SILERO_PACKAGE not in sys.modules, "importing it would import torch"
    placed = assets.materialise_vad_model(_vad_repository(tmp_path))
    assert placed is not None
    assert placed.stat().st_size == source.stat().st_size


# --- the recogniser's dictionary for ocr_rec_bls -------------------------------------------


def _onnx_with_characters(path: Path, characters: list[str] | None) -> None:
    """A one-node ONNX file whose metadata holds ``characters`` (one a line), or nothing."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph)
    if characters is not None:
        helper.set_model_props(model, {"character": "\n".join(characters)})
    onnx.save(model, str(path))


def _bls_repository(tmp_path: Path) -> Path:
    """Copy the project's ocr_rec_bls model (config and model.py, no dictionary)."""
    repo = tmp_path / "repo"
    shutil.copytree(
        ROOT / "model_repository" / assets.REC_BLS_MODEL_NAME,
        repo / assets.REC_BLS_MODEL_NAME,
        ignore=shutil.ignore_patterns(assets.REC_DICT_FILE, "__pycache__"),
    )
    return repo


def test_dictionary_is_written_from_the_recogniser_metadata(
    tmp_path: Path, fake_package: Path
) -> None:
    characters = ["0", "a", "中", "'", "€"]
    _onnx_with_characters(fake_package / assets.REC_WHEEL_FILE, characters)
    repo = _bls_repository(tmp_path)
    placed = assets.materialise_rec_dictionary(repo)
    assert placed == repo / assets.REC_BLS_MODEL_NAME / "1" / assets.REC_DICT_FILE
    assert placed.read_text(encoding="utf-8").split("\n") == [*characters, ""]
    before = placed.stat().st_mtime_ns
    assert assets.materialise_rec_dictionary(repo) == placed
    assert placed.stat().st_mtime_ns == before, "an up-to-date dictionary is left alone"
    placed.write_text("stale\n", encoding="utf-8")
    assets.materialise_rec_dictionary(repo)
    assert placed.read_text(encoding="utf-8") == "".join(f"{c}\n" for c in characters)
    assert sorted(p.name for p in placed.parent.iterdir()) == ["model.py", assets.REC_DICT_FILE]


def test_dictionary_needs_the_model_directory(tmp_path: Path, fake_package: Path) -> None:
    assert assets.materialise_rec_dictionary(_repository_copy(tmp_path)) is None


def test_dictionary_without_metadata_names_the_pip_command(
    tmp_path: Path, fake_package: Path
) -> None:
    _onnx_with_characters(fake_package / assets.REC_WHEEL_FILE, None)
    with pytest.raises(assets.OcrModelsMissing, match="no 'character' entry.*pip install"):
        assets.materialise_rec_dictionary(_bls_repository(tmp_path))


def test_dictionary_without_package(tmp_path: Path, no_package: None) -> None:
    repo = _bls_repository(tmp_path)
    with pytest.raises(assets.OcrModelsMissing, match="pip install --no-deps"):
        assets.materialise_rec_dictionary(repo)
    kept = repo / assets.REC_BLS_MODEL_NAME / "1" / assets.REC_DICT_FILE
    kept.write_text("a\n", encoding="utf-8")
    assert assets.materialise_rec_dictionary(repo) == kept
    assert kept.read_text(encoding="utf-8") == "a\n"


def test_real_wheel_dictionary_fits_the_recogniser(tmp_path: Path) -> None:
    """6623 characters: with the blank and the space, the 6625 classes of ocr_rec's output."""
    if importlib.util.find_spec(assets.RAPIDOCR_PACKAGE) is None:
        pytest.skip(f"rapidocr-onnxruntime is not installed ({assets.RAPIDOCR_PIP_COMMAND})")
    placed = assets.materialise_rec_dictionary(_bls_repository(tmp_path))
    assert placed is not None
    lines = placed.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""
    assert len(lines) - 1 + 2 == 6625


# --- every file and directory written is readable by any user -----------------------------


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The build stage's umask (it runs as root; the container's user is another uid)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _world_readable(path: Path) -> bool:
    mode = stat.S_IMODE(path.stat().st_mode)
    wanted = 0o555 if path.is_dir() else 0o444
    return mode & wanted == wanted


@pytest.mark.parametrize("link", [True, False], ids=["hard-link", "copy"])
@pytest.mark.parametrize(("mask", "wheel_mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_written_files_are_readable_by_any_user(
    tmp_path: Path,
    fake_package: Path,
    fake_silero: Path,
    link: bool,
    mask: int,
    wheel_mode: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The image's build stage writes /models as root; its runtime user is uid 1000, so a
    file of mode 0600 (tempfile.mkstemp's) or a directory of 0700 keeps a model from loading
    (issue 39: ocr_rec_bls's ppocr_keys.txt kept the server not ready forever)."""
    if not link:

        def no_link(src: object, dst: object) -> None:
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(os, "link", no_link)
    _onnx_with_characters(fake_package / assets.REC_WHEEL_FILE, ["a", "b"])
    for wheel_file in [*fake_package.iterdir(), fake_silero]:
        wheel_file.chmod(wheel_mode)  # a wheel installed under the same umask
    repo = _repository_copy(tmp_path)
    shutil.copytree(_bls_repository(tmp_path / "bls") / "ocr_rec_bls", repo / "ocr_rec_bls")
    shutil.copytree(_vad_repository(tmp_path / "vad") / "silero_vad", repo / "silero_vad")
    with umask(mask):
        placed = assets.materialise_default_models(repo)
    assert len(placed) == 5
    for path in placed:
        assert _world_readable(path), f"{path}: {stat.filemode(path.stat().st_mode)}"
        assert _world_readable(path.parent), f"{path.parent}: {oct(path.parent.stat().st_mode)}"
    for wheel_file in fake_package.iterdir():
        assert stat.S_IMODE(wheel_file.stat().st_mode) == wheel_mode, "the wheel's, untouched"
