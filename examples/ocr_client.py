"""Read the text in an image with the PP-OCRv4 models served by triton-mp (or any Triton).

    python examples/ocr_client.py IMAGE [--url localhost:8001] [--rec-model PATH | --rec-dict PATH]

Three models of the project's ``model_repository/`` run in turn, through ``tritonclient.grpc``:

1. ``ocr_det`` (DB text detector) finds text boxes: the BGR image is resized so that its longer
   side is at most 960 and both sides are multiples of 32, normalised with ImageNet's mean and
   std, and the probability map is turned into boxes by PP-OCR's DB post-processing
   (threshold 0.3, box score 0.6, unclip ratio 2.0 with pyclipper, minimum size 3).
2. Each box is cut out with a perspective warp (a crop 1.5 times taller than wide is turned
   90 degrees) and ``ocr_cls`` decides whether the line is upside down (turned 180 degrees when
   it says so with a score above 0.9).
   With ``--cls-ensemble`` the raw crops go to the ``ocr_cls_pipeline`` ensemble instead, which
   resizes and normalises them on the server, runs ``ocr_cls`` and returns label and score.
3. ``ocr_rec`` reads each line at height 48 (width by aspect ratio); its output is decoded by
   CTC greedy decoding with the recogniser's character list.

This is PP-OCR's published inference pipeline (PaddleOCR ``tools/infer/predict_system.py``)
with PaddleOCR's default settings, written with numpy, opencv-python-headless and pyclipper.

**The character list.** PP-OCR's recogniser outputs class indices; the characters they stand
for are stored in the recogniser's ONNX file (metadata key ``character``), which a remote
client cannot fetch through the Triton protocol. This client therefore reads the list from a
local file: ``--rec-dict`` (a PaddleOCR dictionary, one character per line), else
``--rec-model`` (an ONNX file with the metadata), else the project's
``model_repository/ocr_rec/1/model.onnx`` (materialised by ``triton-mp start``), else the
same file inside an installed ``rapidocr-onnxruntime`` package. As PP-OCR does, index 0 is the
CTC blank and a space is appended after the last character.

**As a library.** ``OcrPipeline(infer, characters)`` takes any ``infer(model_name, inputs)``
callable that maps input names to arrays and returns output names to arrays:
``grpc_infer(url)`` talks to a server, ``onnxruntime_infer(repository)`` runs the ONNX files
in-process (the tests use it). ``OcrPipeline(...)(image_bgr)`` returns ``TextLine``s in
reading order; ``join_lines`` groups them into printed rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyclipper

InferFn = Callable[[str, Mapping[str, np.ndarray]], dict[str, np.ndarray]]
"""``infer(model_name, {input_name: array}) -> {output_name: array}``; batch dim first."""

DET_MODEL = "ocr_det"
DET_INPUT = "x"
DET_OUTPUT = "sigmoid_0.tmp_0"
CLS_MODEL = "ocr_cls"
CLS_ENSEMBLE = "ocr_cls_pipeline"
"""The ensemble pre-process -> ocr_cls -> post-process: a raw crop in, label and score out."""
CLS_INPUT = "x"
CLS_OUTPUT = "save_infer_model/scale_0.tmp_1"
REC_MODEL = "ocr_rec"
REC_INPUT = "x"
REC_OUTPUT = "softmax_11.tmp_0"

CLS_LABELS = ("0", "180")
CLS_SHAPE = (3, 48, 192)
REC_HEIGHT = 48
REC_MIN_WIDTH = 320
"""PP-OCRv4's ``rec_image_shape`` is 3,48,320: a batch is padded to at least this width."""
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REC_MODEL = PROJECT_ROOT / "model_repository" / REC_MODEL / "1" / "model.onnx"
RAPIDOCR_REC_FILE = "models/ch_PP-OCRv4_rec_infer.onnx"


