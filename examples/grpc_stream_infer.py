"""Streaming inference: requests and responses on one ModelStreamInfer stream, matched by id.

Usage: python examples/grpc_stream_infer.py [-u localhost:8001]
"""

import argparse
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient

parser = argparse.ArgumentParser()
parser.add_argument("-u", "--url", default="localhost:8001")
args = parser.parse_args()

responses: queue.Queue = queue.Queue()
client = grpcclient.InferenceServerClient(args.url)
client.start_stream(callback=lambda result, error: responses.put((result, error)))
for n in range(8):
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(np.full((1, 16), n, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    client.async_stream_infer("simple", inputs, request_id=f"request_{n}")
got = {}
for _ in range(8):
    result, error = responses.get(timeout=30)
    if error is not None:
        sys.exit(f"stream error: {error}")
    got[result.get_response().id] = result.as_numpy("OUTPUT0")[0][0]
client.stop_stream()
client.close()  # the channel and its threads end here, not in interpreter shutdown
print(got)
if got != {f"request_{n}": n + 1 for n in range(8)}:
    sys.exit("wrong stream results")
print("PASS")
