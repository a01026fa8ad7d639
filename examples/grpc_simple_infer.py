"""Synchronous inference on `simple` (sum and difference of two INT32 [1, 16] tensors).

Usage: python examples/grpc_simple_infer.py [-u localhost:8001]
"""

import argparse
import sys

import numpy as np
import tritonclient.grpc as grpcclient

parser = argparse.ArgumentParser()
parser.add_argument("-u", "--url", default="localhost:8001")
args = parser.parse_args()

client = grpcclient.InferenceServerClient(args.url)
input0 = np.arange(16, dtype=np.int32).reshape(1, 16)
input1 = np.ones((1, 16), dtype=np.int32)
inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
inputs[0].set_data_from_numpy(input0)
inputs[1].set_data_from_numpy(input1)
result = client.infer("simple", inputs, outputs=None)  # no outputs named: all of them come back
for i in range(16):
    print(f"{input0[0][i]} + {input1[0][i]} = {result.as_numpy('OUTPUT0')[0][i]}, "
          f"{input0[0][i]} - {input1[0][i]} = {result.as_numpy('OUTPUT1')[0][i]}")
if not (np.array_equal(result.as_numpy("OUTPUT0"), input0 + input1)
        and np.array_equal(result.as_numpy("OUTPUT1"), input0 - input1)):
    sys.exit("wrong result")
if len(client.get_inference_statistics("simple").model_stats) != 1:
    sys.exit("expected statistics for one version")
print("PASS")
