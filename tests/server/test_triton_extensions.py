"""Triton's trace, logging and CUDA shared memory extensions, batch statistics and Triton's texts,
through a real server and unmodified tritonclient (gRPC and HTTP)."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from helpers import EXAMPLES, Server, add_model, identity_model, start_server, wait_until

GPUS_NOT_SUPPORTED = "failed to register CUDA shared memory region: '{}', GPUs not supported"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The example repository with client shared memory on, as Triton's shm examples run it."""
    server = start_server(EXAMPLES, tmp_path_factory.mktemp("logs"), "--allow-client-shm", "true")
    yield server
    assert server.stop() == 0


def test_server_metadata_lists_every_extension(server) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        extensions = set(client.get_server_metadata()["extensions"])
    assert {"binary_tensor_data", "model_repository", "model_configuration", "statistics", "trace", "logging",
            "cuda_shared_memory", "system_shared_memory", "parameters"} <= extensions


def test_cuda_shared_memory_on_a_cpu_only_server(server) -> None:
    handle = b"\x01" * 64  # a cudaIpcMemHandle_t is 64 bytes
    with grpcclient.InferenceServerClient(server.url) as client:
        client.unregister_cuda_shared_memory()
        client.unregister_cuda_shared_memory("never_registered")
        assert not client.get_cuda_shared_memory_status().regions
        with pytest.raises(InferenceServerException) as err:
            client.register_cuda_shared_memory("gpu_region", handle, 0, 64)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert err.value.message() == GPUS_NOT_SUPPORTED.format("gpu_region")
        with pytest.raises(InferenceServerException) as err:
            client.get_cuda_shared_memory_status("gpu_region")
        assert err.value.status() == "StatusCode.NOT_FOUND"
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.unregister_cuda_shared_memory()
        client.unregister_cuda_shared_memory("never_registered")
        assert client.get_cuda_shared_memory_status() == []
        with pytest.raises(InferenceServerException) as err:
            client.register_cuda_shared_memory("gpu_region", base64.b64encode(handle), 0, 64)
        assert err.value.status() == "400"
        assert err.value.message() == GPUS_NOT_SUPPORTED.format("gpu_region")
        region = shm.create_shared_memory_region("sys_region", "/kserve_v2_cuda_test", 64)
        try:
            client.register_system_shared_memory("sys_region", "/kserve_v2_cuda_test", 64)
            with pytest.raises(InferenceServerException) as err:
                client.get_cuda_shared_memory_status("sys_region")
            assert "is registered as system shared memory, not CUDA shared memory" in err.value.message()
            client.unregister_cuda_shared_memory("sys_region")  # another kind's region: left alone
            assert [r["name"] for r in client.get_system_shared_memory_status()] == ["sys_region"]
        finally:
            client.unregister_system_shared_memory()
            shm.destroy_shared_memory_region(region)


def test_trace_settings_over_http_and_grpc(server) -> None:
    with httpclient.InferenceServerClient(server.http_url) as http, \
            grpcclient.InferenceServerClient(server.url) as rpc:
        start = http.get_trace_settings()
        assert start["trace_level"] == ["OFF"] and start["trace_rate"] == "1000" and start["trace_count"] == "-1"
        updated = http.update_trace_settings(settings={"trace_rate": "5", "trace_level": ["TIMESTAMPS"]})
        assert updated["trace_rate"] == "5" and updated["trace_level"] == ["TIMESTAMPS"]
        seen = rpc.get_trace_settings(as_json=True)["settings"]
        assert seen["trace_rate"]["value"] == ["5"] and seen["trace_level"]["value"] == ["TIMESTAMPS"]
        model = rpc.update_trace_settings(model_name="simple", settings={"trace_count": "3"}, as_json=True)
        assert model["settings"]["trace_count"]["value"] == ["3"]
        assert http.get_trace_settings(model_name="simple")["trace_count"] == "3"
        assert http.get_trace_settings()["trace_count"] == "-1"  # the global settings are untouched
        assert http.update_trace_settings(model_name="simple", settings={"trace_count": None})["trace_count"] == "-1"
        http.update_trace_settings(settings={"trace_rate": None, "trace_level": None})  # back to the startup values
        assert http.get_trace_settings()["trace_rate"] == "1000"
        for settings, status, text in (({"trace_rate": "x"}, "400", "Unable to parse 'trace_rate', got: x"),
                                       ({"trace_level": ["OFF", "TENSORS"]}, "400", "Expect only one trace level 'OFF'"),
                                       ({"trace_count": "-2"}, "400", "Expecting value >= -1"),
                                       ({"trace_file": "/tmp/t.json"}, "501", "can not be updated through network")):
            with pytest.raises(InferenceServerException) as err:
                http.update_trace_settings(settings=settings)
            assert err.value.status() == status and text in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            http.get_trace_settings(model_name="no_such_model")
        assert err.value.message() == "Request for unknown model : no_such_model"
        with pytest.raises(InferenceServerException) as err:
            rpc.update_trace_settings(settings={"trace_file": "/tmp/t.json"})
        assert err.value.status() == "StatusCode.UNIMPLEMENTED"


