"""Structure-aware fuzz of ModelInferRequest (hypothesis): any request gets a status, never a crash.

Requests are built field by field (names, datatypes, shapes, parameters, typed contents, raw
entries with BYTES framing) around the example models, sent over gRPC, and must get OK or a
client-error status - never INTERNAL or UNKNOWN - while the server stays up. CI runs a short
seeded budget; ``make fuzz`` runs a long one (``KSERVE_V2_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import os
import struct

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from helpers import EXAMPLES, start_server

EXAMPLES_BUDGET = int(os.environ.get("KSERVE_V2_FUZZ_EXAMPLES", "150"))
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.RESOURCE_EXHAUSTED}
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES", "BF16", "", "int32", "FP8"]
NAMES = st.sampled_from(["INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1", "", "x" * 300]) | st.text(max_size=8)
DIMS = st.sampled_from([-1, 0, 1, 2, 16, 2**31, 2**62]) | st.integers(-3, 40)


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    server = start_server(EXAMPLES, tmp_path_factory.mktemp("logs"), "--allow-client-shm", "true")
    channel = grpc.insecure_channel(server.url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel), server
    channel.close()
    assert server.stop() == 0


def _framed(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def _parameter(draw: st.DrawFn, target: pb.InferParameter) -> None:
    kind = draw(st.sampled_from(["bool", "int64", "uint64", "string", "double"]))
    if kind == "bool":
        target.bool_param = draw(st.booleans())
    elif kind == "int64":
        target.int64_param = draw(st.integers(-(2**63), 2**63 - 1))
    elif kind == "uint64":
        target.uint64_param = draw(st.integers(0, 2**64 - 1))
    elif kind == "string":
        target.string_param = draw(st.text(max_size=10))
    else:
        target.double_param = draw(st.floats(allow_nan=True))


PARAMETER_KEYS = st.sampled_from(["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset",
                                  "binary_data_size", "classification", "triton_x", "priority", "timeout"])


@st.composite
def requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(["simple", "simple_string", "simple_int8", "simple_identity", "nope", ""])),
        model_version=draw(st.sampled_from(["", "1", "0", "-1", "x", "99999999999999999999"])),
        id=draw(st.text(max_size=5)))
    for key in draw(st.lists(PARAMETER_KEYS, max_size=2)):
        _parameter(draw, request.parameters[key])
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(name=draw(NAMES), datatype=draw(st.sampled_from(DATATYPES)),
                                    shape=draw(st.lists(DIMS, max_size=4)))
        for key in draw(st.lists(PARAMETER_KEYS, max_size=2)):
            _parameter(draw, tensor.parameters[key])
        contents = draw(st.sampled_from(["none", "int", "uint", "int64", "fp32", "bytes", "bool"]))
        values = draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40))
        if contents == "int":
            tensor.contents.int_contents.extend(values)
        elif contents == "uint":
            tensor.contents.uint_contents.extend(abs(v) for v in values)
        elif contents == "int64":
            tensor.contents.int64_contents.extend(values)
        elif contents == "fp32":
            tensor.contents.fp32_contents.extend(float(v) for v in values)
        elif contents == "bytes":
            tensor.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=8), max_size=20)))
        elif contents == "bool":
            tensor.contents.bool_contents.extend(v > 0 for v in values)
    for _ in range(draw(st.integers(0, 3))):
        raw = draw(st.one_of(st.binary(max_size=80), st.lists(st.binary(max_size=6), max_size=20).map(_framed),
                             st.just(bytes(64)), st.just(struct.pack("<I", 2**32 - 1))))
        request.raw_input_contents.append(raw)
    for _ in range(draw(st.integers(0, 2))):
        output = request.outputs.add(name=draw(NAMES))
        for key in draw(st.lists(PARAMETER_KEYS, max_size=2)):
            _parameter(draw, output.parameters[key])
    return request


@settings(max_examples=EXAMPLES_BUDGET, deadline=None, derandomize=EXAMPLES_BUDGET <= 1000,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(request=requests())
def test_any_infer_request_gets_a_client_status(stub, request: pb.ModelInferRequest) -> None:
    client, server = stub
    try:
        client.ModelInfer(request, timeout=30)
        code = grpc.StatusCode.OK
    except grpc.RpcError as err:
        code = err.code()
        assert "Traceback" not in (err.details() or "")
    assert code in ALLOWED, (code, request)
    assert server.proc.poll() is None
