"""Sentence similarity with all-MiniLM-L6-v2 over gRPC: tokenize here, embed on the server.

Tokenizes with the `tokenizers` library and the model's tokenizer.json (truncation at 256, padding
to the longest sentence), sends input_ids / attention_mask / token_type_ids (INT64 [batch, seq]),
and prints the cosine similarity of each sentence with the first. Uses the model's
`sentence_embedding` output when it has one, else mean-pools `last_hidden_state` over the mask.

Needs the model in the repository: `make models`, then restart the server.
Usage: python examples/grpc_minilm_similarity.py [-u localhost:8001] [-m all-MiniLM-L6-v2]
       [--tokenizer examples/model_repository/all-MiniLM-L6-v2/1/tokenizer.json] [sentences...]
"""

import argparse
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer

parser = argparse.ArgumentParser()
parser.add_argument("-u", "--url", default="localhost:8001")
parser.add_argument("-m", "--model", default="all-MiniLM-L6-v2")
parser.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: the model's, in the example repository)")
parser.add_argument("sentences", nargs="*", default=[
    "A man is eating food.", "A man is eating a piece of bread.", "A cheetah is running behind its prey."])
args = parser.parse_args()
tokenizer_path = args.tokenizer or Path(__file__).parent / "model_repository" / args.model / "1" / "tokenizer.json"

tokenizer = Tokenizer.from_file(str(tokenizer_path))
tokenizer.enable_truncation(max_length=256)
tokenizer.enable_padding()  # to the longest sentence of the batch
encodings = tokenizer.encode_batch(args.sentences)
features = {
    "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
    "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
    "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
}

client = grpcclient.InferenceServerClient(args.url)
outputs = {o.name for o in client.get_model_metadata(args.model).outputs}
inputs = []
for name, array in features.items():
    tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
    tensor.set_data_from_numpy(array)
    inputs.append(tensor)
if "sentence_embedding" in outputs:
    result = client.infer(args.model, inputs, outputs=[grpcclient.InferRequestedOutput("sentence_embedding")])
    embeddings = result.as_numpy("sentence_embedding")
else:
    result = client.infer(args.model, inputs, outputs=[grpcclient.InferRequestedOutput("last_hidden_state")])
    mask = features["attention_mask"][..., None].astype(np.float32)
    embeddings = (result.as_numpy("last_hidden_state") * mask).sum(axis=1) / mask.sum(axis=1)
embeddings = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
for sentence, vector in zip(args.sentences[1:], embeddings[1:], strict=True):
    print(f"cosine({args.sentences[0]!r}, {sentence!r}) = {float(vector @ embeddings[0]):.4f}")
