"""Hostile and malformed gRPC requests (overflowing shapes, compromised byte sizes, bad BYTES framing,
traversal names, ...; Triton's ``qa/L0_input_validation`` cases and more) each get their status, and
the next good request works.

Requests are built with tritonclient's own protobuf stubs so that malformed ones can be sent.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest
from onnx import TensorProto
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from helpers import EXAMPLES, add_model, identity_model, start_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT
SIMPLE_RAW = np.arange(16, dtype=np.int32).tobytes()


def _simple(**overrides) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple", raw_input_contents=[SIMPLE_RAW, SIMPLE_RAW])
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    for key, value in overrides.items():
        setattr(request, key, value)
    return request


def _raw(model: str, datatype: str, shape: list[int], raw: bytes) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, raw_input_contents=[raw])
    request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    return request


def _bytes_elements(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def _with(build: Callable[[pb.ModelInferRequest], None], base: Callable[[], pb.ModelInferRequest] = _simple):
    def make() -> pb.ModelInferRequest:
        request = base()
        build(request)
        return request
    return make


def _drop_input1(r: pb.ModelInferRequest) -> None:
    del r.inputs[1]
    del r.raw_input_contents[1]


def _rename(r: pb.ModelInferRequest, index: int, name: str) -> None:
    r.inputs[index].name = name


def _batch_nine(r: pb.ModelInferRequest) -> None:
    r.inputs[0].shape[0] = r.inputs[1].shape[0] = 9


def _reserved_parameter(r: pb.ModelInferRequest) -> None:
    r.parameters["triton_secret"].bool_param = True


def _shared_memory_input(r: pb.ModelInferRequest) -> None:
    r.inputs[0].parameters["shared_memory_region"].string_param = "region"


CASES: dict[str, tuple[Callable[[], pb.ModelInferRequest], grpc.StatusCode, str]] = {
    "element count overflows int64": (
        lambda: _raw("flat_fp32", "FP32", [16, 2**60 + 2], b""), INVALID, "unexpected integer overflow"),
    "byte size overflows int64": (
        lambda: _raw("flat_fp32", "FP32", [4, 2**60 + 2], b""), INVALID, "byte size overflow"),
    "negative dim": (lambda: _raw("flat_fp32", "FP32", [1, -2], b""), INVALID, "invalid dim"),
    "wildcard dim in a request": (lambda: _raw("flat_fp32", "FP32", [-1, 4], b""), INVALID, "invalid dim"),
    "more dims than the model has": (
        lambda: _raw("flat_fp32", "FP32", [1, 1, 4], b"\0" * 16), INVALID, "unexpected shape"),
    "compromised shape (byte size)": (
        lambda: _raw("flat_fp32", "FP32", [1, 8], b"\0" * 40), INVALID, "Expected 32, got 40"),
    "BYTES fewer elements than the shape": (
        lambda: _raw("simple_identity", "BYTES", [1, 3], _bytes_elements(b"a", b"b")), INVALID, "expected 3 string elements"),
    "BYTES more elements than the shape": (
        lambda: _raw("simple_identity", "BYTES", [1, 1], _bytes_elements(b"a", b"b")), INVALID, "unexpected number of string elements"),
    "BYTES truncated length prefix": (
        lambda: _raw("simple_identity", "BYTES", [1, 2], _bytes_elements(b"abcd") + b"\x01\x00"), INVALID, "truncated length prefix"),
    "BYTES length past the buffer": (
        lambda: _raw("simple_identity", "BYTES", [1, 1], struct.pack("<I", 1000) + b"abc"), INVALID, "past the end"),
    "BYTES zero-length prefix flood": (
        lambda: _raw("simple_identity", "BYTES", [1, 2**40], b"\0" * 64), INVALID,
        "expected 1099511627776 string elements for inference input 'INPUT0' for model 'simple_identity', got 16"),
    # a shape that disagrees with data over 64 KiB: its decoding's error, not the budget's (RESOURCE_EXHAUSTED before)
    "BYTES shape far beyond its two elements": (
        lambda: _raw("simple_identity", "BYTES", [1, 2**40], _bytes_elements(b"x" * 40_000, b"y" * 40_000)), INVALID,
        "expected 1099511627776 string elements for inference input 'INPUT0' for model 'simple_identity', got 2"),
    "element count overflows int64, with typed contents": (
        _with(lambda r: r.inputs.add(name="INPUT0", datatype="FP32", shape=[16, 2**60 + 2]).contents.fp32_contents
              .extend([0.5] * 20_000), lambda: pb.ModelInferRequest(model_name="flat_fp32")),
        INVALID, "unexpected integer overflow"),
    "missing input": (_with(_drop_input1), INVALID, "missing required input(s) ['INPUT1']"),
    "unknown input": (_with(lambda r: _rename(r, 1, "INPUT9")), INVALID, "unexpected inference input 'INPUT9'"),
    "duplicate input": (_with(lambda r: _rename(r, 1, "INPUT0")), INVALID, "more than once"),
    "duplicate output names": (
        _with(lambda r: r.outputs.extend([pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT0")] * 2)),
        INVALID, "requested more than once"),
    "huge number of requested outputs": (
        _with(lambda r: r.outputs.extend(pb.ModelInferRequest.InferRequestedOutputTensor(name=f"O{i}") for i in range(100_000))),
        INVALID, "unexpected inference output"),
    "datatype differs from the model": (
        _with(lambda r: setattr(r.inputs[0], "datatype", "FP32")), INVALID, "data-type is 'FP32', but model 'simple' expects 'INT32'"),
    "unknown datatype": (_with(lambda r: setattr(r.inputs[0], "datatype", "FP8")), INVALID, "data-type is 'FP8'"),
    "batch above max_batch_size": (
        _with(_batch_nine), INVALID, "batch-size must be <= 8"),
    "contents and raw together": (
        _with(lambda r: r.inputs[0].contents.int_contents.extend(range(16))), INVALID, "contents field must not be specified"),
    "raw count differs from the inputs": (
        _with(lambda r: r.raw_input_contents.append(SIMPLE_RAW)), INVALID, "entries in raw_input_contents"),
    "no data at all": (_with(lambda r: r.ClearField("raw_input_contents")), INVALID, "has no data"),
    "reserved parameter": (_with(_reserved_parameter), INVALID, "reserved"),
    "shared memory input while disabled": (_with(_shared_memory_input), INVALID, "shared memory"),
    "unknown model": (lambda: _simple(model_name="no_such_model"), grpc.StatusCode.NOT_FOUND, "is not found"),
    "unknown version": (lambda: _simple(model_version="7"), grpc.StatusCode.NOT_FOUND, "version 7 is not found"),
    "malformed version": (lambda: _simple(model_version="-1"), INVALID, "version string '-1'"),
    "version of a failed model": (
        lambda: pb.ModelInferRequest(model_name="corrupt", model_version="1"), grpc.StatusCode.UNAVAILABLE,
        "is not at ready state"),
}


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    repository = tmp_path_factory.mktemp("repo")
    for name in ("simple", "simple_identity"):
        source = EXAMPLES / name
        target = repository / name
        (target / "1").mkdir(parents=True)
        (target / "config.pbtxt").write_bytes((source / "config.pbtxt").read_bytes())
        (target / "1" / "model.onnx").write_bytes((source / "1" / "model.onnx").read_bytes())
    add_model(repository, "flat_fp32", identity_model(TensorProto.FLOAT),
              'max_batch_size: 0\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1, -1] }]')
    add_model(repository, "corrupt", b"not onnx")
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--strict-readiness", "false",
                          "--exit-on-error=false")  # corrupt fails to load
    with grpc.insecure_channel(server.url, options=[("grpc.max_send_message_length", 2**31 - 1)]) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    assert server.proc.poll() is None, "the server died"
    assert server.stop() == 0


@pytest.mark.parametrize("case", list(CASES))
def test_attack_gets_its_status_and_the_server_keeps_serving(stub, case: str) -> None:
    build, code, text = CASES[case]
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(build(), timeout=30)
    assert err.value.code() == code, err.value.details()
    assert text in err.value.details()
    good = stub.ModelInfer(_simple(), timeout=10)
    np.testing.assert_array_equal(np.frombuffer(good.raw_output_contents[0], np.int32), np.arange(16) * 2)
    assert stub.ServerLive(pb.ServerLiveRequest()).live
