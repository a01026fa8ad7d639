"""OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, with numpy: `simple` as a Triton
python-backend model. It runs unchanged on Triton's python backend and here (the benchmark runs
this very file on both)."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtypes = [pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)["data_type"])
                       for name in ("OUTPUT0", "OUTPUT1")]

    def execute(self, requests):
        responses = []
        for request in requests:  # the dynamic batcher may hand over several requests at once
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtypes[0])),
                       pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtypes[1]))]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
