"""The request cost estimate: the wire size a transport already knows replaces upb's ByteSize."""

from __future__ import annotations

import numpy as np

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.budget import MESSAGE_COPIES, request_cost


def _request(elements: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    request.raw_input_contents.append(np.ones(elements, np.float32).tobytes())
    return request


def test_the_received_size_gives_the_cost_byte_size_gives() -> None:
    request = _request(1 << 18)
    assert request_cost(request, False, None, request.ByteSize()) == request_cost(request, False)
    assert request_cost(request, False)[0] == request.ByteSize() * MESSAGE_COPIES


def test_the_received_size_is_what_counts() -> None:
    request = _request(1 << 18)
    assert request_cost(request, False, None, 10 << 20)[0] == (10 << 20) * MESSAGE_COPIES
    assert request_cost(request, False, None, 100) == (0, 0)  # under 64 KiB on the wire: not counted
