"""ONNX Runtime options from config ``parameters`` take effect in the server, seen from outside its
process: ``inter_op_thread_count`` sizes the inter-op thread pool (threads in /proc), and
``enable_mem_pattern`` the memory ORT keeps after a run (resident memory), ``allow_spinning``
whether idle intra-op threads burn CPU between requests (CPU time); ``cpu_execution_accelerator``
``openvino`` runs the model on the OpenVINO execution provider. Names and meanings are those of
Triton's onnxruntime backend (its README, "Model Config Options") and ORT's session options.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from onnx import TensorProto, helper

from helpers import ROOT, add_model, make_model, matmul_model, start_server

MIB = 2**20
OPENVINO_ORT = ROOT / ".venv" / "openvino-ort"  # `make openvino`: onnxruntime-openvino in a folder of its own
ELEMENTS = 8 * MIB  # FP32: 32 MiB a tensor


def _expanding_model():
    """INPUT0 [1, 1] expanded to [1, ELEMENTS], through six element-wise ops, summed to OUTPUT0 [1, 1]:
    tiny messages, 32 MiB intermediates that ORT plans."""
    shape = helper.make_tensor("S", TensorProto.INT64, [2], [1, ELEMENTS])
    nodes = [helper.make_node("Expand", ["INPUT0", "S"], ["t0"])]
    nodes += [helper.make_node("Relu" if i % 2 else "Neg", [f"t{i}"], [f"t{i + 1}"]) for i in range(6)]
    nodes.append(helper.make_node("ReduceSum", ["t6"], ["OUTPUT0"], keepdims=1))
    model = make_model(nodes, [("INPUT0", TensorProto.FLOAT, [1, 1])], [("OUTPUT0", TensorProto.FLOAT, [1, 1])])
    model.graph.initializer.append(shape)
    return model


def _config(batch: int = 0, accelerator: str = "", **parameters: str) -> str:
    config = f"max_batch_size: {batch}\ninstance_group [{{ kind: KIND_CPU count: 1 }}]\n" + "".join(
        f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n' for key, value in parameters.items())
    if accelerator:
        config += f'optimization {{ execution_accelerators {{ cpu_execution_accelerator: [{{ name: "{accelerator}" }}] }} }}\n'
    return config


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    for name, pattern in (("pattern_on", "1"), ("pattern_off", "0")):
        add_model(repository, name, _expanding_model(), _config(enable_mem_pattern=pattern))
    for threads in (2, 6):
        add_model(repository, f"inter_{threads}", _expanding_model(),
                  _config(execution_mode="1", inter_op_thread_count=str(threads), intra_op_thread_count="1"))
    add_model(repository, "spin_default", matmul_model(256, depth=20), _config(64, intra_op_thread_count="2"))
    add_model(repository, "spin_1", matmul_model(256, depth=20), _config(64, intra_op_thread_count="2", allow_spinning="1"))
    add_model(repository, "openvino", matmul_model(16, depth=2), _config(8, "openvino"))
    add_model(repository, "tpu", matmul_model(16, depth=2), _config(8, "tpu"))
    running = start_server(repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit")
    yield running
    assert running.stop() == 0


def _status(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _infer(client: grpcclient.InferenceServerClient, model: str, rows: int = 1, width: int = 1) -> None:
    tensor = grpcclient.InferInput("INPUT0", [rows, width], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, width), np.float32))
    client.infer(model, [tensor])


def test_inter_op_thread_count_sizes_the_inter_op_pool(server) -> None:
    pid = server.proc.pid
    with grpcclient.InferenceServerClient(server.url) as client:
        added = {}
        for name in ("inter_2", "inter_2", "inter_6"):  # the first load also starts the loader's own threads
            before = _status(pid, "Threads")
            client.load_model(name)
            added[name] = _status(pid, "Threads") - before
            client.unload_model(name)
    # parallel execution mode: an inter-op pool of N is N - 1 threads beside the caller's
    assert added["inter_6"] - added["inter_2"] == 4, added


def test_enable_mem_pattern_keeps_the_planned_block(server) -> None:
    """With the memory pattern ORT keeps a planned block of the intermediates after a run: 64 MiB
    more here than without it, where only the arena's reused buffers stay (measured: 132 vs 66 MiB)."""
    pid = server.proc.pid
    grown = {}
    with grpcclient.InferenceServerClient(server.url) as client:
        for name in ("pattern_on", "pattern_off"):
            client.load_model(name)
            before = _status(pid, "VmRSS")
            for _ in range(3):
                _infer(client, name)
            grown[name] = (_status(pid, "VmRSS") - before) / 1024
            client.unload_model(name)
    assert grown["pattern_on"] - grown["pattern_off"] > 40, grown  # MiB; a tensor is 32 MiB