def test_log_settings_over_http_and_grpc(server) -> None:
    with httpclient.InferenceServerClient(server.http_url) as http, \
            grpcclient.InferenceServerClient(server.url) as rpc:
        assert http.get_log_settings() == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                                           "log_verbose_level": 0, "log_format": "default"}
        updated = http.update_log_settings({"log_verbose_level": 2, "log_format": "ISO8601"})
        assert updated["log_verbose_level"] == 2 and updated["log_format"] == "ISO8601"
        seen = rpc.get_log_settings(as_json=True)["settings"]
        assert seen["log_verbose_level"]["uint32_param"] == 2 and seen["log_format"]["string_param"] == "ISO8601"
        assert rpc.update_log_settings({"log_info": False}, as_json=True)["settings"]["log_info"]["bool_param"] is False
        restored = http.update_log_settings({"log_info": True, "log_verbose_level": 0, "log_format": "default"})
        assert restored["log_info"] is True and restored["log_verbose_level"] == 0
        for settings, status, text in (({"log_format": "xml"}, "503", "invalid argument for --log_format, got: xml"),
                                       ({"log_file": "/tmp/x.log"}, "501", "can not be updated through network"),
                                       ({"log_info": 3}, "400", "'log_info' must be a boolean")):
            with pytest.raises(InferenceServerException) as err:
                http.update_log_settings(settings)
            assert err.value.status() == status and text in err.value.message()


def test_log_info_off_silences_info_messages(tmp_path) -> None:
    server = start_server(EXAMPLES, tmp_path, "--model-control-mode", "explicit")
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.update_log_settings({"log_info": False})
            client.load_model("simple")
            client.update_log_settings({"log_info": True})
            client.unload_model("simple")
    finally:
        assert server.stop() == 0
    log = server.log()
    assert "manager: loaded model 'simple'" not in log
    assert "manager: unloaded model 'simple'" in log


