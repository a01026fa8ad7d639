"""The order Triton checks a request's inputs in (kserve_v2.request.input_order.triton_input_order): that of
its core's ``std::unordered_map`` of them under GCC's libstdc++, so that when several inputs fail, the
one reported is Triton's (L0_input_validation ``test_input_string_shape_validation``)."""

from __future__ import annotations

import numpy as np
import pytest

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.codec.generated import request_from_message
from kserve_v2.protocol.datatypes import BY_V2
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.protocol.model_spec import ModelSpec, TensorSpec
from kserve_v2.protocol.tensors import pack_bytes
from kserve_v2.request.decode import decode_request
from kserve_v2.request.input_order import triton_input_order

# iteration orders printed by a C++ program built with g++ 12 (libstdc++) that emplaces the names, in
# order, into a std::unordered_map<std::string, int> and walks it
LIBSTDCXX_ORDERS = [
    (["INPUT0", "INPUT1"], ["INPUT1", "INPUT0"]),
    (["INPUT0", "INPUT1", "INPUT2"], ["INPUT2", "INPUT1", "INPUT0"]),
    ([f"INPUT{i}" for i in range(8)], ["INPUT6", "INPUT4", "INPUT3", "INPUT5", "INPUT2", "INPUT7", "INPUT1", "INPUT0"]),
    ([f"INPUT{i}" for i in range(16)],  # past 13 names: the map rehashes to 29 buckets
     ["INPUT15", "INPUT14", "INPUT13", "INPUT0", "INPUT1", "INPUT7", "INPUT2", "INPUT5", "INPUT9", "INPUT3", "INPUT4",
      "INPUT6", "INPUT10", "INPUT11", "INPUT8", "INPUT12"]),
    (["input_ids", "attention_mask", "token_type_ids"], ["token_type_ids", "attention_mask", "input_ids"]),
    (["START", "END", "READY", "CORRID", "INPUT"], ["INPUT", "READY", "CORRID", "END", "START"]),
]


@pytest.mark.parametrize(("names", "expected"), LIBSTDCXX_ORDERS)
def test_the_order_is_libstdcxx_unordered_map_iteration(names: list[str], expected: list[str]) -> None:
    assert [names[i] for i in triton_input_order(names)] == expected


def _spec(datatype: str, count: int) -> ModelSpec:
    inputs = tuple(TensorSpec(f"INPUT{i}", BY_V2[datatype], (16,), None) for i in range(count))
    return ModelSpec("m", 8, inputs, (TensorSpec("OUTPUT0", BY_V2[datatype], (16,), None),))


def _request(datatype: str, payloads: list[bytes]) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    for i, payload in enumerate(payloads):
        message.inputs.add(name=f"INPUT{i}", datatype=datatype, shape=[1, 16])
        message.raw_input_contents.append(payload)
    return message


def test_two_bytes_inputs_with_too_few_or_too_many_elements_name_the_second() -> None:
    """L0_input_validation test_input_string_shape_validation: both inputs hold 14 (then 18) elements for
    a [1, 16] shape; Triton names INPUT1, the first its core checks."""
    spec = _spec("BYTES", 2)
    for count, text in ((14, "expected 16 string elements for inference input 'INPUT1' for model 'm', got 14"),
                        (18, "unexpected number of string elements 17 for inference input 'INPUT1' for model 'm', "
                             "expecting 16")):
        payload = pack_bytes(np.array([str(i).encode() for i in range(count)], dtype=object))
        with pytest.raises(InvalidInput) as failure:
            decode_request(request_from_message(_request("BYTES", [payload, payload])), spec)
        assert str(failure.value) == text


def test_a_known_signature_names_the_same_input() -> None:
    """A request whose signature decoded before takes the memo's path; a BYTES count failure there is
    reported as the full checks report it."""
    spec = _spec("BYTES", 2)
    good = pack_bytes(np.array([b"x"] * 16, dtype=object))
    decode_request(request_from_message(_request("BYTES", [good, good])), spec)
    assert spec.plans
    short = pack_bytes(np.array([b"x"] * 14, dtype=object))
    with pytest.raises(InvalidInput, match="inference input 'INPUT1' for model 'm', got 14"):
        decode_request(request_from_message(_request("BYTES", [short, short])), spec)


def test_only_failing_inputs_count_and_the_first_in_tritons_order_is_named() -> None:
    spec = _spec("INT32", 3)
    good, bad = bytes(64), bytes(60)
    for payloads, named in (([bad, good, bad], "INPUT2"), ([bad, bad, good], "INPUT1"), ([bad, good, good], "INPUT0")):
        with pytest.raises(InvalidInput, match=f"input byte size mismatch for input '{named}' for model 'm'"):
            decode_request(request_from_message(_request("INT32", payloads)), spec)


def test_an_unknown_input_after_a_failing_one_is_reported_first() -> None:
    """Triton looks every input up before its per-input checks."""
    message = _request("INT32", [bytes(60), bytes(64)])
    message.inputs[1].name = "NOPE"
    with pytest.raises(InvalidInput, match="unexpected inference input 'NOPE' for model 'm'"):
        decode_request(request_from_message(message), _spec("INT32", 2))
