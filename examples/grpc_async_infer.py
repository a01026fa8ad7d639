"""Asynchronous inference: callbacks on the sync client, and the asyncio client.

Usage: python examples/grpc_async_infer.py [-u localhost:8001]
"""

import argparse
import asyncio
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

parser = argparse.ArgumentParser()
parser.add_argument("-u", "--url", default="localhost:8001")
args = parser.parse_args()
data = np.arange(16, dtype=np.int32).reshape(1, 16)


def make_inputs(module):
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return inputs


done: queue.Queue = queue.Queue()
client = grpcclient.InferenceServerClient(args.url)
for _ in range(4):
    client.async_infer("simple", make_inputs(grpcclient), callback=lambda result, error: done.put((result, error)))
for _ in range(4):
    result, error = done.get(timeout=30)
    if error is not None or not np.array_equal(result.as_numpy("OUTPUT0"), data * 2):
        sys.exit(f"async_infer failed: {error}")


async def with_asyncio() -> None:
    async with aioclient.InferenceServerClient(args.url) as aio:
        results = await asyncio.gather(*(aio.infer("simple", make_inputs(aioclient)) for _ in range(4)))
        if any(not np.array_equal(r.as_numpy("OUTPUT1"), np.zeros((1, 16))) for r in results):
            sys.exit("aio infer failed")


asyncio.run(with_asyncio())
print("PASS")
