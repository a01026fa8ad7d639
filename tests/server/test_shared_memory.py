"""System shared memory (Triton's extension) with tritonclient's own shm utilities, over gRPC and HTTP."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import (InferenceServerException, deserialize_bytes_tensor, serialize_byte_tensor,
                               serialized_byte_size)

from helpers import EXAMPLES, pending, perf_analyzer, start_server, wait_pending, wait_until


BYTES_16 = 16 * 4  # sixteen INT32


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory):
    """The example repository, and ``slow_simple``: Triton's ``simple`` whose dynamic batcher holds a lone
    request for its 3 s queue delay (in flight without burning a core)."""
    extra = tmp_path_factory.mktemp("repo")
    (extra / "slow_simple" / "1").mkdir(parents=True)
    shutil.copy(EXAMPLES / "simple" / "1" / "model.onnx", extra / "slow_simple" / "1" / "model.onnx")
    config = (EXAMPLES / "simple" / "config.pbtxt").read_text().replace('name: "simple"', 'name: "slow_simple"')
    (extra / "slow_simple" / "config.pbtxt").write_text(
        config + "dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 3000000 }\n")
    server = start_server(EXAMPLES, tmp_path_factory.mktemp("logs"), "--allow-client-shm", "true",
                          "--model-repository", str(extra))
    yield server
    assert server.stop() == 0


@pytest.fixture
def regions():
    """Input (two INT32 [1,16]) and output objects in /dev/shm, destroyed afterwards."""
    pid = os.getpid()
    handles = {"input": shm.create_shared_memory_region("input", f"/kv2_in_{pid}", 2 * BYTES_16),
               "output": shm.create_shared_memory_region("output", f"/kv2_out_{pid}", 2 * BYTES_16)}
    yield handles, pid
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_simple_round_trip_through_shared_memory(shm_server, regions, protocol) -> None:
    """Triton's simple_{grpc,http}_shm_client.py: inputs and outputs in shared memory."""
    handles, pid = regions
    module = grpcclient if protocol == "grpc" else httpclient
    url = shm_server.url if protocol == "grpc" else shm_server.http_url
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), dtype=np.int32)
    shm.set_shared_memory_region(handles["input"], [a, b])
    client = module.InferenceServerClient(url)
    try:
        client.unregister_system_shared_memory()
        client.register_system_shared_memory("input_data", f"/kv2_in_{pid}", 2 * BYTES_16)
        client.register_system_shared_memory("output_data", f"/kv2_out_{pid}", 2 * BYTES_16)
        status = client.get_system_shared_memory_status()
        names = {r.name for r in status.regions.values()} if protocol == "grpc" else {r["name"] for r in status}
        assert names == {"input_data", "output_data"}
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("input_data", BYTES_16)
        inputs[1].set_shared_memory("input_data", BYTES_16, offset=BYTES_16)
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output_data", BYTES_16)
        outputs[1].set_shared_memory("output_data", BYTES_16, offset=BYTES_16)
        result = client.infer("simple", inputs, outputs=outputs)
        total = shm.get_contents_as_numpy(handles["output"], np.int32, [1, 16])
        difference = shm.get_contents_as_numpy(handles["output"], np.int32, [1, 16], offset=BYTES_16)
        np.testing.assert_array_equal(total, a + b)
        np.testing.assert_array_equal(difference, a - b)
        assert result.get_output("OUTPUT0") is not None
        if protocol == "http":  # Triton names an output written to shared memory with nothing else
            assert result.get_response()["outputs"] == [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
                                                        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16]}]
        client.unregister_system_shared_memory("output_data")
        with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'output_data'"):
            client.infer("simple", inputs, outputs=outputs)
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_string_tensors_through_shared_memory(shm_server, regions) -> None:
    handles, pid = regions
    values = np.array([str(i).encode() for i in range(16)], dtype=object).reshape(1, 16)
    ones = np.array([b"1"] * 16, dtype=object).reshape(1, 16)
    serialized = [serialize_byte_tensor(values), serialize_byte_tensor(ones)]
    size = sum(serialized_byte_size(s) for s in serialized)
    string_in = shm.create_shared_memory_region("strings", f"/kv2_str_{pid}", size)
    try:
        shm.set_shared_memory_region(string_in, serialized)
        with grpcclient.InferenceServerClient(shm_server.url) as client:
            client.register_system_shared_memory("strings", f"/kv2_str_{pid}", size)
            client.register_system_shared_memory("string_out", f"/kv2_out_{pid}", 2 * BYTES_16)
            first = serialized_byte_size(serialized[0])
            inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"), grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]
            inputs[0].set_shared_memory("strings", first)
            inputs[1].set_shared_memory("strings", size - first, offset=first)
            output = grpcclient.InferRequestedOutput("OUTPUT0")
            output.set_shared_memory("string_out", 2 * BYTES_16)
            client.infer("simple_string", inputs, outputs=[output])
            expected = serialize_byte_tensor(np.array([str(i + 1).encode() for i in range(16)], dtype=object)).item()
            raw = shm.get_contents_as_numpy(handles["output"], np.uint8, [2 * BYTES_16]).tobytes()
            assert raw[:len(expected)] == expected
            assert [int(v) for v in deserialize_bytes_tensor(expected)] == [i + 1 for i in range(16)]
            client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(string_in)


