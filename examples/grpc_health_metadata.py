"""Health and metadata over gRPC with tritonclient (like Triton's simple_grpc_health_metadata.py).

Usage: python examples/grpc_health_metadata.py [-u localhost:8001]
"""

import argparse
import sys

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

parser = argparse.ArgumentParser()
parser.add_argument("-u", "--url", default="localhost:8001")
args = parser.parse_args()

client = grpcclient.InferenceServerClient(args.url)
if not (client.is_server_live() and client.is_server_ready() and client.is_model_ready("simple")):
    sys.exit("server or model 'simple' not ready")
server = client.get_server_metadata()
print(f"server: {server.name} {server.version}, extensions: {list(server.extensions)}")
metadata = client.get_model_metadata("simple")
print("model 'simple' inputs:", [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs])
config = client.get_model_config("simple").config
print(f"max_batch_size {config.max_batch_size}, instance group {config.instance_group[0].kind} x{config.instance_group[0].count}")
try:
    client.get_model_metadata("wrong_model_name")
    sys.exit("expected an error for an unknown model")
except InferenceServerException as err:
    if "Request for unknown model" not in err.message():
        sys.exit(f"unexpected error text: {err}")
print("PASS")
