import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUT = IN0 + IN1; a request holding 999 gets an INVALID_ARG error."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "IN0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "IN1").as_numpy()
            if (a == 999).any() or (b == 999).any():
                error = pb_utils.TritonError(
                    "the model cannot take 999", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out = (a + b).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
