"""The codec's own promises, beside its equality with upb (test_codec_differential.py): tensor data
is never copied on the way in and copied once on the way out, headers seen before are not decoded
again, and typed contents of any size decode without a Python loop per packed element."""

from __future__ import annotations

import numpy as np
import pytest

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.codec import requests as codec_requests
from kserve_v2.codec.messages import InferParameter, InferResponse, OutputTensor, parameter
from kserve_v2.codec.requests import decode_request
from kserve_v2.codec.responses import encode_response, encode_stream_response
from kserve_v2.codec.wire import WireError, packed_varints


def _request(request_id: str, *payloads: bytes) -> bytes:
    message = pb.ModelInferRequest(model_name="identity", id=request_id)
    message.parameters["sequence_start"].bool_param = True
    for i, payload in enumerate(payloads):
        message.inputs.add(name=f"INPUT{i}", datatype="FP32", shape=[len(payload) // 4])
        message.raw_input_contents.append(payload)
    message.outputs.add(name="OUTPUT0")
    return message.SerializeToString()


def test_raw_entries_are_views_of_the_received_buffer() -> None:
    payload = np.arange(1 << 16, dtype="<f4").tobytes()
    data = _request("a", payload, b"\x01\x02\x03\x04")
    request = decode_request(data)
    first, second = request.raw_input_contents
    assert isinstance(first, memoryview) and first.obj is data and first.readonly
    assert np.frombuffer(first, "<f4")[-1] == (1 << 16) - 1
    assert bytes(second) == b"\x01\x02\x03\x04"


def test_a_header_seen_before_is_shared_and_the_id_and_data_are_each_requests_own() -> None:
    codec_requests._headers.clear()
    first = decode_request(_request("1", bytes(8)))
    second = decode_request(_request("2", b"\x00\x00\x80\x3f" * 2))
    assert first.header is second.header and len(codec_requests._headers) == 1
    assert (first.id, second.id) == ("1", "2")
    assert np.frombuffer(second.raw_input_contents[0], "<f4").tolist() == [1.0, 1.0]
    assert first.parameters == {"sequence_start": InferParameter("bool_param", True)}
    third = decode_request(_request("3", bytes(12)))  # another shape: another header
    assert third.header is not first.header and third.inputs[0].shape == [3]


def test_the_header_cache_is_bounded() -> None:
    codec_requests._headers.clear()
    for size in range(codec_requests.MAX_HEADERS + 5):
        decode_request(_request("", bytes(4 * size)))
    assert len(codec_requests._headers) <= codec_requests.MAX_HEADERS


def test_an_invalid_message_is_a_wire_error() -> None:
    with pytest.raises(WireError):
        decode_request(_request("x", bytes(8))[:-3])


def test_packed_varints_decode_in_bulk_as_protobuf_writes_them() -> None:
    values = np.array([0, 1, 127, 128, 300, 2**32, 2**63, 2**64 - 1], np.uint64)
    message = pb.InferTensorContents(uint64_contents=[int(v) for v in values] * 100)
    data = message.SerializeToString()
    assert data[0] == 0x2A  # field 5, packed
    start = 1 + (2 if data[1] & 0x80 else 1)
    assert packed_varints(data, start, len(data)).tolist() == values.tolist() * 100
    with pytest.raises(WireError):
        packed_varints(b"\x80", 0, 1)
    with pytest.raises(WireError):
        packed_varints(b"\xff" * 10 + b"\x01", 0, 11)


def test_a_response_copies_each_output_once_into_the_message() -> None:
    array = np.arange(1 << 16, dtype="<f4")
    response = InferResponse("identity", "1", "7", {"sequence_id": parameter(2**64 - 1)},
                             [OutputTensor("OUTPUT0", "FP32", [1 << 16])], [array.view(np.uint8).data])
    data = encode_response(response)
    parsed = pb.ModelInferResponse.FromString(data)
    assert np.frombuffer(parsed.raw_output_contents[0], "<f4").tolist() == array.tolist()
    assert parsed.parameters["sequence_id"].uint64_param == 2**64 - 1 and parsed.id == "7"
    assert data.endswith(array.tobytes())  # the data is the message's last field, written as it is
    stream = pb.ModelStreamInferResponse.FromString(encode_stream_response(response))
    assert stream.infer_response == parsed and not stream.error_message


def test_parameters_take_the_field_protobuf_would_pick() -> None:
    assert parameter(True) == InferParameter("bool_param", True)
    assert parameter(-3) == InferParameter("int64_param", -3)
    assert parameter(2**63) == InferParameter("uint64_param", 2**63)
    assert parameter(0.5) == InferParameter("double_param", 0.5)
    assert parameter("a") == InferParameter("string_param", "a")


def test_headers_with_typed_contents_are_not_kept() -> None:
    """Typed contents are data, new with every request: keeping such headers would only hold memory."""
    codec_requests._headers.clear()
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="INT64", shape=[3]).contents.int64_contents.extend([1, 2, 3])
    first, second = decode_request(message.SerializeToString()), decode_request(message.SerializeToString())
    assert first.header is not second.header and not codec_requests._headers
    assert second.inputs[0].contents is not None
    assert second.inputs[0].contents.fields["int64_contents"].tolist() == [1, 2, 3]
