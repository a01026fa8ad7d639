"""Business logic scripting (Triton's BLS): each request goes on to `simple` and `simple_python`
at once, through the server's own inference path; the two answers must agree."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

STEPS = ("simple", "simple_python")


class TritonPythonModel:
    async def execute(self, requests):
        return [await self.answer(request) for request in requests]

    async def answer(self, request):
        inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("INPUT0", "INPUT1")]
        calls = [pb_utils.InferenceRequest(model_name=model, inputs=inputs,
                                           requested_output_names=["OUTPUT0", "OUTPUT1"]).async_exec()
                 for model in STEPS]
        answers = await asyncio.gather(*calls)
        for model, answer in zip(STEPS, answers, strict=True):
            if answer.has_error():
                return pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{model} failed: {answer.error().message()}"))
        outputs = [[pb_utils.get_output_tensor_by_name(answer, name).as_numpy() for answer in answers]
                   for name in ("OUTPUT0", "OUTPUT1")]
        if not all(np.array_equal(*pair) for pair in outputs):
            raise pb_utils.TritonModelException("simple and simple_python disagree")
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", outputs[0][0]), pb_utils.Tensor("OUTPUT1", outputs[1][0])])