@dataclass(frozen=True)
class PipelineSettings:
    """PaddleOCR's default inference settings (``tools/infer/utility.py``)."""

    det_limit_side_len: int = 960
    """Longer side limit of the detector input (``det_limit_type`` "max")."""
    det_thresh: float = 0.3
    """Pixel probability above which a pixel is text (``det_db_thresh``)."""
    det_box_thresh: float = 0.6
    """Mean probability inside a box below which the box is dropped (``det_db_box_thresh``)."""
    det_unclip_ratio: float = 2.0
    """How far a shrunk DB region is grown back: PaddleOCR 3.x's ``text_det_unclip_ratio``.

    PaddleOCR 2.x used 1.5; its boxes hug the glyphs so tightly that the recogniser drops a
    line's last letter and most spaces between English words (PaddleOCR issue 11386); 2.0 is
    the later default and reads printed English far better."""
    det_use_dilation: bool = False
    """Dilate the binary map with a 2x2 kernel before finding regions (``use_dilation``)."""
    det_min_size: int = 3
    """Boxes whose short side is below this (map pixels) are dropped."""
    det_max_candidates: int = 1000
    cls_thresh: float = 0.9
    """A line is turned 180 degrees when the classifier says "180" with more than this."""
    cls_ensemble: bool = False
    """Classify each raw crop with the server's ``ocr_cls_pipeline`` ensemble (resizing and
    normalising happen on the server) instead of pre-processing here and calling ``ocr_cls``."""
    cls_batch_size: int = 6
    rec_batch_size: int = 6
    drop_score: float = 0.5
    """Recognised lines whose mean character probability is below this are dropped."""


@dataclass(frozen=True)
class TextLine:
    """One recognised text box."""

    text: str
    score: float
    """Mean probability of the decoded characters."""
    box: np.ndarray = field(repr=False)
    """4x2 float32 corners in image pixels: top-left, top-right, bottom-right, bottom-left."""


# ---------------------------------------------------------------------------- detection