@pytest.fixture(scope="module")
def own_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server (no flags) on ``batched`` and ``half``, each the model of one test below."""
    repository = tmp_path_factory.mktemp("repo")
    add_model(repository, "batched", identity_model(TensorProto.FLOAT, [None, 4]),
              "max_batch_size: 8\ninstance_group [{ kind: KIND_CPU count: 1 }]\n"
              "dynamic_batching { preferred_batch_size: [4] max_queue_delay_microseconds: 10000000 }")
    add_model(repository, "half", identity_model(TensorProto.FLOAT16, [None, 4]), "max_batch_size: 8")
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


def test_batch_statistics_count_executions_by_their_real_size(own_models: Server) -> None:
    async def send() -> None:
        async with aioclient.InferenceServerClient(own_models.url) as client:
            calls = []
            for i in range(8):
                tensor = aioclient.InferInput("INPUT0", [1, 4], "FP32")
                tensor.set_data_from_numpy(np.full((1, 4), i, np.float32))
                calls.append(client.infer("batched", [tensor]))
            await asyncio.gather(*calls)

    asyncio.run(send())
    with grpcclient.InferenceServerClient(own_models.url) as client:
        stats = client.get_inference_statistics("batched").model_stats[0]
    assert stats.inference_count == 8 and stats.execution_count == 2
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(4, 2)]


def test_contents_with_raw_text_is_tritons_even_when_the_raw_count_differs(server) -> None:
    """grpc_explicit_int_content_client.py: one raw entry for two inputs, and contents on INPUT0."""
    with grpc.insecure_channel(server.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="simple")
        for name in ("INPUT0", "INPUT1"):
            tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            tensor.contents.int_contents.extend(range(16))
        request.raw_input_contents.extend([np.arange(8, dtype=np.int32).tobytes()])
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == ("contents field must not be specified when using raw_input_contents "
                                   "for 'INPUT0' for model 'simple'")


def test_contents_with_shared_memory_text_is_tritons(server) -> None:
    region = shm.create_shared_memory_region("contents_region", "/kserve_v2_contents_test", 64)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            client.register_system_shared_memory("contents_region", "/kserve_v2_contents_test", 64)
        with grpc.insecure_channel(server.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="simple")
            for name in ("INPUT0", "INPUT1"):
                tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
                tensor.parameters["shared_memory_region"].string_param = "contents_region"
                tensor.parameters["shared_memory_byte_size"].int64_param = 64
            request.inputs[0].contents.int_contents.extend(range(16))
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelInfer(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == ("unexpected 'content' provided when using shared memory for input tensor "
                                       "'INPUT0' for model 'simple'")
    finally:
        with grpcclient.InferenceServerClient(server.url) as client:
            client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(region)


def test_fp16_json_texts_are_tritons(own_models: Server) -> None:
    with httpclient.InferenceServerClient(own_models.http_url) as client:
        sent = httpclient.InferInput("INPUT0", [1, 4], "FP16")
        sent.set_data_from_numpy(np.ones((1, 4), np.float16), binary_data=False)
        with pytest.raises(InferenceServerException) as err:
            client.infer("half", [sent])
        assert err.value.message() == ("receiving FP16 data via JSON is not supported. Please use the binary "
                                       "data format for input INPUT0")
        sent.set_data_from_numpy(np.ones((1, 4), np.float16), binary_data=True)
        with pytest.raises(InferenceServerException) as err:
            client.infer("half", [sent], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
        assert err.value.message().startswith("sending FP16 data via JSON is not supported. Please use the "
                                              "binary data format for output")


def test_bytes_that_onnx_runtime_cannot_take_name_the_input_and_element(server) -> None:
    """ONNX Runtime's Python API passes only UTF-8 text into string tensors (bytes are decoded or
    cut at a NUL), so an element that is not UTF-8 is refused, by index, not mangled."""
    data = np.array([[b"ok", b"\xff\xfe", b"fine"]], dtype=np.object_)
    with httpclient.InferenceServerClient(server.http_url) as client:
        sent = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
        sent.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple_identity", [sent])
    assert err.value.status() == "400"
    assert "element 1 of BYTES input 'INPUT0' is not valid UTF-8" in err.value.message()


def test_verbose_level_adds_a_debug_line_per_request_and_iso8601_changes_the_timestamps(tmp_path) -> None:
    server = start_server(EXAMPLES, tmp_path)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    debug = "DEBUG kserve_v2.service.inference_service: infer request for model 'simple' version 1: batch size 1"
    try:
        with httpclient.InferenceServerClient(server.http_url) as http, \
                grpcclient.InferenceServerClient(server.url) as rpc:
            rpc.infer("simple", inputs)  # level 0: no line
            http.update_log_settings({"log_verbose_level": 1})
            rpc.infer("simple", inputs)
            wait_until(lambda: debug in server.log(), "the request's debug line")
            http.update_log_settings({"log_verbose_level": 0, "log_format": "ISO8601"})
            rpc.infer("simple", inputs)  # level 0 again: no line
            with pytest.raises(InferenceServerException):
                rpc.get_model_metadata("no_such_model")  # logged at INFO
            wait_until(lambda: "request failed" in server.log(), "the failed request's line")
    finally:
        assert server.stop() == 0
    lines = server.log().splitlines()
    assert sum(debug in line for line in lines) == 1
    ready = next(line for line in lines if "server is ready" in line)
    failed = next(line for line in lines if "request failed" in line)
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO ", ready), ready  # Python's default asctime
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d INFO ", failed), failed  # ISO 8601
