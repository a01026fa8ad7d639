"""Sequences: requests tied by a correlation id, as Triton's sequence client examples send them.

Two sequences with integer ids and one with a string id, each started with ``sequence_start`` and
closed with ``sequence_end``; the server feeds the models' START / END / READY / CORRID inputs and
keeps the accumulator's state. Without ``-d``: ``simple_sequence`` (OUTPUT = INPUT, +1 on START).
With ``-d``: ``simple_dyna_sequence`` (also + the id on END) and the accumulator
``simple_string_dyna_sequence`` (running sum, + the id on END).

Usage: python examples/grpc_sequence_infer.py [-u localhost:8001] [-d]
"""

import argparse
import sys
import uuid

import numpy as np
import tritonclient.grpc as grpcclient

parser = argparse.ArgumentParser()
parser.add_argument("-u", "--url", default="localhost:8001")
parser.add_argument("-d", "--dyna", action="store_true", help="the dyna models (CORRID, implicit state)")
args = parser.parse_args()

client = grpcclient.InferenceServerClient(args.url)
values = [11, 7, 5, 3, 2, 0, 1]


def send(model: str, sequence_id: int | str, sequence: list[int]) -> list[int]:
    """One sequence, a request at a time: START on the first, END on the last."""
    outputs = []
    for n, value in enumerate(sequence):
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=n == 0,
                              sequence_end=n == len(sequence) - 1)
        outputs.append(int(result.as_numpy("OUTPUT")[0][0]))
    return outputs


int_model = "simple_dyna_sequence" if args.dyna else "simple_sequence"
string_model = "simple_string_dyna_sequence" if args.dyna else "simple_sequence"
string_id = "1002" if args.dyna else str(uuid.uuid4())  # the accumulator adds int(id) on END
seq0 = send(int_model, 1000, [0] + values)
seq1 = send(int_model, 1001, [100] + [-v for v in values])
strings = send(string_model, string_id, [20] + [-v for v in values])
for n in range(len(seq0)):
    expected = [1 if n == 0 else values[n - 1], 101 if n == 0 else -values[n - 1]]
    if args.dyna:
        expected.append(20 if n == 0 else strings[n - 1] - values[n - 1])
    else:
        expected.append(21 if n == 0 else -values[n - 1])
    if args.dyna and n == len(seq0) - 1:
        expected = [expected[0] + 1000, expected[1] + 1001, expected[2] + int(string_id)]
    print(f"[{n}] {seq0[n]} : {seq1[n]} : {strings[n]}")
    if [seq0[n], seq1[n], strings[n]] != expected:
        sys.exit(f"expected {expected}")
print("PASS")
