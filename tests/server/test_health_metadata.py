"""Health, metadata, configuration, statistics and the grpc.health.v1 service."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from helpers import EXAMPLES, host_gpus, start_server


def test_live_ready_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live(headers={"x-test": "1"})
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata.name == "kserve_v2"
    assert metadata.version
    assert "model_repository" in metadata.extensions and "statistics" in metadata.extensions


def test_server_name_flag_makes_triton_examples_happy(tmp_path) -> None:
    server = start_server(EXAMPLES, tmp_path, "--server-name", "triton")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.get_server_metadata().name == "triton"
    finally:
        assert server.stop() == 0


def test_model_ready_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "2")
    assert not client.is_model_ready("no_such_model")
    metadata = client.get_model_metadata("simple")
    assert metadata.name == "simple"
    assert list(metadata.versions) == ["1"]
    assert metadata.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    assert [t.name for t in metadata.outputs] == ["OUTPUT0", "OUTPUT1"]


def test_unknown_model_texts(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("no_such_model")
    assert "Request for unknown model" in err.value.message()
    assert err.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("simple", "99")
    assert "'simple' version 99 is not found" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.get_model_config("simple", "wrong_specification")
    assert "failed to get model version from specified version string 'wrong_specification'" in err.value.message()
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple").config
    assert config.name == "simple"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    # no instance group in its config: one instance per GPU where CUDA is usable, else two CPU instances
    group = config.instance_group[0]
    gpus = host_gpus()
    assert (group.kind, list(group.gpus), group.count) == (
        (group.KIND_GPU, list(range(gpus)), 1) if gpus else (group.KIND_CPU, [], 2))
    as_json = client.get_model_config("simple", as_json=True)
    assert as_json["config"]["input"][0]["data_type"] == "TYPE_INT32"


def test_statistics_count_successes_and_failures(client: grpcclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("simple_int8").model_stats[0]
    data = np.ones((2, 16), dtype=np.int8)
    inputs = [grpcclient.InferInput(n, [2, 16], "INT8") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(data)
    client.infer("simple_int8", inputs)
    bad = grpcclient.InferInput("INPUT0", [2, 16], "INT8")
    bad.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException):
        client.infer("simple_int8", [bad])  # INPUT1 missing: decode fails before execution
    stats = client.get_inference_statistics("simple_int8")
    assert len(stats.model_stats) == 1
    after = stats.model_stats[0]
    assert after.name == "simple_int8" and after.version == "1"
    assert after.inference_count == before.inference_count + 2
    assert after.execution_count == before.execution_count + 1
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1
    assert after.inference_stats.compute_infer.ns > before.inference_stats.compute_infer.ns
    assert after.last_inference > 0
    assert any(b.batch_size == 2 for b in after.batch_stats)
    everything = client.get_inference_statistics()
    assert {s.name for s in everything.model_stats} >= {"simple", "simple_int8", "simple_string"}


def test_shared_memory_trace_and_log_rpcs(client: grpcclient.InferenceServerClient) -> None:
    client.unregister_system_shared_memory()  # unregister-all succeeds: clients call it on start
    client.unregister_cuda_shared_memory()
    assert not client.get_system_shared_memory_status().regions  # client shared memory is off by default
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled") as err:
        client.register_system_shared_memory("r", "/k", 64)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert not client.get_cuda_shared_memory_status().regions
    assert client.get_trace_settings().settings["trace_level"].value == ["OFF"]
    assert client.get_log_settings().settings["log_info"].bool_param


def test_grpc_health_probe_check_and_watch(example_server) -> None:
    """The call grpc_health_probe and the kubelet's gRPC probe make."""
    with grpc.insecure_channel(example_server.url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=2)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=2)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
