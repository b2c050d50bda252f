"""The ONNX files of the default model repository, taken from installed wheels.

Imported by the CLI before the supervisor loads the default repository (and by tests).

**PP-OCR.** The detector, recogniser and angle classifier that
``model_repository/ocr_{det,rec,cls}`` serve ship inside the PyPI package
``rapidocr-onnxruntime``. That package's own dependencies (opencv-python, Shapely, PyYAML,
tqdm, ...) are of no use to a server, so it is installed with ``pip install --no-deps`` and
never imported: this module finds its directory through ``importlib.util.find_spec`` (which
does not execute a top-level package) and copies the three ONNX files into
``<repository>/<model>/1/model.onnx``.

**Silero VAD.** The voice-activity detector that ``model_repository/silero_vad`` serves (a
python-backend wrapper that keeps each sequence's recurrent state) ships inside the PyPI
package ``silero-vad``, whose dependencies (torch, ...) are not needed either: it is installed
with ``--no-deps`` and located, never imported, the same way, and its 16 kHz opset-15 ONNX file
is copied to ``<repository>/silero_vad/1/silero_vad.onnx`` (not ``model.onnx``: the model is a
python model, and the file is data that its ``model.py`` opens).

**The recogniser's character dictionary.** ``model_repository/ocr_rec_bls`` (a python BLS
model that calls ``ocr_rec`` and decodes its CTC output into text) needs the list of the 6623
characters the recogniser's classes stand for. rapidocr-onnxruntime 1.4.4 ships no dictionary
file: the list lives in the recogniser ONNX file's metadata (key ``character``, one character a
line), where RapidOCR itself reads it. It is written out once, as PaddleOCR's plain dictionary
format, to ``<repository>/ocr_rec_bls/1/ppocr_keys.txt``, so the model directory is
self-contained (it serves unchanged when copied elsewhere, and its ``model.py`` needs neither
onnx nor the wheel at run time).

Nothing is ever downloaded here.

A materialised file is a real file (a hard link when the repository and site-packages share a
filesystem, else a copy), never a symlink, so the repository stays self-contained when copied.
It is readable by any user (mode 0644, its version directory 0755): the container image writes
``/models`` as root and serves it as uid 1000.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from triton_mp.common.errors import ConfigError
from triton_mp.common.onnx_file import OnnxFileError, read_metadata

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
    package_dir = _package_dir(RAPIDOCR_PACKAGE)
    if package_dir is None:
        raise OcrModelsMissing(
            f"the OCR models ocr_det, ocr_rec and ocr_cls need their ONNX files from the "
            f"'{RAPIDOCR_DISTRIBUTION}' package, which is not installed; install it with: "
            f"{RAPIDOCR_PIP_COMMAND}"
        )
    return package_dir / "models"


def _package_dir(package: str) -> Path | None:
    """The directory of an installed top-level package, found without importing it."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def _distribution_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed_version() -> str | None:
    return _distribution_version(RAPIDOCR_DISTRIBUTION)


READABLE_FILE = 0o644
"""Mode of every file materialised here: the container image writes ``/models`` as root at
build time and serves it as uid 1000, so a model file must be readable by any user
(``tempfile.mkstemp`` alone gives 0600)."""

READABLE_DIR = 0o755
"""Mode of a version directory created here (same reason)."""


def _make_parent(destination: Path) -> None:
    """Create ``destination``'s directory (a model's version directory) readable by all."""
    if not destination.parent.is_dir():
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.parent.chmod(READABLE_DIR)


