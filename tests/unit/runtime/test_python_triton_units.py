"""Pure logic behind python models' Triton behaviours: each ``TritonError`` code's server error (and
back), BLS request names given as bytes, and a response describing an output with the datatype its
array has when it differs from the declared one (Triton answers with what a python model made)."""

from __future__ import annotations

import numpy as np
import pytest

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.codec.generated import request_from_message, response_to_message
from kserve_v2.protocol import errors
from kserve_v2.protocol.datatypes import BY_V2, BYTES
from kserve_v2.protocol.errors import ErrorCode
from kserve_v2.protocol.model_spec import ModelSpec, TensorSpec
from kserve_v2.request.decode import decode_request
from kserve_v2.request.encode import encode_response
from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.in_process import as_message
from kserve_v2.runtime.python.tensors import TritonError

# TritonError code -> the server's error code (gRPC UNKNOWN, INTERNAL, ... as Triton's grpc_utils.cc maps them)
CODES = [(TritonError.UNKNOWN, ErrorCode.UNKNOWN), (TritonError.INTERNAL, ErrorCode.INTERNAL),
         (TritonError.NOT_FOUND, ErrorCode.NOT_FOUND), (TritonError.INVALID_ARG, ErrorCode.INVALID_ARGUMENT),
         (TritonError.UNAVAILABLE, ErrorCode.UNAVAILABLE), (TritonError.UNSUPPORTED, ErrorCode.UNIMPLEMENTED),
         (TritonError.ALREADY_EXISTS, ErrorCode.ALREADY_EXISTS), (TritonError.CANCELLED, ErrorCode.CANCELLED)]


@pytest.mark.parametrize(("triton_code", "code"), CODES)
def test_each_triton_error_code_is_its_server_error_and_back(triton_code: int, code: ErrorCode) -> None:
    error = TritonError("bad", triton_code).as_server_error()
    assert (error.code, str(error)) == (code, "bad")
    assert TritonError.of(error).code() == triton_code


def test_an_unknown_code_is_unknown_and_a_foreign_exception_internal() -> None:
    assert TritonError("x", 42).as_server_error().code is ErrorCode.UNKNOWN
    assert isinstance(TritonError("x", TritonError.UNKNOWN).as_server_error(), errors.Unknown)
    assert TritonError.of(KeyError("k")).code() == TritonError.INTERNAL


def test_a_bls_request_takes_its_names_as_bytes() -> None:
    request = pb_utils.InferenceRequest(request_id=b"r1", model_name=b"add_sub", requested_output_names=[b"OUTPUT0"],
                                        inputs=[pb_utils.Tensor("INPUT0", np.ones(2, np.float32))])
    message = as_message(request)
    assert (message.model_name, message.id, [o.name for o in message.outputs]) == ("add_sub", "r1", ["OUTPUT0"])
    assert request.request_id() == "r1" and request.requested_output_names() == ["OUTPUT0"]


def _spec() -> ModelSpec:
    outputs = (TensorSpec("I", BY_V2["INT32"], (-1,), None), TensorSpec("F", BY_V2["FP32"], (-1,), None),
               TensorSpec("S", BYTES, (-1,), None))
    return ModelSpec("typed", 0, (), outputs)


def _decoded(spec: ModelSpec):
    message = pb.ModelInferRequest(model_name="typed")
    for name in ("I", "F", "S"):
        message.outputs.add(name=name)
    return decode_request(request_from_message(message), spec)


def test_an_output_of_another_numpy_type_is_described_with_its_own_datatype() -> None:
    spec = _spec()
    decoded = _decoded(spec)
    declared = [np.array([1], np.int32), np.array([0.5], np.float32), np.array([b"a"], np.object_)]
    other = [np.array([1, 2], ">i8"), np.array([0.5], np.float16), np.array([], np.object_)]
    for _ in range(2):  # built, then from the memo: the datatypes are part of its key
        for arrays, datatypes in ((declared, ["INT32", "FP32", "BYTES"]), (other, ["INT64", "FP16", "BYTES"])):
            response, _ = encode_response(request_from_message(pb.ModelInferRequest()), spec, 1, decoded, arrays)
            message = response_to_message(response)
            assert [o.datatype for o in message.outputs] == datatypes
    assert np.frombuffer(message.raw_output_contents[0], "<i8").tolist() == [1, 2]
    assert np.frombuffer(message.raw_output_contents[1], "<f2").tolist() == [0.5]
    assert message.raw_output_contents[2] == b"" and list(message.outputs[2].shape) == [0]
    bytes_kinds = [np.array([1], np.int32), np.array([1.0], np.float32), np.array(["a"], np.str_)]
    response, _ = encode_response(request_from_message(pb.ModelInferRequest()), spec, 1, decoded, bytes_kinds)
    assert [o.datatype for o in response_to_message(response).outputs] == ["INT32", "FP32", "BYTES"]
