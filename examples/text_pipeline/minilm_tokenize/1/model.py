"""MiniLM's tokenizer as a python step: texts (BYTES) in, the graph's token tensors out, padded to the
longest text and cut at 256 tokens (sentence-transformers' max_seq_length for all-MiniLM-L6-v2)."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

MAX_TOKENS = 256


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "tokenizer.json")
        self.tokenizer = Tokenizer.from_file(path)
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding()  # to the longest text of the request

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            encoded = self.tokenizer.encode_batch([text.decode("utf-8") for text in texts])
            tensors = {"input_ids": [e.ids for e in encoded], "attention_mask": [e.attention_mask for e in encoded],
                       "token_type_ids": [e.type_ids for e in encoded]}
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(name, np.array(values, dtype=np.int64).reshape(len(texts), -1))
                for name, values in tensors.items()]))
        return responses
