"""Request validation's memo (kserve_v2.request.decode): a request signature validated once decodes
the same way again without the full checks, and anything that differs is validated in full."""

from __future__ import annotations

import numpy as np
import pytest

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.codec.generated import request_from_message, response_to_message
from kserve_v2.codec.messages import InferRequest
from kserve_v2.protocol.datatypes import BY_V2, BYTES
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.protocol.model_spec import MAX_MEMO, ModelSpec, TensorSpec
from kserve_v2.protocol.tensors import pack_bytes
from kserve_v2.request.decode import decode_request
from kserve_v2.request.encode import encode_response

INT32 = BY_V2["INT32"]


def simple_spec() -> ModelSpec:
    """`simple`'s interface: two INT32 [-1, 16] inputs and outputs, batches up to 8."""
    inputs = tuple(TensorSpec(f"INPUT{i}", INT32, (16,), None) for i in range(2))
    outputs = tuple(TensorSpec(f"OUTPUT{i}", INT32, (16,), None) for i in range(2))
    return ModelSpec("simple", 8, inputs, outputs)


def simple_request(rows: int = 1, first: bytes | None = None, outputs: tuple[str, ...] = ("OUTPUT1",)
                   ) -> InferRequest:
    request = pb.ModelInferRequest(model_name="simple", id="7")
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    for i in range(2):
        request.inputs.add(name=f"INPUT{i}", datatype="INT32", shape=[rows, 16])
        request.raw_input_contents.append(np.full((rows, 16), i + 1, "<i4").tobytes())
    if first is not None:
        request.raw_input_contents[0] = first
    for name in outputs:
        request.outputs.add(name=name)
    return request_from_message(request)


def test_a_signature_seen_before_decodes_as_the_full_checks_did() -> None:
    spec = simple_spec()
    first = decode_request(simple_request(), spec)
    assert len(spec.plans) == 1
    again = decode_request(simple_request(), spec)
    assert len(spec.plans) == 1
    assert [t.name for t in again.outputs] == [t.name for t in first.outputs] == ["OUTPUT1"]
    assert again.output_names == ("OUTPUT1",) and again.batch_size == first.batch_size == 1
    for name, array in first.feeds.items():
        assert again.feeds[name].dtype == array.dtype and again.feeds[name].tolist() == array.tolist()
    decode_request(simple_request(rows=3), spec)
    assert len(spec.plans) == 2  # another shape is another signature


def test_a_wrong_byte_size_under_a_known_signature_gets_tritons_error() -> None:
    spec = simple_spec()
    decode_request(simple_request(), spec)
    with pytest.raises(InvalidInput, match=r"input byte size mismatch for input 'INPUT0' for model 'simple'. "
                                           r"Expected 64, got 60"):
        decode_request(simple_request(first=bytes(60)), spec)


def test_failed_validation_is_not_remembered() -> None:
    spec = simple_spec()
    with pytest.raises(InvalidInput, match="unexpected inference output 'OUTPUT9'"):
        decode_request(simple_request(outputs=("OUTPUT9",)), spec)
    assert not spec.plans
    with pytest.raises(InvalidInput, match="unexpected inference output 'OUTPUT9'"):
        decode_request(simple_request(outputs=("OUTPUT9",)), spec)


def test_tensors_with_parameters_or_contents_are_checked_in_full_every_time() -> None:
    spec = simple_spec()
    message = pb.ModelInferRequest(model_name="simple")
    for i in range(2):
        message.inputs.add(name=f"INPUT{i}", datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(bytes(64))
    message.outputs.add(name="OUTPUT1").parameters["binary_data"].bool_param = True
    decode_request(request_from_message(message), spec)
    typed = pb.ModelInferRequest(model_name="simple")
    for i in range(2):
        typed.inputs.add(name=f"INPUT{i}", datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
    assert decode_request(request_from_message(typed), spec).feeds["INPUT1"].tolist() == [list(range(16))]
    assert not spec.plans


def test_bytes_inputs_are_unpacked_each_time() -> None:
    spec = ModelSpec("text", 0, (TensorSpec("TEXT", BYTES, (-1,), None),), (TensorSpec("OUT", BYTES, (-1,), None),))
    for values in ([b"a", b"bc"], [b"de", b""]):
        request = pb.ModelInferRequest(model_name="text")
        request.inputs.add(name="TEXT", datatype="BYTES", shape=[2])
        request.raw_input_contents.append(pack_bytes(np.array(values, dtype=object)))
        assert decode_request(request_from_message(request), spec).feeds["TEXT"].tolist() == values
    assert len(spec.plans) == 1
    truncated = pb.ModelInferRequest(model_name="text")
    truncated.inputs.add(name="TEXT", datatype="BYTES", shape=[2])
    truncated.raw_input_contents.append(pack_bytes(np.array([b"a"], dtype=object)))
    with pytest.raises(InvalidInput, match="expected 2 string elements for inference input 'TEXT' for model 'text', got 1"):
        decode_request(request_from_message(truncated), spec)


def test_the_memos_are_bounded() -> None:
    spec = simple_spec()
    for _ in range(3):
        for outputs in (("OUTPUT0",), ("OUTPUT1",), ("OUTPUT0", "OUTPUT1"), ()):
            decode_request(simple_request(outputs=outputs), spec)
    assert len(spec.plans) == 4
    spec.plans.update({("filler", i): spec.plans[next(iter(spec.plans))] for i in range(MAX_MEMO)})
    decode_request(simple_request(rows=2), spec)
    assert len(spec.plans) == 1  # emptied when full, then the new signature


def test_responses_carry_the_outputs_described_as_before() -> None:
    spec = simple_spec()
    for _ in range(2):  # built, then from the memo
        decoded = decode_request(simple_request(outputs=("OUTPUT1", "OUTPUT0")), spec)
        arrays = [np.full((1, 16), 5, "<i4"), np.full((1, 16), 6, "<i4")]
        response, shaped = encode_response(simple_request(), spec, 1, decoded, arrays)
        expected = pb.ModelInferResponse(model_name="simple", model_version="1", id="7")
        for name in ("OUTPUT1", "OUTPUT0"):
            expected.outputs.add(name=name, datatype="INT32", shape=[1, 16])
        expected.raw_output_contents.extend([a.tobytes() for a in arrays])
        assert response_to_message(response) == expected
        assert shaped[0] is arrays[0]
    assert len(spec.responses) == 1
    bare, _ = encode_response(pb.ModelInferRequest(), spec, 1, decoded, arrays, raw=False)
    assert not bare.id and not bare.raw_output_contents and [o.name for o in bare.outputs] == ["OUTPUT1", "OUTPUT0"]
