"""A python-backend model that misbehaves on request (see __init__.py beside it)."""

import ctypes
import json
import os
import signal
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.fault = params.get("fault", {}).get("string_value", "none")
        self.sleep_s = int(params.get("sleep_ms", {}).get("string_value", "0")) / 1000
        self.kept = []

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.size and x.flat[0] == 1:
                self._fault()
            elif self.sleep_s:
                time.sleep(self.sleep_s)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.astype(np.float32))])
            )
        return responses

    def _fault(self):
        if self.fault == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif self.fault == "hang_in_c":
            # PyDLL keeps the GIL across the call, as a stuck C extension would.
            ctypes.PyDLL(None).sleep(3600)
        elif self.fault == "sleep":
            time.sleep(self.sleep_s)
        elif self.fault == "leak":
            self.kept.append(np.ones(64 << 20, np.uint8))
