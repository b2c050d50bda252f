import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = 2 * IN (whatever IN's datatype and shape)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", 2 * x)]))
        return responses
