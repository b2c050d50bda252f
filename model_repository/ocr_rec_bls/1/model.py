"""Text-line images in, text out: BLS in front of the PP-OCRv4 recogniser ``ocr_rec``.

A Triton python model (``backend: "python"``) written as Triton's BLS examples are: each
request's ``IMAGE`` (UINT8 ``[N, H, W, C]``, BGR or grey text lines) is resized the way PP-OCR
resizes recogniser input, sent to ``ocr_rec`` with ``pb_utils.InferenceRequest(...)
.async_exec()`` (every request of the batch at once, from ``async def execute``), and the
recogniser's CTC probabilities are decoded greedily into ``TEXT`` (BYTES, UTF-8) and ``SCORE``
(FP32, mean probability of the kept characters), both ``[N, 1]``.

The character dictionary is ``<version>/ppocr_keys.txt`` (config parameter
``character_dict``), one character a line, which ``triton-mp start`` writes from the
``character`` metadata of the rapidocr-onnxruntime recogniser (see config.pbtxt). Class 0 is the
CTC blank, classes ``1..len(dict)`` the dictionary and the last class a space, as in PaddleOCR.

Errors are per request, as in Triton: an image of the wrong shape fails its request with
INVALID_ARG; an error from ``ocr_rec`` fails its request with that error's message and code.
"""

import asyncio
import json
import math
from pathlib import Path

import cv2
import numpy as np
import triton_python_backend_utils as pb_utils

REC_MODEL = "ocr_rec"
REC_INPUT = "x"
REC_OUTPUT = "softmax_11.tmp_0"
REC_HEIGHT = 48
REC_MIN_WIDTH = 320
"""PP-OCRv4's rec_image_shape is 3,48,320: lines are padded to at least this width."""
REC_MAX_WIDTH = 3200
"""Longest line (at height 48) handed to the recogniser, about 150 characters: a longer one
is refused instead of tying up ``ocr_rec`` with a huge tensor (a 1 x 20000 strip would be
a 48 x 960000 input); split such lines before sending them."""


def resize_norm(line, width):
    """PP-OCR's ``resize_norm_img``: ``[H, W, 3]`` uint8 BGR -> ``[3, 48, width]`` float32.

    The line is resized to height 48 keeping its aspect ratio (at most ``width`` wide) with
    cv2's bilinear filter, scaled to [-1, 1], and zero-padded on the right to ``width``.
    """
    h, w = line.shape[:2]
    resized_w = min(width, math.ceil(REC_HEIGHT * w / h))
    resized = cv2.resize(line, (resized_w, REC_HEIGHT)).astype(np.float32)
    chw = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    padded = np.zeros((3, REC_HEIGHT, width), dtype=np.float32)
    padded[:, :, :resized_w] = chw
    return padded


def preprocess(images):
    """``[N, H, W, C]`` uint8 (C = 3 BGR or 1 grey) -> recogniser input ``[N, 3, 48, W']``.

    ``W'`` fits the lines' aspect ratio and is at least 320, as PP-OCR computes it.

    Raises:
        ValueError: any other shape (the message says what was expected).
    """
    if images.ndim != 4 or images.shape[3] not in (1, 3):
        raise ValueError(
            f"IMAGE must be [N, height, width, 3] (BGR) or [N, height, width, 1] (grey) "
            f"uint8 text lines, got shape {list(images.shape)}"
        )
    n, h, w, _ = images.shape
    if n == 0 or h == 0 or w == 0:
        raise ValueError(f"IMAGE has no pixels: shape {list(images.shape)}")
    if images.shape[3] == 1:
        images = np.repeat(images, 3, axis=3)
    width = int(REC_HEIGHT * max(REC_MIN_WIDTH / REC_HEIGHT, w / h))
    if width > REC_MAX_WIDTH:
        raise ValueError(
            f"IMAGE lines of {w}x{h} pixels are {width} wide at height {REC_HEIGHT}, more "
            f"than the {REC_MAX_WIDTH} the recogniser is given: split the line"
        )
    return np.stack([resize_norm(line, width) for line in images])


def ctc_greedy_decode(probs, characters):
    """``[N, T, C]`` probabilities -> list of (text, mean probability of kept characters).

    Best class per step, repeats merged, blank (class 0) dropped. ``characters`` holds the
    C classes: the blank first and the space last.

    Raises:
        ValueError: C differs from ``len(characters)``.
    """
    if probs.ndim != 3 or probs.shape[2] != len(characters):
        raise ValueError(
            f"'{REC_MODEL}' returned {REC_OUTPUT} of shape {list(probs.shape)}, but the "
            f"dictionary has {len(characters)} classes (blank and space included): "
            "is ppocr_keys.txt the recogniser's dictionary?"
        )
    best = probs.argmax(axis=2)
    best_prob = probs.max(axis=2)
    results = []
    for indices, scores in zip(best, best_prob, strict=True):
        keep = indices != 0
        keep[1:] &= indices[1:] != indices[:-1]
        text = "".join(characters[i] for i in indices[keep])
        results.append((text, float(scores[keep].mean()) if keep.any() else 0.0))
    return results


class TritonPythonModel:
    """Resize, recognise through ``ocr_rec`` (BLS), decode."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {
            key: value.get("string_value", "")
            for key, value in config.get("parameters", {}).items()
        }
        keys = Path(args["model_repository"]) / args["model_version"]
        keys = keys / parameters.get("character_dict", "ppocr_keys.txt")
        if not keys.is_file():
            raise pb_utils.TritonModelException(
                f"{keys} is missing: it is the recogniser's dictionary, which triton-mp start "
                "writes from the rapidocr-onnxruntime wheel when it serves the default "
                "repository (pip install --no-deps --ignore-requires-python "
                "rapidocr-onnxruntime==1.4.4)"
            )
        lines = keys.read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        self.characters = ["blank", *(line.rstrip("\r") for line in lines), " "]
        pb_utils.Logger.log_info(
            f"ocr_rec_bls {args['model_instance_name']}: {len(self.characters)} classes from {keys}"
        )

    async def execute(self, requests):
        return list(await asyncio.gather(*(self._recognise(r) for r in requests)))

    async def _recognise(self, request):
        images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
        try:
            batch = preprocess(images)
        except ValueError as e:
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)
            )
        answer = await pb_utils.InferenceRequest(
            model_name=REC_MODEL,
            requested_output_names=[REC_OUTPUT],
            inputs=[pb_utils.Tensor(REC_INPUT, batch)],
        ).async_exec()
        if answer.has_error():
            error = answer.error()
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(f"{REC_MODEL}: {error.message()}", error.code())
            )
        probs = pb_utils.get_output_tensor_by_name(answer, REC_OUTPUT).as_numpy()
        try:
            decoded = ctc_greedy_decode(probs, self.characters)
        except ValueError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        text = np.array([[t.encode("utf-8")] for t, _ in decoded], dtype=np.object_)
        score = np.array([[s] for _, s in decoded], dtype=np.float32)
        return pb_utils.InferenceResponse(
            [pb_utils.Tensor("TEXT", text), pb_utils.Tensor("SCORE", score)]
        )
