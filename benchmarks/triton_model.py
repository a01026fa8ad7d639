"""Triton python-backend model for benchmarks/compare.py: runs one ONNX file with ONNX Runtime (CPU).

Copied into Triton's repository as ``<model>/1/model.py``; the config's ``onnx_path`` parameter is
the .onnx file. Each request of a batch Triton hands over runs on its own, as MLServer's runtime
does. Runs inside Triton's python backend stub, with the numpy and onnxruntime of its environment.
"""

import json

import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(config["parameters"]["onnx_path"]["string_value"], options,
                                             providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._outputs = [o.name for o in self._session.get_outputs()]

    def execute(self, requests):
        responses = []
        for request in requests:
            feeds = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self._inputs}
            arrays = self._session.run(self._outputs, feeds)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(name, array) for name, array in zip(self._outputs, arrays, strict=True)]))
        return responses
