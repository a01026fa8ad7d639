"""A decoupled model (Triton's decoupled python models): each request's words come back one
response at a time, then the final flag alone; the request parameter `delay_ms` waits between
words. A request whose caller went away stops early."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            delay = float(json.loads(request.parameters()).get("delay_ms", 0)) / 1000
            for index, word in enumerate(text.decode("utf-8").split()):
                if request.is_cancelled():
                    break
                if index and delay:
                    time.sleep(delay)
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("text_output", np.array([word.encode("utf-8")], dtype=np.object_)),
                    pb_utils.Tensor("index", np.array([index], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
