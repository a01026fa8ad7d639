"""ModelInfer and ModelStreamInfer on Triton's example models, through tritonclient.grpc."""

from __future__ import annotations

import asyncio
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import grpc

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def _simple_inputs(module=grpcclient, a=A, b=B):
    inputs = [module.InferInput("INPUT0", list(a.shape), "INT32"), module.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_simple_sum_and_difference(client: grpcclient.InferenceServerClient) -> None:
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", _simple_inputs(), outputs=outputs, request_id="my request id",
                          headers={"x-test": "1"}, client_timeout=10)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    response = result.get_response()
    assert response.id == "my request id"
    assert response.model_name == "simple" and response.model_version == "1"


def test_outputs_omitted_returns_all_in_order(client: grpcclient.InferenceServerClient) -> None:
    response = client.infer("simple", _simple_inputs()).get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(response.raw_output_contents) == 2


def test_one_requested_output(client: grpcclient.InferenceServerClient) -> None:
    result = client.infer("simple", _simple_inputs(), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_batch_of_eight(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(128, dtype=np.int32).reshape(8, 16)
    result = client.infer("simple", _simple_inputs(a=a, b=a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_keepalive_and_custom_channel_arguments(example_server) -> None:
    """The options of Triton's keepalive and custom-args examples: no GOAWAY, 1 MiB client limits."""
    keepalive = grpcclient.KeepAliveOptions(keepalive_time_ms=2**31 - 1, keepalive_timeout_ms=20000,
                                            keepalive_permit_without_calls=False, http2_max_pings_without_data=2)
    with grpcclient.InferenceServerClient(example_server.url, keepalive_options=keepalive) as client:
        for _ in range(3):
            np.testing.assert_array_equal(client.infer("simple", _simple_inputs()).as_numpy("OUTPUT0"), A + B)
    args = [("grpc.max_send_message_length", 1024 * 1024), ("grpc.max_receive_message_length", 1024 * 1024)]
    with grpcclient.InferenceServerClient(example_server.url, channel_args=args) as client:
        np.testing.assert_array_equal(client.infer("simple", _simple_inputs()).as_numpy("OUTPUT1"), A - B)


def test_compression_and_async_infer(client: grpcclient.InferenceServerClient) -> None:
    for algorithm in ("gzip", "deflate"):
        result = client.infer("simple", _simple_inputs(), compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    results: queue.Queue = queue.Queue()
    client.async_infer("simple", _simple_inputs(), callback=lambda result, error: results.put((result, error)))
    result, error = results.get(timeout=10)
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_aio_client(example_server) -> None:
    async def run() -> None:
        async with aioclient.InferenceServerClient(example_server.url) as client:
            assert await client.is_server_ready()
            results = await asyncio.gather(*(client.infer("simple", _simple_inputs(aioclient)) for _ in range(8)))
            for result in results:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
            stats = await client.get_inference_statistics("simple")
            assert len(stats.model_stats) == 1

    asyncio.run(run())


def test_int8(client: grpcclient.InferenceServerClient) -> None:
    """simple_string is covered by examples/grpc_string_infer.py (tests/server/test_examples.py)."""
    x = np.arange(-8, 8, dtype=np.int8).reshape(1, 16)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT8") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(x)
    result = client.infer("simple_int8", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros_like(x))


def test_bytes_with_embedded_nul(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[b"he\x00llo", b"\x00\x01\x02\x03", b"", "é".encode(), b"tail\x00"]], dtype=np.object_)
    tensor = grpcclient.InferInput("INPUT0", [1, 5], "BYTES")
    tensor.set_data_from_numpy(data)
    out = client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0")
    assert out.tolist() == data.tolist()


def test_bytes_that_are_not_utf8_are_rejected_clearly(client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"\xff\xfe"]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple_identity", [tensor])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "UTF-8" in err.value.message()


def test_stream_infer_ids_and_in_stream_error(client: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for n in range(5):
            client.async_stream_infer("simple", _simple_inputs(a=A + n), request_id=f"seq_{n}")
        bad = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 16), np.float32))
        client.async_stream_infer("simple", [bad, _simple_inputs()[1]], request_id="bad")
        client.async_stream_infer("simple", _simple_inputs(a=A + 100), request_id="after_error")
        got = [results.get(timeout=10) for _ in range(7)]
    finally:
        client.stop_stream()
    errors = [e for r, e in got if e is not None]
    assert len(errors) == 1 and "data-type is 'FP32'" in errors[0].message()
    by_id = {r.get_response().id: r for r, e in got if e is None}
    assert set(by_id) == {f"seq_{n}" for n in range(5)} | {"after_error"}
    for n in range(5):
        np.testing.assert_array_equal(by_id[f"seq_{n}"].as_numpy("OUTPUT0"), A + n + B)
    np.testing.assert_array_equal(by_id["after_error"].as_numpy("OUTPUT0"), A + 100 + B)


def test_a_stream_with_the_triton_grpc_error_header_ends_with_the_errors_status(example_server) -> None:
    """With ``triton_grpc_error: true`` (Triton's "GRPC Status Codes"), the first error ends the stream
    with its gRPC status and message, not an in-stream error; the responses before it arrive."""
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(example_server.url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)),
                            headers={"triton_grpc_error": "true"})
        try:
            client.async_stream_infer("simple", _simple_inputs(), request_id="good")
            first = results.get(timeout=10)
            bad = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
            bad.set_data_from_numpy(np.zeros((1, 16), np.float32))
            client.async_stream_infer("simple", [bad, _simple_inputs()[1]], request_id="bad")
            second = results.get(timeout=10)
        finally:
            client.stop_stream()
    assert first[1] is None and first[0].get_response().id == "good"
    error = second[1]
    assert error is not None and error.status() == "StatusCode.INVALID_ARGUMENT", error
    assert "data-type is 'FP32'" in error.message()


