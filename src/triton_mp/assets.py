"""The PP-OCRv4 ONNX files of the default model repository, taken from an installed wheel.

Imported by the supervisor before it loads a repository (and by tests). The detector,
recogniser and angle classifier that ``model_repository/ocr_{det,rec,cls}`` serve ship inside
the PyPI package ``rapidocr-onnxruntime``. That package's own dependencies (opencv-python,
Shapely, PyYAML, tqdm, ...) are of no use to a server, so it is installed with
``pip install --no-deps`` and never imported: this module finds its directory through
``importlib.util.find_spec`` (which does not execute a top-level package) and copies the three
ONNX files into ``<repository>/<model>/1/model.onnx``. Nothing is ever downloaded here.

A materialised file is a real file (a hard link when the repository and site-packages share a
filesystem, else a copy), never a symlink, so the repository stays self-contained when copied.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from triton_mp.errors import ConfigError

log = logging.getLogger(__name__)

RAPIDOCR_DISTRIBUTION = "rapidocr-onnxruntime"
"""PyPI name of the distribution that carries the PP-OCR ONNX files."""

RAPIDOCR_PACKAGE = "rapidocr_onnxruntime"
"""Import name of that distribution's package (located, never imported)."""

RAPIDOCR_VERSION = "1.4.4"
"""Pinned version: its wheel holds PP-OCRv4 det/rec and the mobile v2.0 angle classifier."""

RAPIDOCR_PIP_COMMAND = (
    f"pip install --no-deps --ignore-requires-python {RAPIDOCR_DISTRIBUTION}=={RAPIDOCR_VERSION}"
)
"""The one install line that README, ``.ci/run`` and error messages all name.

``--ignore-requires-python``: the wheel declares ``<3.13`` for its own code, which is never
imported here; without the flag pip refuses it on Python 3.13+, where the ONNX files are as
good."""


@dataclass(frozen=True)
class OcrModelAsset:
    """One ONNX file of the wheel and the repository model it becomes."""

    model_name: str
    """Directory name of the model in the repository (``ocr_det`` ...)."""
    wheel_file: str
    """File name under ``rapidocr_onnxruntime/models/`` in the wheel."""


OCR_MODEL_ASSETS: tuple[OcrModelAsset, ...] = (
    OcrModelAsset("ocr_det", "ch_PP-OCRv4_det_infer.onnx"),
    OcrModelAsset("ocr_rec", "ch_PP-OCRv4_rec_infer.onnx"),
    OcrModelAsset("ocr_cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx"),
)

OCR_MODEL_VERSION = "1"
"""Version directory the files are materialised into."""


class OcrModelsMissing(ConfigError):
    """The OCR models are needed but ``rapidocr-onnxruntime`` (or a file of it) is absent."""


def rapidocr_models_dir() -> Path:
    """Return the ``models/`` directory of the installed ``rapidocr_onnxruntime`` package.

    The package is located with ``importlib.util.find_spec`` and is not imported, so none of
    its undeclared (``--no-deps``) dependencies are needed.

    Raises:
        OcrModelsMissing: the package is not installed; the message names the pip command.
    """
    spec = importlib.util.find_spec(RAPIDOCR_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise OcrModelsMissing(
            f"the OCR models ocr_det, ocr_rec and ocr_cls need their ONNX files from the "
            f"'{RAPIDOCR_DISTRIBUTION}' package, which is not installed; install it with: "
            f"{RAPIDOCR_PIP_COMMAND}"
        )
    return Path(locations[0]) / "models"


def _installed_version() -> str | None:
    try:
        return importlib.metadata.version(RAPIDOCR_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def _place(source: Path, destination: Path) -> None:
    """Put ``source``'s bytes at ``destination`` atomically: hard link, else copy."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".model.", suffix=".tmp", dir=destination.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        tmp.unlink()
        try:
            os.link(source, tmp)
        except OSError:
            # NOTE: EXDEV (another filesystem) or EPERM (no links allowed): fall back to a copy.
            shutil.copyfile(source, tmp)
        # NOTE: os.replace is atomic, so a concurrent loader sees the old file or the whole new
        # one, never a partial copy.
        os.replace(tmp, destination)
    finally:
        tmp.unlink(missing_ok=True)


def materialise_ocr_models(repository: Path) -> list[Path]:
    """Make ``<repository>/ocr_{det,rec,cls}/1/model.onnx`` from the installed wheel.

    Only models whose directory exists in ``repository`` are handled, so a user's repository
    without the OCR models needs nothing installed. Idempotent: a destination that already has
    the same size as its source is left alone; a missing or different-sized one is replaced
    atomically by a hard link to the wheel's file, or by a copy across filesystems (never a
    symlink). If the package is absent but every destination already exists, the present files
    are kept as they are.

    Args:
        repository: root of a Triton model repository (e.g. the project's
            ``model_repository/``).

    Returns:
        The ``model.onnx`` paths of the OCR models present in ``repository``, in the order
        ocr_det, ocr_rec, ocr_cls, whether written now or already there.

    Raises:
        OcrModelsMissing: a destination file is missing and ``rapidocr-onnxruntime`` is not
            installed, or its install lacks one of the ONNX files; the message names the pip
            command (``RAPIDOCR_PIP_COMMAND``).
    """
    wanted = [
        (asset, repository / asset.model_name / OCR_MODEL_VERSION / "model.onnx")
        for asset in OCR_MODEL_ASSETS
        if (repository / asset.model_name).is_dir()
    ]
    if not wanted:
        return []
    try:
        models_dir = rapidocr_models_dir()
    except OcrModelsMissing:
        if all(destination.is_file() for _, destination in wanted):
            return [destination for _, destination in wanted]
        raise

    version = _installed_version()
    if version is not None and version != RAPIDOCR_VERSION:
        log.warning(
            "%s %s is installed, triton-mp is tested with %s (%s)",
            RAPIDOCR_DISTRIBUTION,
            version,
            RAPIDOCR_VERSION,
            RAPIDOCR_PIP_COMMAND,
        )

    placed: list[Path] = []
    for asset, destination in wanted:
        source = models_dir / asset.wheel_file
        if not source.is_file():
            raise OcrModelsMissing(
                f"model '{asset.model_name}': {source} is missing from the installed "
                f"'{RAPIDOCR_DISTRIBUTION}' package ({version or 'unknown version'}); "
                f"reinstall it with: {RAPIDOCR_PIP_COMMAND}"
            )
        if destination.is_file() and destination.stat().st_size == source.stat().st_size:
            log.debug("model '%s': %s is up to date", asset.model_name, destination)
        else:
            _place(source, destination)
            log.info("model '%s': materialised %s from %s", asset.model_name, destination, source)
        placed.append(destination)
    return placed
