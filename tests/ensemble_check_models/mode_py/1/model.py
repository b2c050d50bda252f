import json

import numpy as np
import triton_python_backend_utils as pb_utils

_MODES = {
    "fp32": lambda x: x,
    "int32": lambda x: x.astype(np.int32),
    "fp64": lambda x: x.astype(np.float64),
    "2x3": lambda x: np.arange(6, dtype=np.float32).reshape(2, 3),
    "1x3": lambda x: x.reshape(1, -1),
    "empty": lambda x: np.zeros((0,), np.float32),
    "bytes": lambda x: np.array([str(v).encode() for v in x], dtype=np.object_),
}


class TritonPythonModel:
    """OUT = IN in the datatype/shape the request parameter "mode" names; "missing" leaves
    OUT out of the response."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            mode = json.loads(request.parameters()).get("mode", "fp32")
            if mode == "missing":
                responses.append(pb_utils.InferenceResponse([]))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", _MODES[mode](x))]))
        return responses
