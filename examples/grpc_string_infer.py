"""BYTES tensors: decimal strings on `simple_string`, and raw bytes with NULs on `simple_identity`.

Usage: python examples/grpc_string_infer.py [-u localhost:8001]
"""

import argparse
import sys

import numpy as np
import tritonclient.grpc as grpcclient

parser = argparse.ArgumentParser()
parser.add_argument("-u", "--url", default="localhost:8001")
args = parser.parse_args()
client = grpcclient.InferenceServerClient(args.url)

numbers = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
ones = np.array([[b"1"] * 16], dtype=np.object_)
inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"), grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]
inputs[0].set_data_from_numpy(numbers)
inputs[1].set_data_from_numpy(ones)
result = client.infer("simple_string", inputs)
sums = [int(x) for x in result.as_numpy("OUTPUT0")[0]]
differences = [int(x) for x in result.as_numpy("OUTPUT1")[0]]
print("simple_string sums:", sums, "differences:", differences)
if sums != [i + 1 for i in range(16)] or differences != [i - 1 for i in range(16)]:
    sys.exit("wrong sums or differences")

data = np.array([[b"he\x00llo", b"\x00\x01\x02\x03"]], dtype=np.object_)
tensor = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
tensor.set_data_from_numpy(data)
echoed = client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0")
print("simple_identity:", echoed)
if echoed.tolist() != [[b"he\x00llo", b"\x00\x01\x02\x03"]]:
    sys.exit("identity changed the bytes")
print("PASS")
