import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUT = IN, after 0.5 s (one at a time, a queue of one)."""

    def execute(self, requests):
        time.sleep(0.5)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
