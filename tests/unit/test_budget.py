"""The request cost estimate: the buffer a gRPC request was decoded from counts, else its raw entries."""

from __future__ import annotations

import numpy as np

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.budget import MESSAGE_COPIES, RAW_COPIES, request_cost
from kserve_v2.codec.generated import request_from_message
from kserve_v2.codec.messages import InferRequest


def _request(elements: int) -> InferRequest:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    request.raw_input_contents.append(np.ones(elements, np.float32).tobytes())
    return request_from_message(request)


def test_the_received_size_is_what_counts() -> None:
    request = _request(1 << 18)
    assert request_cost(request, False, 10 << 20)[0] == (10 << 20) * MESSAGE_COPIES
    assert request_cost(request, False, 100) == (0, 0)  # under 64 KiB on the wire: not counted


def test_without_a_received_size_the_raw_entries_count() -> None:
    request = _request(1 << 18)
    assert request_cost(request, False)[0] == (1 << 20) * RAW_COPIES
    assert request_cost(_request(16), False) == (0, 0)
