"""kserve_v2: a gRPC-first KServe V2 / Open Inference Protocol server on ONNX Runtime."""

__version__ = "0.1.0"
