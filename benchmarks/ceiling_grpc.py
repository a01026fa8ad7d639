"""The gRPC ceiling: a bare grpc.aio + uvloop servicer that does only the protocol work.

grpc.aio parses each ModelInferRequest; ModelInfer answers a response prepared at start for
`simple` (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 of perf_analyzer's default data),
and for `identity_fp32` a response whose one raw output is the request's raw input (no model,
no validation, no metrics). ModelMetadata and ModelConfig answer from the example repository's
config.pbtxt so perf_analyzer can drive it. What our server costs above this is our own code.

``--workers N`` runs N such processes on the port (``SO_REUSEPORT``), as ``kserve-v2 --workers N`` does.

Usage: python benchmarks/ceiling_grpc.py --port N --repository examples/model_repository [--workers N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import grpc
import uvloop
from google.protobuf import text_format

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import grpc_service_pb2_grpc as pb_grpc
from kserve_v2._proto import model_config_pb2 as mc
from processes import fork_workers  # sibling module

MODELS = ("simple", "identity_fp32")
DTYPES = {mc.TYPE_INT32: "INT32", mc.TYPE_FP32: "FP32"}


def configs(repository: Path) -> dict[str, mc.ModelConfig]:
    """The example models' configurations as written (platform onnxruntime_onnx, max_batch_size 8)."""
    return {name: text_format.Parse((repository / name / "config.pbtxt").read_text(), mc.ModelConfig())
            for name in MODELS}


def metadata(config: mc.ModelConfig) -> pb.ModelMetadataResponse:
    """ModelMetadata as a V2 server gives it: the batch dim as -1 before the configured dims."""
    response = pb.ModelMetadataResponse(name=config.name, versions=["1"], platform=config.platform)
    for tensors, out in ((config.input, response.inputs), (config.output, response.outputs)):
        for tensor in tensors:
            out.add(name=tensor.name, datatype=DTYPES[tensor.data_type], shape=[-1, *tensor.dims])
    return response


def simple_response() -> pb.ModelInferResponse:
    """`simple`'s answer to one row of INPUT0 = 0..15 and INPUT1 = 1 (a prepared response)."""
    response = pb.ModelInferResponse(model_name="simple", model_version="1")
    for name in ("OUTPUT0", "OUTPUT1"):
        response.outputs.add(name=name, datatype="INT32", shape=[1, 16])
        response.raw_output_contents.append(bytes(64))
    return response


class Ceiling(pb_grpc.GRPCInferenceServiceServicer):
    """Prepared answers to the RPCs perf_analyzer and tritonclient make."""

    def __init__(self, repository: Path) -> None:
        self._configs = configs(repository)
        self._metadata = {name: metadata(config) for name, config in self._configs.items()}
        self._simple = simple_response()
        self._answered = 0

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="ceiling", version="0")

    async def ModelStatistics(self, request, context):
        response = pb.ModelStatisticsResponse()
        response.model_stats.add(name=request.name, version="1").inference_stats.success.count = self._answered
        return response

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=request.name in self._configs)

    async def ModelMetadata(self, request, context):
        return self._metadata[request.name]

    async def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(config=self._configs[request.name])

    async def ModelInfer(self, request, context):
        self._answered += 1
        if request.model_name == "simple":
            return self._simple
        response = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        response.outputs.add(name="OUTPUT0", datatype="FP32", shape=request.inputs[0].shape)
        response.raw_output_contents.append(request.raw_input_contents[0])
        return response


async def serve(port: int, repository: Path, shared: bool = False) -> None:
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 2**31 - 1),
                                      ("grpc.max_receive_message_length", 2**31 - 1),
                                      ("grpc.so_reuseport", int(shared))])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Ceiling(repository), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"ceiling gRPC listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    args = parser.parse_args()
    fork_workers(args.workers)
    uvloop.run(serve(args.port, args.repository, shared=args.workers > 1))


if __name__ == "__main__":
    main()