def det_preprocess(image_bgr: np.ndarray, limit_side_len: int = 960) -> np.ndarray:
    """Return the detector input ``[1, 3, H', W']`` for a BGR uint8 image.

    The image is scaled down (never up) so its longer side is at most ``limit_side_len``, then
    each side is rounded to a multiple of 32 (at least 32); pixels are scaled to [0, 1] and
    normalised with ImageNet's mean and std, channel for channel on the BGR image, as
    PaddleOCR's ``DetResizeForTest`` + ``NormalizeImage`` do.
    """
    h, w = image_bgr.shape[:2]
    ratio = min(1.0, limit_side_len / max(h, w))
    resize_h = max(round(int(h * ratio) / 32) * 32, 32)
    resize_w = max(round(int(w * ratio) / 32) * 32, 32)
    resized = cv2.resize(image_bgr, (resize_w, resize_h))
    normalised = (resized.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
    return np.ascontiguousarray(normalised.transpose(2, 0, 1)[np.newaxis], dtype=np.float32)


def _mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """Minimum-area rectangle of a contour as tl, tr, br, bl corners, and its short side."""
    rect = cv2.minAreaRect(contour)
    points = sorted(cv2.boxPoints(rect).tolist(), key=lambda p: p[0])
    left = sorted(points[:2], key=lambda p: p[1])
    right = sorted(points[2:], key=lambda p: p[1])
    box = np.array([left[0], right[0], right[1], left[1]], dtype=np.float32)
    return box, min(rect[1])


def _box_score(prob: np.ndarray, box: np.ndarray) -> float:
    """Mean probability inside ``box`` (DB's "fast" score)."""
    h, w = prob.shape
    xmin = int(np.clip(np.floor(box[:, 0].min()), 0, w - 1))
    xmax = int(np.clip(np.ceil(box[:, 0].max()), 0, w - 1))
    ymin = int(np.clip(np.floor(box[:, 1].min()), 0, h - 1))
    ymax = int(np.clip(np.ceil(box[:, 1].max()), 0, h - 1))
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    shifted = box - np.array([xmin, ymin], dtype=np.float32)
    cv2.fillPoly(mask, [shifted.astype(np.int32)], 1)
    return float(cv2.mean(prob[ymin : ymax + 1, xmin : xmax + 1], mask)[0])


def _unclip(box: np.ndarray, ratio: float) -> np.ndarray | None:
    """Grow a box by ``area * ratio / perimeter`` (DB's unclip); None if it splits."""
    area = cv2.contourArea(box)
    perimeter = cv2.arcLength(box, closed=True)
    if perimeter == 0:
        return None
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box.tolist(), pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    expanded = offset.Execute(area * ratio / perimeter)
    if len(expanded) != 1:
        return None
    return np.array(expanded[0], dtype=np.float32).reshape(-1, 1, 2)


def _order_clockwise(points: np.ndarray) -> np.ndarray:
    """Order 4 points as top-left, top-right, bottom-right, bottom-left."""
    rect = np.zeros((4, 2), dtype=np.float32)
    s = points.sum(axis=1)
    rect[0] = points[np.argmin(s)]
    rect[2] = points[np.argmax(s)]
    rest = np.delete(points, (np.argmin(s), np.argmax(s)), axis=0)
    diff = np.diff(rest, axis=1)
    rect[1] = rest[np.argmin(diff)]
    rect[3] = rest[np.argmax(diff)]
    return rect


def db_postprocess(
    prob: np.ndarray, image_shape: tuple[int, int], settings: PipelineSettings
) -> list[np.ndarray]:
    """Turn a DB probability map ``[H', W']`` into 4x2 float32 boxes in image pixels.

    ``image_shape`` is the (height, width) of the original image. Follows PaddleOCR's
    ``DBPostProcess`` (quad boxes, fast score, no dilation) and ``filter_tag_det_res``.
    """
    height, width = prob.shape
    dest_h, dest_w = image_shape
    bitmap: np.ndarray = (prob > settings.det_thresh).astype(np.uint8) * 255
    if settings.det_use_dilation:
        bitmap = cv2.dilate(bitmap, np.ones((2, 2), dtype=np.uint8))
    contours, _ = cv2.findContours(bitmap, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes: list[np.ndarray] = []
    for contour in contours[: settings.det_max_candidates]:
        points, short_side = _mini_box(contour)
        if short_side < settings.det_min_size:
            continue
        if _box_score(prob, points) < settings.det_box_thresh:
            continue
        expanded = _unclip(points, settings.det_unclip_ratio)
        if expanded is None:
            continue
        box, short_side = _mini_box(expanded)
        if short_side < settings.det_min_size + 2:
            continue
        box[:, 0] = np.clip(np.round(box[:, 0] / width * dest_w), 0, dest_w)
        box[:, 1] = np.clip(np.round(box[:, 1] / height * dest_h), 0, dest_h)
        box = _order_clockwise(box)
        box[:, 0] = np.clip(box[:, 0], 0, dest_w - 1)
        box[:, 1] = np.clip(box[:, 1], 0, dest_h - 1)
        box_w = int(np.linalg.norm(box[0] - box[1]))
        box_h = int(np.linalg.norm(box[0] - box[3]))
        if box_w <= 3 or box_h <= 3:
            continue
        boxes.append(box)
    return boxes


def sort_boxes(boxes: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Reading order: top to bottom, and left to right within 10 pixels of the same top."""
    ordered = sorted(boxes, key=lambda b: (float(b[0][1]), float(b[0][0])))
    for i in range(len(ordered) - 1):
        for j in range(i, -1, -1):
            same_row = abs(ordered[j + 1][0][1] - ordered[j][0][1]) < 10
            if same_row and ordered[j + 1][0][0] < ordered[j][0][0]:
                ordered[j], ordered[j + 1] = ordered[j + 1], ordered[j]
            else:
                break
    return ordered


# ---------------------------------------------------------------------------- crops


def crop_text_line(image_bgr: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Cut ``box`` (tl, tr, br, bl) out of the image as an upright rectangle.

    A perspective warp maps the quadrilateral onto a rectangle; a result at least 1.5 times
    taller than wide is a vertical line and is turned 90 degrees, as PP-OCR does.
    """
    points = box.astype(np.float32)
    crop_w = int(max(np.linalg.norm(points[0] - points[1]), np.linalg.norm(points[2] - points[3])))
    crop_h = int(max(np.linalg.norm(points[0] - points[3]), np.linalg.norm(points[1] - points[2])))
    target = np.array([[0, 0], [crop_w, 0], [crop_w, crop_h], [0, crop_h]], dtype=np.float32)
    matrix = cv2.getPerspectiveTransform(points, target)
    crop = cv2.warpPerspective(
        image_bgr,
        matrix,
        (crop_w, crop_h),
        borderMode=cv2.BORDER_REPLICATE,
        flags=cv2.INTER_CUBIC,
    )
    if crop.shape[0] / max(crop.shape[1], 1) >= 1.5:
        crop = np.rot90(crop)
    return np.ascontiguousarray(crop)


def _resize_norm(crop: np.ndarray, height: int, width: int, max_width: int) -> np.ndarray:
    """Resize to ``height`` keeping the aspect ratio (at most ``max_width`` wide), scale to
    [-1, 1], and zero-pad on the right to ``width``: PP-OCR's ``resize_norm_img``."""
    h, w = crop.shape[:2]
    resized_w = min(max_width, math.ceil(height * w / h))
    resized = cv2.resize(crop, (resized_w, height)).astype(np.float32)
    chw = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    padded = np.zeros((3, height, width), dtype=np.float32)
    padded[:, :, :resized_w] = chw
    return padded


def cls_preprocess(crops: Sequence[np.ndarray]) -> np.ndarray:
    """Classifier input ``[N, 3, 48, 192]`` for BGR crops."""
    _, height, width = CLS_SHAPE
    return np.stack([_resize_norm(c, height, width, width) for c in crops])


def rec_preprocess(crops: Sequence[np.ndarray]) -> np.ndarray:
    """Recogniser input ``[N, 3, 48, W]``: W fits the widest crop's aspect ratio (>= 320)."""
    max_ratio = max([REC_MIN_WIDTH / REC_HEIGHT] + [c.shape[1] / c.shape[0] for c in crops])
    width = int(REC_HEIGHT * max_ratio)
    return np.stack([_resize_norm(c, REC_HEIGHT, width, width) for c in crops])


# ---------------------------------------------------------------------------- decoding


def ctc_greedy_decode(probs: np.ndarray, characters: Sequence[str]) -> list[tuple[str, float]]:
    """Decode ``[N, T, C]`` CTC probabilities into (text, mean probability) per item.

    Takes the best class per time step, merges repeats and drops the blank (index 0).
    ``characters`` must have C entries: the blank first, PP-OCR's space last.
    """
    if probs.shape[-1] != len(characters):
        raise ValueError(
            f"the recogniser scores {probs.shape[-1]} classes but the character list has "
            f"{len(characters)} (blank and space included): wrong --rec-dict / --rec-model?"
        )
    best = probs.argmax(axis=2)
    best_prob = probs.max(axis=2)
    results = []
    for indices, scores in zip(best, best_prob, strict=True):
        keep = indices != 0
        keep[1:] &= indices[1:] != indices[:-1]
        text = "".join(characters[i] for i in indices[keep])
        score = float(scores[keep].mean()) if keep.any() else 0.0
        results.append((text, score))
    return results


def with_ctc_specials(characters: Sequence[str]) -> list[str]:
    """PP-OCR's class list from a dictionary: blank at index 0, a space appended at the end."""
    return ["blank", *characters, " "]


def load_rec_characters(path: Path) -> list[str]:
    """Read the recogniser's class list (blank and space added) from ``path``.

    ``path`` is either an ONNX file whose metadata holds the dictionary under ``character``
    (RapidOCR's PP-OCR exports; read with ``onnx`` without loading weights into a session), or
    a PaddleOCR dictionary text file with one character per line.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: an ONNX file without ``character`` metadata.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix == ".onnx":
        import onnx  # NOTE: only needed for this path; a --rec-dict user needs no onnx.

        model = onnx.load(str(path), load_external_data=False)
        meta = {p.key: p.value for p in model.metadata_props}
        if "character" not in meta:
            raise ValueError(f"{path}: the ONNX metadata has no 'character' entry")
        return with_ctc_specials(meta["character"].split("\n"))
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return with_ctc_specials([line.rstrip("\r") for line in lines])


def default_rec_model() -> Path:
    """The local recogniser ONNX file used when neither --rec-dict nor --rec-model is given.

    The project's materialised ``model_repository/ocr_rec/1/model.onnx`` if present, else the
    file inside an installed ``rapidocr-onnxruntime`` (located, not imported).

    Raises:
        FileNotFoundError: neither exists.
    """
    if DEFAULT_REC_MODEL.is_file():
        return DEFAULT_REC_MODEL
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / RAPIDOCR_REC_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no recogniser character list: {DEFAULT_REC_MODEL} is missing (run `triton-mp start` "
        "once to materialise it) and rapidocr-onnxruntime is not installed; "
        "pass --rec-model or --rec-dict"
    )


# ---------------------------------------------------------------------------- pipeline


def _chunks(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class OcrPipeline:
    """PP-OCR's detect -> crop -> classify -> recognise, over an ``InferFn``.

    Args:
        infer: runs one model: ``infer(model_name, {input: array}) -> {output: array}``.
        characters: the recogniser's class list, blank first and space last
            (``load_rec_characters``).
        settings: thresholds and batch sizes; PaddleOCR's defaults when omitted.
    """

    def __init__(
        self,
        infer: InferFn,
        characters: Sequence[str],
        settings: PipelineSettings | None = None,
    ) -> None:
        self.infer = infer
        self.characters = list(characters)
        self.settings = settings or PipelineSettings()

    def detect(self, image_bgr: np.ndarray) -> list[np.ndarray]:
        """Text boxes (4x2 float32, image pixels) in reading order."""
        tensor = det_preprocess(image_bgr, self.settings.det_limit_side_len)
        prob = self.infer(DET_MODEL, {DET_INPUT: tensor})[DET_OUTPUT]
        boxes = db_postprocess(prob[0, 0], image_bgr.shape[:2], self.settings)
        return sort_boxes(boxes)

    def classify(self, crops: list[np.ndarray]) -> list[tuple[str, float]]:
        """Orientation label ("0" or "180") and score per crop; turns upside-down crops in place.

        Crops are sent in batches of ``cls_batch_size`` ordered by aspect ratio, as PP-OCR does.
        """
        results: list[tuple[str, float]] = [("0", 0.0)] * len(crops)
        if self.settings.cls_ensemble:
            for i, crop in enumerate(crops):
                out = self.infer(CLS_ENSEMBLE, {"crop": np.ascontiguousarray(crop, np.uint8)})
                label, score = out["label"][0], float(out["score"][0])
                results[i] = (label.decode() if isinstance(label, bytes) else str(label), score)
                if results[i][0] == "180" and score > self.settings.cls_thresh:
                    crops[i] = cv2.rotate(crops[i], cv2.ROTATE_180)
            return results
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / crops[i].shape[0])
        for chunk in _chunks(order, self.settings.cls_batch_size):
            batch = cls_preprocess([crops[i] for i in chunk])
            probs = self.infer(CLS_MODEL, {CLS_INPUT: batch})[CLS_OUTPUT]
            for i, row in zip(chunk, probs, strict=True):
                label = CLS_LABELS[int(row.argmax())]
                score = float(row.max())
                results[i] = (label, score)
                if label == "180" and score > self.settings.cls_thresh:
                    crops[i] = cv2.rotate(crops[i], cv2.ROTATE_180)
        return results

    def recognise(self, crops: Sequence[np.ndarray]) -> list[tuple[str, float]]:
        """Text and mean character probability per crop.

        Crops are batched by ``rec_batch_size`` in order of aspect ratio, so a batch pads to a
        similar width, as PP-OCR does.
        """
        results: list[tuple[str, float]] = [("", 0.0)] * len(crops)
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / crops[i].shape[0])
        for chunk in _chunks(order, self.settings.rec_batch_size):
            batch = rec_preprocess([crops[i] for i in chunk])
            probs = self.infer(REC_MODEL, {REC_INPUT: batch})[REC_OUTPUT]
            for i, decoded in zip(chunk, ctc_greedy_decode(probs, self.characters), strict=True):
                results[i] = decoded
        return results

    def __call__(self, image_bgr: np.ndarray) -> list[TextLine]:
        """Recognised text boxes of a BGR uint8 image, in reading order.

        Lines scoring below ``drop_score`` are left out, as in PP-OCR.
        """
        boxes = self.detect(image_bgr)
        if not boxes:
            return []
        crops = [crop_text_line(image_bgr, box) for box in boxes]
        self.classify(crops)
        lines = []
        for box, (text, score) in zip(boxes, self.recognise(crops), strict=True):
            if score >= self.settings.drop_score and text.strip():
                lines.append(TextLine(text=text, score=score, box=box))
        return lines


def join_lines(lines: Sequence[TextLine]) -> list[str]:
    """Group boxes into printed rows: boxes whose vertical centres lie within half a box
    height of a row's first box share that row, joined left to right with a space."""
    rows: list[list[TextLine]] = []
    for line in sorted(lines, key=lambda ln: float(ln.box[:, 1].mean())):
        centre = float(line.box[:, 1].mean())
        height = float(line.box[:, 1].max() - line.box[:, 1].min())
        if rows:
            first = rows[-1][0]
            first_centre = float(first.box[:, 1].mean())
            first_height = float(first.box[:, 1].max() - first.box[:, 1].min())
            if abs(centre - first_centre) < 0.5 * min(height, first_height):
                rows[-1].append(line)
                continue
        rows.append([line])
    return [
        " ".join(ln.text.strip() for ln in sorted(row, key=lambda ln: float(ln.box[:, 0].min())))
        for row in rows
    ]


# ---------------------------------------------------------------------------- backends


def grpc_infer(url: str = "localhost:8001") -> InferFn:
    """An ``InferFn`` that calls a Triton gRPC server with ``tritonclient.grpc``.

    Every output of the model is returned (the request names none, so the server sends all).
    """
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    client = grpcclient.InferenceServerClient(url=url)

    def infer(model_name: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        requests = []
        for name, array in inputs.items():
            array = np.ascontiguousarray(array)
            tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            requests.append(tensor)
        result = client.infer(model_name, requests)
        outputs: dict[str, np.ndarray] = {}
        for output in result.get_response().outputs:
            array = result.as_numpy(output.name)
            if array is None:
                raise RuntimeError(f"model '{model_name}': no data for output '{output.name}'")
            outputs[output.name] = array
        return outputs

    return infer


def onnxruntime_infer(repository: Path = PROJECT_ROOT / "model_repository") -> InferFn:
    """An ``InferFn`` that runs ``<repository>/<model>/1/model.onnx`` in-process with
    onnxruntime on CPU (one session per model, created on first use)."""
    import onnxruntime as ort

    sessions: dict[str, Any] = {}

    def infer(model_name: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = sessions.get(model_name)
        if session is None:
            path = repository / model_name / "1" / "model.onnx"
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            sessions[model_name] = session
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, dict(inputs)), strict=True))

    return infer


# ---------------------------------------------------------------------------- CLI


def load_image(path: Path) -> np.ndarray:
    """Read an image file as BGR uint8 (what PP-OCR expects). Raises ValueError if unreadable."""
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"{path}: not a readable image")
    return image


def main(argv: list[str] | None = None) -> int:
    """Command line entry: print the text of IMAGE, one row per line."""
    parser = argparse.ArgumentParser(
        description="Print the text in IMAGE, read by the ocr_det, ocr_cls and ocr_rec models "
        "of a Triton (or triton-mp) server.",
        epilog="The recogniser's character list is not served by Triton: it is read from a "
        f"local file, --rec-dict, else --rec-model, else {DEFAULT_REC_MODEL} (written by "
        "`triton-mp start`), else the installed rapidocr-onnxruntime package.",
    )
    parser.add_argument("image", type=Path, help="image file (PNG, JPEG, ...)")
    parser.add_argument("--url", default="localhost:8001", help="gRPC host:port of the server")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--rec-model",
        type=Path,
        help="local copy of the served ocr_rec ONNX file, read for its 'character' metadata",
    )
    source.add_argument(
        "--rec-dict", type=Path, help="PaddleOCR dictionary file, one character per line"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="also print each box, its score and corners"
    )
    parser.add_argument(
        "--cls-ensemble",
        action="store_true",
        help=f"classify raw crops with the server's {CLS_ENSEMBLE} ensemble",
    )
    args = parser.parse_args(argv)

    try:
        image = load_image(args.image)
        characters = load_rec_characters(args.rec_dict or args.rec_model or default_rec_model())
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = PipelineSettings(cls_ensemble=args.cls_ensemble)
    pipeline = OcrPipeline(grpc_infer(args.url), characters, settings)
    lines = pipeline(image)
    if args.verbose:
        for line in lines:
            corners = " ".join(f"{x:.0f},{y:.0f}" for x, y in line.box)
            print(f"# {line.score:.3f} [{corners}] {line.text}", file=sys.stderr)
    for row in join_lines(lines):
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
