"""System shared memory (Triton's extension) with tritonclient's own shm utilities, over gRPC and HTTP."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import (InferenceServerException, deserialize_bytes_tensor, serialize_byte_tensor,
                               serialized_byte_size)

from helpers import EXAMPLES, ROOT, start_server

SHARED_TOOLS = ROOT.parent / "shared" / "tools"

BYTES_16 = 16 * 4  # sixteen INT32


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory):
    server = start_server(EXAMPLES, tmp_path_factory.mktemp("logs"), "--allow-client-shm", "true")
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


def test_offsets_and_sizes_are_bounds_checked(shm_server, regions) -> None:
    _, pid = regions
    with grpcclient.InferenceServerClient(shm_server.url) as client:
        client.unregister_system_shared_memory()
        with pytest.raises(InferenceServerException, match="beyond the") as err:
            client.register_system_shared_memory("too_big", f"/kv2_in_{pid}", 4 * BYTES_16)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException, match="Integer overflow detected"):
            client.register_system_shared_memory("overflow", f"/kv2_in_{pid}", 2**64 - 32, offset=32)
        for key in ("/../etc/passwd", "no_slash", "/a/b", f"/kv2_missing_{pid}"):
            with pytest.raises(InferenceServerException) as err:
                client.register_system_shared_memory("bad_key", key, 8)
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and key not in str(err.value)
        client.register_system_shared_memory("input_data", f"/kv2_in_{pid}", 2 * BYTES_16)
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory("input_data", f"/kv2_in_{pid}", 2 * BYTES_16)
        for offset, size, text in ((2 * BYTES_16, BYTES_16, "Invalid offset for shared memory region"),
                                   (BYTES_16 + 4, BYTES_16, "Invalid offset \\+ byte size"),
                                   (0, BYTES_16 - 4, "input byte size mismatch")):
            inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_shared_memory("input_data", size, offset=offset)
            inputs[1].set_shared_memory("input_data", BYTES_16)
            with pytest.raises(InferenceServerException, match=text) as err:
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
def test_perf_analyzer_runs_with_system_shared_memory(shm_server, tmp_path, protocol) -> None:
    """perf_analyzer -i {grpc,http} --shared-memory system: registers, infers, unregisters all, cleanly."""
    tool = shutil.which("perf_analyzer") or (SHARED_TOOLS / "perf_analyzer")
    if not Path(tool).exists():
        pytest.skip("perf_analyzer is neither on PATH nor in ../shared/tools")
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