def test_allow_spinning_makes_idle_threads_burn_cpu(server) -> None:
    """The default (0) lets intra-op threads sleep between requests; 1 makes them spin. Measured on
    two cores, one kept busy by another process: 0.6-0.7 s of server CPU without spinning, 1.4-1.7 s
    with it."""
    pid = server.proc.pid
    used = {"spin_default": 0.0, "spin_1": 0.0}
    with grpcclient.InferenceServerClient(server.url) as client:
        for name in used:
            client.load_model(name)
        for _ in range(3):  # interleaved rounds: a busy neighbour slows both alike
            for name in used:
                started = _cpu_seconds(pid)
                for _ in range(60):
                    _infer(client, name, 64, 256)
                    time.sleep(0.005)  # idle between requests: the time spinning threads burn
                used[name] += _cpu_seconds(pid) - started
        for name in used:
            client.unload_model(name)
    assert used["spin_1"] > 1.3 * used["spin_default"], used


def test_cpu_accelerators_this_onnxruntime_lacks_fail_the_load_saying_why(server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        reasons = {}
        for name in ("openvino", "tpu"):
            with pytest.raises(InferenceServerException) as failed:
                client.load_model(name)
            reasons[name] = failed.value.message()
            assert not client.is_model_ready(name)
    assert "unknown Execution Accelerator 'tpu' is requested" in reasons["tpu"]  # Triton's text
    assert "onnxruntime-openvino" in reasons["openvino"], reasons  # the venv's ONNX Runtime has no OpenVINO


def test_openvino_accelerator_runs_the_model_on_openvino(tmp_path) -> None:
    """The server started with onnxruntime-openvino ahead of the venv's ONNX Runtime: the model
    with the accelerator runs on OpenVINO, the one without it on the CPU provider, same results."""
    repository = tmp_path / "repo"
    add_model(repository, "openvino", matmul_model(16, depth=2), _config(8, "openvino"))
    add_model(repository, "plain", matmul_model(16, depth=2), _config(8))
    assert (OPENVINO_ORT / "onnxruntime").is_dir(), "run `make openvino` (make test does)"
    running = start_server(repository, tmp_path, env={"PYTHONPATH": str(OPENVINO_ORT)})
    try:
        data = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
        results = {}
        with grpcclient.InferenceServerClient(running.url) as client:
            for name in ("openvino", "plain"):
                tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
                tensor.set_data_from_numpy(data)
                results[name] = client.infer(name, [tensor]).as_numpy("OUTPUT0")
        log = running.log()
        assert "openvino/1/model.onnx runs on OpenVINOExecutionProvider, CPUExecutionProvider" in log, log
        assert "plain/1/model.onnx runs on" not in log
        rows = np.repeat(data.mean(axis=1, keepdims=True), 16, axis=1)  # W is 1/16 everywhere
        np.testing.assert_allclose(results["plain"], rows, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(results["openvino"], rows, rtol=1e-4, atol=1e-5)
    finally:
        assert running.stop() == 0
