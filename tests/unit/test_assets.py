"""Materialising the PP-OCR ONNX files from the rapidocr-onnxruntime wheel into a repository.

Most tests point ``find_spec`` at a fake package of small files, so they need neither the real
wheel nor its 16 MB; one test checks the real install when it is present.
"""

from __future__ import annotations

import errno
import importlib.machinery
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from triton_mp import assets
from triton_mp.errors import ConfigError

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
