"""Every V2 datatype round-trips through identity models built here (no config.pbtxt: auto-complete)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from helpers import ONNX_TYPES, Server, add_model, identity_model, sample, start_server

# datatype -> InferTensorContents field for the typed form (FP16 and BF16 travel only raw).
CONTENTS = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


@pytest.fixture(scope="module")
def identity_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("repo")
    for datatype, onnx_type in ONNX_TYPES.items():
        add_model(repository, f"identity_{datatype.lower()}", identity_model(onnx_type))
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("datatype", list(ONNX_TYPES))
def test_raw_round_trip(identity_server: Server, datatype: str) -> None:
    data = sample(datatype)
    with grpcclient.InferenceServerClient(identity_server.url) as client:
        metadata = client.get_model_metadata(f"identity_{datatype.lower()}")
        assert metadata.inputs[0].datatype == datatype
        assert list(metadata.inputs[0].shape) == [-1, -1]  # auto-complete: max_batch_size 4, dims [-1]
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        result = client.infer(f"identity_{datatype.lower()}", [tensor])
        output = result.get_response().outputs[0]
        assert output.datatype == datatype and list(output.shape) == [2, 3]
        got = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        assert got.tolist() == data.tolist()
    else:
        np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_types_are_raw_two_bytes_each(identity_server: Server, datatype: str) -> None:
    data = sample(datatype)
    # BF16 is bfloat16 (tritonclient sends ml_dtypes.bfloat16): the upper half of the little-endian float32.
    raw = data.tobytes() if datatype == "FP16" else b"".join(
        v.tobytes()[2:4] for v in data.astype("<f4").reshape(-1))
    assert datatype == "FP16" or raw == data.tobytes()
    with grpc.insecure_channel(identity_server.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name=f"identity_{datatype.lower()}", raw_input_contents=[raw])
        request.inputs.add(name="INPUT0", datatype=datatype, shape=[2, 3])
        response = stub.ModelInfer(request)
    assert response.raw_output_contents[0] == raw and len(raw) == 12


@pytest.mark.parametrize("datatype", list(CONTENTS))
def test_typed_contents_round_trip(identity_server: Server, datatype: str) -> None:
    data = sample(datatype)
    with grpc.insecure_channel(identity_server.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name=f"identity_{datatype.lower()}")
        tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=[2, 3])
        getattr(tensor.contents, CONTENTS[datatype]).extend(data.reshape(-1).tolist())
        response = stub.ModelInfer(request)
    assert not response.outputs[0].HasField("contents")
    raw = response.raw_output_contents[0]
    if datatype == "BYTES":
        assert raw == b"".join(len(x).to_bytes(4, "little") + x for x in data.reshape(-1))
    else:
        np.testing.assert_array_equal(np.frombuffer(raw, dtype=data.dtype).reshape(2, 3), data)


def test_contents_in_the_wrong_field_and_half_types_in_contents(identity_server: Server) -> None:
    with grpc.insecure_channel(identity_server.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="identity_int32")
        request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "int_contents" in err.value.details()
        request = service_pb2.ModelInferRequest(model_name="identity_fp16")
        request.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request)
        assert "raw_input_contents" in err.value.details()
        request = service_pb2.ModelInferRequest(model_name="identity_int8")
        request.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 1]).contents.int_contents.append(300)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "INT8" in err.value.details()
