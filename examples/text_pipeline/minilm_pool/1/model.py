"""Sentence embeddings from MiniLM's token embeddings, with numpy: the mean over each text's real
tokens (the attention mask), L2-normalised (sentence-transformers' mean pooling)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "last_hidden_state").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()[..., None].astype(np.float32)
            mean = (tokens * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
            unit = mean / np.clip(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12, None)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("EMBEDDING", unit.astype(np.float32))]))
        return responses