def test_triton_reserved_parameter_perf_analyzer_sends(example_server) -> None:
    channel, stub = _raw_stub(example_server)
    with channel:
        request = service_pb2.ModelInferRequest(model_name="simple", raw_input_contents=[A.tobytes(), B.tobytes()])
        request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
        request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        request.parameters["custom_key"].string_param = "ignored"
        response = stub.ModelInfer(request)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.int32), (A + B).reshape(-1))


def _typed_request(model: str, datatype: str, field: str, values: list) -> service_pb2.ModelInferRequest:
    """A two-input [1, 16] request with data in typed ``contents.<field>``."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name in ("INPUT0", "INPUT1"):
        getattr(request.inputs.add(name=name, datatype=datatype, shape=[1, 16]).contents, field).extend(values)
    return request


def _raw_stub(example_server):
    channel = grpc.insecure_channel(example_server.url)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_typed_int_contents_and_contents_plus_raw_error(example_server) -> None:
    channel, stub = _raw_stub(example_server)
    with channel:
        request = _typed_request("simple", "INT32", "int_contents", list(range(16)))
        response = stub.ModelInfer(request)
        out = np.frombuffer(response.raw_output_contents[0], dtype=np.int32)
        np.testing.assert_array_equal(out, np.arange(16) * 2)
        request.raw_input_contents.extend([A.tobytes(), B.tobytes()])
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert ("contents field must not be specified when using raw_input_contents for 'INPUT0' "
                "for model 'simple'") in err.value.details()


def test_typed_bytes_and_int8_contents(example_server) -> None:
    channel, stub = _raw_stub(example_server)
    with channel:
        response = stub.ModelInfer(_typed_request("simple_string", "BYTES", "bytes_contents",
                                                  [str(i).encode() for i in range(16)]))
        assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
        first = response.raw_output_contents[0]
        assert first[:4] == (1).to_bytes(4, "little") and first[4:5] == b"0"
        request = _typed_request("simple_int8", "INT8", "int_contents", list(range(16)))
        request.model_version = "wrong_specification"
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request)
        assert "failed to get model version from specified version string 'wrong_specification'" in err.value.details()
        request.model_version = ""
        response = stub.ModelInfer(request)
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.int8), np.arange(16) * 2)


def test_any_valid_encoding_of_a_request_is_read_as_protobuf_reads_it(example_server) -> None:
    """ModelInfer takes the message's bytes (the wire codec): fields in another order than protobuf
    writes them (raw data first), a singular field sent twice (the last wins), a shape unpacked and
    unknown fields are read as upb reads them, and the response parses with tritonclient's classes."""
    pieces = [service_pb2.ModelInferRequest(raw_input_contents=[A.tobytes(), B.tobytes()]),
              service_pb2.ModelInferRequest(outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(
                  name="OUTPUT1")]),
              service_pb2.ModelInferRequest(model_name="nope", id="an id")]
    data = b"".join(piece.SerializeToString() for piece in pieces)
    for name in ("INPUT0", "INPUT1"):  # shape [1, 16] unpacked (field 3, varint), then an unknown field 9
        tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype="INT32").SerializeToString()
        tensor += b"\x18\x01\x18\x10" + b"\x48\x07"
        data += b"\x2a" + bytes([len(tensor)]) + tensor
    data += b"\xf8\x01\x05" + service_pb2.ModelInferRequest(model_name="simple").SerializeToString()
    with grpc.insecure_channel(example_server.url) as channel:
        answer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(data, timeout=10)
    response = service_pb2.ModelInferResponse.FromString(answer)
    assert (response.model_name, response.id, [o.name for o in response.outputs]) == ("simple", "an id", ["OUTPUT1"])
    assert list(response.outputs[0].shape) == [1, 16]
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], "<i4").reshape(1, 16), A - B)
