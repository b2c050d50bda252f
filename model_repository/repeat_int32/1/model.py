"""A decoupled Triton python model: zero or many responses per request.

For a request with IN of n elements the model sends n responses, the i-th after waiting
DELAY[i] milliseconds, with OUT = [IN[i]] and IDX = [i], then ends the request with
TRITONSERVER_RESPONSE_COMPLETE_FINAL (IN of shape [0]: no response, only the end). The
responses are sent by a thread of their own; execute returns after WAIT milliseconds, so
the instance takes its next request while earlier ones are still answering. A request whose
client goes away (stream cancelled) stops early with a CANCELLED error.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                f"model '{args['model_name']}' sends many responses per request: set "
                "model_transaction_policy { decoupled: true } in its config"
            )
        self.out_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUT")["data_type"]
        )
        self.idx_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "IDX")["data_type"]
        )
        self.threads = []
        self.lock = threading.Lock()

    def execute(self, requests):
        wait_ms = 0
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            sender = request.get_response_sender()
            if values.shape != delays.shape:
                error = pb_utils.TritonError(
                    f"expected IN and DELAY shape to match, got {list(values.shape)} and "
                    f"{list(delays.shape)}",
                    pb_utils.TritonError.INVALID_ARG,
                )
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            thread = threading.Thread(
                target=self.respond, args=(request, sender, values, delays), daemon=True
            )
            with self.lock:
                self.threads = [t for t in self.threads if t.is_alive()] + [thread]
            thread.start()
            wait_ms = max(wait_ms, int(wait[0]))
        time.sleep(wait_ms / 1000)
        return None

    def respond(self, request, sender, values, delays):
        for i, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(int(delay) / 1000)
            if request.is_cancelled():
                pb_utils.Logger.log_info(
                    f"request '{request.request_id()}' cancelled after {i} responses"
                )
                error = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                return
            sender.send(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUT", np.array([value], dtype=self.out_dtype)),
                        pb_utils.Tensor("IDX", np.array([i], dtype=self.idx_dtype)),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=10)
