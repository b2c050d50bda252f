"""PP-OCR's classifier pre-processing: a BGR uint8 crop [H, W, 3] -> [1, 3, 48, 192] FP32."""

import math

import cv2
import numpy as np
import triton_python_backend_utils as pb_utils

HEIGHT, WIDTH = 48, 192


def resize_norm(crop: np.ndarray) -> np.ndarray:
    """Resize to height 48 keeping the aspect ratio (at most 192 wide), scale to [-1, 1],
    zero-pad on the right to 192 (PaddleOCR ``resize_norm_img``)."""
    h, w = crop.shape[:2]
    resized_w = min(WIDTH, math.ceil(HEIGHT * w / h))
    resized = cv2.resize(crop, (resized_w, HEIGHT)).astype(np.float32)
    chw = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    out = np.zeros((1, 3, HEIGHT, WIDTH), dtype=np.float32)
    out[0, :, :, :resized_w] = chw
    return out


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            crop = pb_utils.get_input_tensor_by_name(request, "crop").as_numpy()
            if crop.ndim != 3 or crop.shape[0] == 0 or crop.shape[1] == 0:
                error = pb_utils.TritonError(
                    f"crop must be a non-empty [H, W, 3] image, got shape {list(crop.shape)}",
                    pb_utils.TritonError.INVALID_ARG,
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            tensor = pb_utils.Tensor("x", resize_norm(np.ascontiguousarray(crop)))
            responses.append(pb_utils.InferenceResponse([tensor]))
        return responses
