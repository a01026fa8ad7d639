"""Sentence similarity over gRPC with tritonclient: text in, embeddings out.

Sends the sentences as a BYTES tensor `text` to a text-embedding model (the all-MiniLM-L6-v2
adapter that `make models` installs), reads the FP32 `dense` output (mean-pooled, L2-normalised
on the server) and prints the cosine similarity of each sentence with the first. With
`-m minilm_embed` the same runs through the text pipeline (examples/text_pipeline: a python
tokenizer, MiniLM on ONNX Runtime and a python pooling step in an ensemble), `TEXT` in and
`EMBEDDING` out.

Needs the model in the repository: `make models`, then `make serve` again.
Usage: python examples/grpc_minilm_similarity.py [-u localhost:8001] [-m all-MiniLM-L6-v2] [sentences...]
"""

import argparse

import numpy as np
import tritonclient.grpc as grpcclient

parser = argparse.ArgumentParser()
parser.add_argument("-u", "--url", default="localhost:8001")
parser.add_argument("-m", "--model", default="all-MiniLM-L6-v2")
parser.add_argument("sentences", nargs="*", default=[
    "A man is eating food.", "A man is eating a piece of bread.", "A cheetah is running behind its prey."])
args = parser.parse_args()
# the tensors of the text pipeline's ensemble; a text adapter's are `text` and `dense`
text_name, vector_name = ("TEXT", "EMBEDDING") if args.model == "minilm_embed" else ("text", "dense")

text = grpcclient.InferInput(text_name, [len(args.sentences)], "BYTES")
text.set_data_from_numpy(np.array([s.encode() for s in args.sentences], dtype=object))
with grpcclient.InferenceServerClient(args.url) as client:
    result = client.infer(args.model, [text], outputs=[grpcclient.InferRequestedOutput(vector_name)])
embeddings = result.as_numpy(vector_name)
for sentence, vector in zip(args.sentences[1:], embeddings[1:], strict=True):
    print(f"cosine({args.sentences[0]!r}, {sentence!r}) = {float(vector @ embeddings[0]):.4f}")