def _place(source: Path, destination: Path) -> None:
    """Put ``source``'s bytes at ``destination`` atomically, readable by any user: a hard
    link when ``source`` is readable by all already (a link shares its mode), else a copy."""
    _make_parent(destination)
    fd, tmp_name = tempfile.mkstemp(prefix=".model.", suffix=".tmp", dir=destination.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        tmp.unlink()
        try:
            if source.stat().st_mode & 0o444 != 0o444:
                raise PermissionError("not readable by all: copy it")
            os.link(source, tmp)
        except OSError:
            # NOTE: EXDEV (another filesystem), EPERM (no links allowed) or a source that a
            # link would leave unreadable to other users: fall back to a copy.
            shutil.copyfile(source, tmp)
            tmp.chmod(READABLE_FILE)
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


SILERO_DISTRIBUTION = "silero-vad"
"""PyPI name of the distribution that carries the Silero VAD ONNX files."""

SILERO_PACKAGE = "silero_vad"
"""Import name of that distribution's package (located, never imported: it imports torch)."""

SILERO_VERSION = "6.2.3"
"""Pinned version: its wheel holds ``data/silero_vad_16k_op15.onnx`` (Silero VAD v6)."""

SILERO_PIP_COMMAND = f"pip install --no-deps {SILERO_DISTRIBUTION}=={SILERO_VERSION}"
"""The one install line that README, ``.ci/run`` and error messages all name."""

VAD_MODEL_NAME = "silero_vad"
"""Directory name of the voice-activity detector in the repository."""

VAD_WHEEL_FILE = "data/silero_vad_16k_op15.onnx"
"""The ONNX file under the package directory: 16 kHz only, opset 15.

Its signature: ``input`` FP32 ``[batch, 576]`` (64 samples of context, then a 512-sample
chunk), ``state`` FP32 ``[2, batch, 128]``, ``sr`` INT64 scalar (16000) -> ``output`` FP32
``[batch, 1]`` (speech probability) and ``stateN`` FP32 ``[2, batch, 128]``."""

VAD_MODEL_FILE = "silero_vad.onnx"
"""File name inside ``<repository>/silero_vad/<version>/`` that the wrapper's ``model.py``
opens (its config's ``onnx_file`` parameter)."""

VAD_MODEL_VERSION = "1"
"""Version directory the file is materialised into."""


class VadModelMissing(ConfigError):
    """The VAD model is needed but ``silero-vad`` (or its ONNX file) is absent."""


def silero_vad_file() -> Path:
    """Return the path of the 16 kHz ONNX file inside the installed ``silero_vad`` package.

    The package is located with ``importlib.util.find_spec`` and is not imported, so neither
    torch nor its other undeclared (``--no-deps``) dependencies are needed.

    Raises:
        VadModelMissing: the package is not installed, or its install lacks the file; the
            message names the pip command.
    """
    package_dir = _package_dir(SILERO_PACKAGE)
    if package_dir is None:
        raise VadModelMissing(
            f"the voice-activity detector {VAD_MODEL_NAME} needs its ONNX file from the "
            f"'{SILERO_DISTRIBUTION}' package, which is not installed; install it with: "
            f"{SILERO_PIP_COMMAND}"
        )
    source = package_dir / VAD_WHEEL_FILE
    if not source.is_file():
        version = _distribution_version(SILERO_DISTRIBUTION)
        raise VadModelMissing(
            f"model '{VAD_MODEL_NAME}': {source} is missing from the installed "
            f"'{SILERO_DISTRIBUTION}' package ({version or 'unknown version'}); "
            f"reinstall it with: {SILERO_PIP_COMMAND}"
        )
    return source


def materialise_vad_model(repository: Path) -> Path | None:
    """Make ``<repository>/silero_vad/1/silero_vad.onnx`` from the installed wheel.

    Same rules as ``materialise_ocr_models``: only when ``<repository>/silero_vad`` exists;
    idempotent (a destination of the source's size is left alone); a hard link or a copy
    put in place atomically, never a symlink; an existing destination is kept when the
    package is absent.

    Args:
        repository: root of a Triton model repository.

    Returns:
        The destination path, or None when the repository has no ``silero_vad`` model.

    Raises:
        VadModelMissing: the destination is missing and ``silero-vad`` is not installed (or
            lacks the file); the message names ``SILERO_PIP_COMMAND``.
    """
    if not (repository / VAD_MODEL_NAME).is_dir():
        return None
    destination = repository / VAD_MODEL_NAME / VAD_MODEL_VERSION / VAD_MODEL_FILE
    try:
        source = silero_vad_file()
    except VadModelMissing:
        if destination.is_file():
            return destination
        raise
    version = _distribution_version(SILERO_DISTRIBUTION)
    if version is not None and version != SILERO_VERSION:
        log.warning(
            "%s %s is installed, triton-mp is tested with %s (%s)",
            SILERO_DISTRIBUTION,
            version,
            SILERO_VERSION,
            SILERO_PIP_COMMAND,
        )
    if destination.is_file() and destination.stat().st_size == source.stat().st_size:
        log.debug("model '%s': %s is up to date", VAD_MODEL_NAME, destination)
    else:
        _place(source, destination)
        log.info("model '%s': materialised %s from %s", VAD_MODEL_NAME, destination, source)
    return destination


REC_BLS_MODEL_NAME = "ocr_rec_bls"
"""Directory name of the BLS recogniser-with-decoding model in the repository."""

REC_DICT_FILE = "ppocr_keys.txt"
"""File name inside ``<repository>/ocr_rec_bls/<version>/`` that its ``model.py`` reads (its
config's ``character_dict`` parameter): one character a line, UTF-8, no blank, no space class."""

REC_DICT_VERSION = "1"
"""Version directory the dictionary is materialised into."""

REC_WHEEL_FILE = "ch_PP-OCRv4_rec_infer.onnx"
"""The recogniser ONNX file of the wheel whose metadata holds the dictionary."""

REC_DICT_METADATA_KEY = "character"
"""ONNX ``metadata_props`` key of the dictionary in RapidOCR's PP-OCR exports."""


def rec_characters_from_onnx(path: Path) -> list[str]:
    """The recogniser's dictionary, read from an ONNX file's ``character`` metadata.

    Only the model's ``metadata_props`` are decoded (``common.onnx_file``: no ``onnx``
    import, the graph skipped), on every start of the project's repository.

    Args:
        path: a PP-OCR recogniser exported by RapidOCR (``ch_PP-OCRv4_rec_infer.onnx``).

    Returns:
        The characters in class order (class ``i + 1`` is ``result[i]``; class 0 is the CTC
        blank and the last class a space, neither of which is in the list).

    Raises:
        OcrModelsMissing: the file has no ``character`` metadata, or is no ONNX file.
    """
    try:
        meta = read_metadata(path)
    except OnnxFileError as exc:
        raise OcrModelsMissing(
            f"{path}: not a readable ONNX file ({exc}); reinstall the package with: "
            f"{RAPIDOCR_PIP_COMMAND}"
        ) from exc
    if REC_DICT_METADATA_KEY not in meta:
        raise OcrModelsMissing(
            f"{path}: the ONNX metadata has no '{REC_DICT_METADATA_KEY}' entry, so it holds "
            f"no character dictionary; reinstall the package with: {RAPIDOCR_PIP_COMMAND}"
        )
    characters: list[str] = meta[REC_DICT_METADATA_KEY].split("\n")
    return characters


def materialise_rec_dictionary(repository: Path) -> Path | None:
    """Write ``<repository>/ocr_rec_bls/1/ppocr_keys.txt`` from the wheel's recogniser.

    Only when ``<repository>/ocr_rec_bls`` exists. The characters come from the ``character``
    metadata of ``ch_PP-OCRv4_rec_infer.onnx`` in the installed ``rapidocr-onnxruntime``
    (located, not imported) and are written one a line, UTF-8, atomically (a temporary file
    renamed into place). Idempotent: a destination with the same text is left alone; an
    existing destination is kept when the package is absent.

    Args:
        repository: root of a Triton model repository.

    Returns:
        The destination path, or None when the repository has no ``ocr_rec_bls`` model.

    Raises:
        OcrModelsMissing: the destination is missing and the package is not installed, or
            its recogniser file (or that file's metadata) is missing; the message names
            ``RAPIDOCR_PIP_COMMAND``.
    """
    if not (repository / REC_BLS_MODEL_NAME).is_dir():
        return None
    destination = repository / REC_BLS_MODEL_NAME / REC_DICT_VERSION / REC_DICT_FILE
    try:
        source = rapidocr_models_dir() / REC_WHEEL_FILE
    except OcrModelsMissing:
        if destination.is_file():
            return destination
        raise
    if not source.is_file():
        if destination.is_file():
            return destination
        raise OcrModelsMissing(
            f"model '{REC_BLS_MODEL_NAME}': {source} is missing from the installed "
            f"'{RAPIDOCR_DISTRIBUTION}' package ({_installed_version() or 'unknown version'}); "
            f"reinstall it with: {RAPIDOCR_PIP_COMMAND}"
        )
    text = "".join(f"{c}\n" for c in rec_characters_from_onnx(source))
    if destination.is_file() and destination.read_text(encoding="utf-8") == text:
        log.debug("model '%s': %s is up to date", REC_BLS_MODEL_NAME, destination)
        return destination
    _make_parent(destination)
    fd, tmp_name = tempfile.mkstemp(prefix=".keys.", suffix=".tmp", dir=destination.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            os.fchmod(f.fileno(), READABLE_FILE)
        os.replace(tmp_name, destination)
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    log.info("model '%s': materialised %s from %s", REC_BLS_MODEL_NAME, destination, source)
    return destination


def materialise_default_models(repository: Path) -> list[Path]:
    """Materialise every wheel-shipped file the default repository needs (OCR ONNX files,
    the recogniser's dictionary for ``ocr_rec_bls``, then VAD).

    Args:
        repository: root of a Triton model repository; models it lacks are skipped.

    Returns:
        The paths of the files present now, OCR models first.

    Raises:
        OcrModelsMissing, VadModelMissing: as ``materialise_ocr_models`` and
            ``materialise_vad_model`` raise them.
    """
    placed = materialise_ocr_models(repository)
    keys = materialise_rec_dictionary(repository)
    if keys is not None:
        placed.append(keys)
    vad = materialise_vad_model(repository)
    return placed if vad is None else [*placed, vad]


def main(argv: list[str] | None = None) -> int:
    """``python -m triton_mp.cli.assets REPOSITORY``: materialise the wheel-shipped files
    into REPOSITORY once, ahead of serving (the container image runs it at build time, so
    the image serves from a read-only repository and needs neither asset wheel).

    Returns:
        0 once every file is in place; 1 (with the reason on stderr) when an asset wheel
        is missing.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m triton_mp.cli.assets")
    parser.add_argument("repository", type=Path, help="root of the model repository")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        placed = materialise_default_models(args.repository)
    except ConfigError as e:
        print(e.message, file=sys.stderr)
        return 1
    for path in placed:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