def _refused(call, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        call(*args, **kwargs)
    return err.value


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_register_errors_have_tritons_texts(shm_server, regions, protocol) -> None:
    """Triton's texts and codes (src/shared_memory_manager.cc; L0_shared_memory test_register_out_of_bound,
    L0_grpc python_grpc_aio_test): a key that cannot be opened is INTERNAL and names the key, a range beyond
    the object is "invalid args"."""
    _, pid = regions
    module = grpcclient if protocol == "grpc" else httpclient
    internal, invalid = ("StatusCode.INTERNAL", "StatusCode.INVALID_ARGUMENT") if protocol == "grpc" else ("500", "400")
    with module.InferenceServerClient(shm_server.url if protocol == "grpc" else shm_server.http_url) as client:
        client.unregister_system_shared_memory()
        if protocol == "grpc":  # HTTP has no route for an empty region name
            err = _refused(client.register_system_shared_memory, "", "", 0)
            assert (err.status(), err.message()) == (internal, "Unable to open shared memory region: ''")
        for key in ("", "/../etc/passwd", "no_slash", "/a/b", f"/kv2_missing_{pid}"):
            err = _refused(client.register_system_shared_memory, "bad_key", key, 8)
            assert (err.status(), err.message()) == (internal, f"Unable to open shared memory region: '{key}'")
        size = 2 * BYTES_16
        for offset, byte_size in ((0, size + 1), (1, size), (size, 1), (size + 1, 0)):
            err = _refused(client.register_system_shared_memory, "too_big", f"/kv2_in_{pid}", byte_size, offset=offset)
            assert (err.status(), err.message()) == (invalid, "failed to register shared memory region 'too_big': invalid args")
        err = _refused(client.register_system_shared_memory, "overflow", f"/kv2_in_{pid}", 2**64 - 32, offset=32)
        assert err.message() == "Integer overflow detected for shared memory region 'overflow'"
        assert (client.get_system_shared_memory_status().regions if protocol == "grpc"
                else client.get_system_shared_memory_status()) in ({}, [])


def test_offsets_and_sizes_are_bounds_checked(shm_server, regions) -> None:
    _, pid = regions
    with grpcclient.InferenceServerClient(shm_server.url) as client:
        client.unregister_system_shared_memory()
        client.register_system_shared_memory("input_data", f"/kv2_in_{pid}", 2 * BYTES_16)
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory("input_data", f"/kv2_in_{pid}", 2 * BYTES_16)
        for offset, size, text in ((2 * BYTES_16, BYTES_16, "Invalid offset for shared memory region: 'input_data'"),
                                   (BYTES_16 + 4, BYTES_16, "Invalid offset + byte size for shared memory region: "
                                                            "'input_data'")):
            inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_shared_memory("input_data", size, offset=offset)
            inputs[1].set_shared_memory("input_data", BYTES_16)
            err = _refused(client.infer, "simple", inputs)
            assert (err.status(), err.message()) == ("StatusCode.INVALID_ARGUMENT", text)
        with httpclient.InferenceServerClient(shm_server.http_url) as rest:  # L0_shared_memory's HTTP offset
            inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
            for tensor in inputs:
                tensor.set_shared_memory("input_data", BYTES_16)
            output = httpclient.InferRequestedOutput("OUTPUT0")
            output.set_shared_memory("input_data", BYTES_16, offset=2**64 - 32)
            err = _refused(rest.infer, "simple", inputs, outputs=[output])
            assert (err.status(), err.message()) == ("400", "Invalid offset for shared memory region: 'input_data'")
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("input_data", BYTES_16 - 4)
        inputs[1].set_shared_memory("input_data", BYTES_16)
        with pytest.raises(InferenceServerException, match="input byte size mismatch") as err:
            client.infer("simple", inputs)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        for tensor in inputs:
            tensor.set_shared_memory("input_data", BYTES_16)
        small = grpcclient.InferRequestedOutput("OUTPUT0")
        small.set_shared_memory("input_data", 8)
        with pytest.raises(InferenceServerException, match="should be at least 64 bytes"):
            client.infer("simple", inputs, outputs=[small])
        client.unregister_system_shared_memory()
        assert client.is_server_live()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_unregister_during_inference_is_refused_until_it_ends(shm_server, protocol) -> None:
    """L0_shared_memory test_unregister_shm_during_inference_{http,grpc}: while a request that reads two
    regions and writes two others waits in slow_simple's queue, unregistering any of them fails with Triton's
    texts (INTERNAL) and every region stays; once it is answered (outputs in shared memory, right), all go."""
    module = grpcclient if protocol == "grpc" else httpclient
    url = shm_server.url if protocol == "grpc" else shm_server.http_url
    pid, names = os.getpid(), ["input0_data", "input1_data", "output0_data", "output1_data"]
    handles = [shm.create_shared_memory_region(name, f"/kv2_{name}_{pid}", BYTES_16) for name in names]
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), dtype=np.int32)
    shm.set_shared_memory_region(handles[0], [a])
    shm.set_shared_memory_region(handles[1], [b])
    client, second = module.InferenceServerClient(url), module.InferenceServerClient(url)
    try:
        client.unregister_system_shared_memory()
        for name in names:
            client.register_system_shared_memory(name, f"/kv2_{name}_{pid}", BYTES_16)
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        for tensor, name in zip(inputs + outputs, names, strict=True):
            tensor.set_shared_memory(name, BYTES_16)
        if protocol == "grpc":
            done: list = []
            client.async_infer("slow_simple", inputs, callback=lambda result, error: done.append(error or result),
                               outputs=outputs)
        else:
            request = client.async_infer("slow_simple", inputs, outputs=outputs)
        wait_pending(shm_server, "slow_simple", 1, timeout=30)  # the request is decoded and waits for its batch
        internal = "StatusCode.INTERNAL" if protocol == "grpc" else "500"
        err = _refused(second.unregister_system_shared_memory)
        assert (err.status(), err.message()) == (
            internal, "Failed to unregister the following system shared memory regions: "
                      "input0_data ,input1_data ,output0_data ,output1_data ,")
        for name in names:
            err = _refused(second.unregister_system_shared_memory, name)
            assert (err.status(), err.message()) == (
                internal, f"Cannot unregister shared memory region '{name}', it is currently in use.")
        assert pending(shm_server, "slow_simple") == 1, "the request ended before every refusal was checked"
        if protocol == "grpc":
            wait_until(lambda: done, "the answer", 30)
            assert not isinstance(done[0], InferenceServerException), done[0]
        else:
            request.get_result()
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handles[2], np.int32, [1, 16]), a + b)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handles[3], np.int32, [1, 16]), a - b)
        second.unregister_system_shared_memory()
        for name in names:
            err = _refused(second.get_system_shared_memory_status, name)
            assert err.message() == f"Unable to find system shared memory region: '{name}'"
    finally:
        client.unregister_system_shared_memory()
        client.close()
        second.close()
        for handle in handles:
            shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_runs_with_system_shared_memory(shm_server, tmp_path, protocol) -> None:
    """perf_analyzer -i {grpc,http} --shared-memory system: registers, infers, unregisters all, cleanly."""
    tool = perf_analyzer()
    url = shm_server.url if protocol == "grpc" else shm_server.http_url
    report = tmp_path / "report.csv"
    run = subprocess.run([str(tool), "-m", "simple", "-i", protocol, "-u", url, "--shared-memory", "system",
                          "--output-shared-memory-size", str(BYTES_16), "--concurrency-range", "1",
                          "--measurement-interval", "500", "--max-trials", "20", "--stability-percentage", "100",
                          "-f", str(report)], capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert "Unable to" not in output and "error" not in output.lower(), output[-3000:]
    with open(report) as f:
        assert float(next(csv.DictReader(f))["Inferences/Second"]) > 0
