import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUT = 2 * IN."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = (2 * x).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
