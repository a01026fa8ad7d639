"""A decoupled model on ModelStreamInfer: one request, many responses, each as it is sent.

`word_stream` (examples/model_repository/word_stream/1/model.py, a Triton python-backend model)
answers a text with one response per word and then a final flag; the request parameter
`delay_ms` spaces them out. Two requests share the stream; every response carries its request's
id and `triton_final_response`. A request answered once (ModelInfer) is refused, as in Triton.

Usage: python examples/grpc_decoupled_stream.py [-u localhost:8001]
"""

import argparse
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

parser = argparse.ArgumentParser()
parser.add_argument("-u", "--url", default="localhost:8001")
args = parser.parse_args()

TEXTS = {"first": "one two three", "second": "responses stream in as the model sends them"}
responses: queue.Queue = queue.Queue()
client = grpcclient.InferenceServerClient(args.url)
client.start_stream(callback=lambda result, error: responses.put((result, error)))
for request_id, text in TEXTS.items():
    text_input = grpcclient.InferInput("text_input", [1], "BYTES")
    text_input.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    # the final flag comes as a response of its own: the client learns that a request is done
    client.async_stream_infer("word_stream", [text_input], request_id=request_id, parameters={"delay_ms": 20},
                              enable_empty_final_response=True)
words: dict[str, list[str]] = {request_id: [] for request_id in TEXTS}
finished = set()
while len(finished) < len(TEXTS):
    result, error = responses.get(timeout=30)
    if error is not None:
        sys.exit(f"stream error: {error}")
    response = result.get_response()
    if response.parameters["triton_final_response"].bool_param:
        finished.add(response.id)
        continue
    word = result.as_numpy("text_output")[0].decode()
    print(f"{response.id}: {word}")
    words[response.id].append(word)
client.stop_stream()
try:
    client.infer("word_stream", [text_input])
    sys.exit("ModelInfer on a decoupled model was not refused")
except InferenceServerException as err:
    print(f"ModelInfer: {err.status()} {err.message()}")
client.close()  # the channel and its threads end here, not in interpreter shutdown
if words != {request_id: text.split() for request_id, text in TEXTS.items()}:
    sys.exit(f"wrong words: {words}")
print("PASS")
