"""The request cost estimate: the buffer a gRPC request was decoded from counts, else its raw entries."""

from __future__ import annotations

import numpy as np

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.codec.generated import request_from_message
from kserve_v2.codec.messages import InferRequest
from kserve_v2.request.budget import MESSAGE_COPIES, RAW_COPIES, request_cost


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


def test_a_shape_beyond_its_data_is_counted_for_the_data() -> None:
    """BYTES [1, 2^40] with two 40 KB elements, and FP32 contents of 20,000 values under a shape whose
    element count overflows int64: counted for the data they carry (their decoding then refuses them
    with Triton's text), not for the shape (RESOURCE_EXHAUSTED before)."""
    text = pb.ModelInferRequest(model_name="m")
    text.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 2**40])
    text.raw_input_contents.append((40_000).to_bytes(4, "little") * 2 + b"x" * 80_000)
    wire = text.ByteSize()
    cost, elements = request_cost(request_from_message(text), False, wire)
    assert elements == wire // 4 and cost < 2**30
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="INPUT0", datatype="FP32", shape=[16, 2**60 + 2]).contents.fp32_contents.extend([0.5] * 20_000)
    wire = typed.ByteSize()
    assert request_cost(request_from_message(typed), False, wire)[0] == wire * MESSAGE_COPIES + wire * 4
