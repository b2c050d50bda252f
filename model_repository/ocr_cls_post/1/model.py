"""PP-OCR's ClsPostProcess: probabilities [N, 2] -> label (BYTES "0"/"180") and score [N]."""

import numpy as np
import triton_python_backend_utils as pb_utils

LABELS = np.array([b"0", b"180"], dtype=np.object_)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            probs = pb_utils.get_input_tensor_by_name(request, "probs").as_numpy()
            best = probs.argmax(axis=1)
            score = probs[np.arange(len(best)), best].astype(np.float32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("label", LABELS[best]), pb_utils.Tensor("score", score)]
                )
            )
        return responses
