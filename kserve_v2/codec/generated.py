"""Between the codec's objects and the generated protobuf classes, through the wire format (exact by
construction): for callers that build or read ``grpc_service_pb2`` messages (text models and other in-process
callers, tests). Each crossing copies the tensor data once, as the generated classes do."""

from __future__ import annotations

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.codec.messages import InferRequest, InferResponse
from kserve_v2.codec.requests import decode_request
from kserve_v2.codec.responses import encode_response


def request_from_message(message: pb.ModelInferRequest) -> InferRequest:
    """The codec's request for a generated ``ModelInferRequest``."""
    return decode_request(message.SerializeToString())


def response_to_message(response: InferResponse) -> pb.ModelInferResponse:
    """The generated ``ModelInferResponse`` for the codec's response."""
    return pb.ModelInferResponse.FromString(encode_response(response))
