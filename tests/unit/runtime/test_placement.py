"""Where an ONNX model's instances run and what the CUDA execution provider is given
(kserve_v2/runtime/placement.py), and how the ONNX backend opens its sessions from that on a host
without a GPU (kserve_v2/runtime/onnx.py): the device count is an argument, never ONNX Runtime's.

Placement is Triton's model lifecycle: ``count`` instances ``<group>_<index>`` on EACH GPU of a
KIND_GPU group, ``count`` on the CPU for KIND_CPU; the CUDA options are those Triton's onnxruntime
backend README lists under "Deprecated Parameters".
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.runtime import onnx as onnx_backend
from kserve_v2.runtime.placement import cuda_parameters, cuda_provider_options, no_cuda_reason, plan
from kserve_v2.backend.instance_groups import Instance, instance_count
from tests.helpers import identity_model

GPU, CPU = mc.ModelInstanceGroup.KIND_GPU, mc.ModelInstanceGroup.KIND_CPU


def groups(text: str) -> list[mc.ModelInstanceGroup]:
    """The instance groups of a ``config.pbtxt`` text, as complete_instances leaves them."""
    config = text_format.Parse(text, mc.ModelConfig())
    return list(config.instance_group)


def rows(placements: list[Instance]) -> list[tuple[str, int, int, int]]:
    return [(p.group, p.index, p.kind, p.device) for p in placements]


def test_count_instances_on_each_gpu_of_the_group() -> None:
    placed = plan(groups('instance_group [{ name: "g" kind: KIND_GPU count: 2 gpus: [0, 2] }]'), gpus=3)
    assert rows(placed) == [("g", 0, GPU, 0), ("g", 0, GPU, 2), ("g", 1, GPU, 0), ("g", 1, GPU, 2)]
    assert [p.name for p in placed] == ["g_0", "g_0", "g_1", "g_1"]  # Triton: one name across the group's GPUs
    assert all(p.on_gpu for p in placed)


def test_every_group_is_placed_and_cpu_groups_run_on_the_cpu() -> None:
    text = ('instance_group [{ name: "a" kind: KIND_GPU count: 1 gpus: [1] },'
            ' { name: "c" kind: KIND_CPU count: 2 },'
            ' { name: "b" kind: KIND_GPU count: 2 gpus: [0, 1] }]')
    assert rows(plan(groups(text), gpus=2)) == [
        ("a", 0, GPU, 1),
        ("c", 0, CPU, 0), ("c", 1, CPU, 0),
        ("b", 0, GPU, 0), ("b", 0, GPU, 1), ("b", 1, GPU, 0), ("b", 1, GPU, 1),
    ]


def test_a_gpu_group_without_gpus_is_on_every_visible_gpu() -> None:
    placed = plan(groups('instance_group [{ name: "g" kind: KIND_GPU count: 1 }]'), gpus=4)
    assert [p.device for p in placed] == [0, 1, 2, 3]


def test_a_cpu_only_plan_is_count_instances_on_the_cpu() -> None:
    placed = plan(groups('instance_group [{ name: "m_0" kind: KIND_CPU count: 2 gpus: [1] }]'), gpus=0)
    assert rows(placed) == [("m_0", 0, CPU, 0), ("m_0", 1, CPU, 0)]
    assert not any(p.on_gpu for p in placed)


@pytest.mark.parametrize(("text", "gpus", "asked"), [
    ('instance_group [{ name: "g" kind: KIND_GPU count: 1 gpus: [2] }]', 2, "[2]"),
    ('instance_group [{ name: "g" kind: KIND_GPU count: 1 }]', 0, "[]"),
])
def test_a_gpu_that_is_not_usable_is_refused(text: str, gpus: int, asked: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"instance group 'g' asks for GPUs {asked} but {gpus} are usable")):
        plan(groups(text), gpus)


@pytest.mark.parametrize("text", [
    'instance_group [{ name: "c" kind: KIND_CPU count: 3 }]',
    'instance_group [{ name: "g" kind: KIND_GPU count: 3 gpus: [0, 1, 2] }, { name: "c" kind: KIND_CPU count: 2 }]',
    'instance_group [{ name: "g" kind: KIND_GPU count: 1 gpus: [1] }, { name: "h" kind: KIND_GPU count: 2 gpus: [0, 2] }]',
])
def test_the_instance_pool_runs_as_many_as_the_plan_places(text: str) -> None:
    assert instance_count(groups(text)) == len(plan(groups(text), gpus=3))


def test_provider_options_are_the_device_alone_by_default() -> None:
    assert cuda_provider_options({"intra_op_thread_count": "2"}, 3) == {"device_id": "3"}
    assert cuda_parameters({"intra_op_thread_count": "2"}) == []


def test_triton_parameters_become_cuda_provider_options() -> None:
    parameters = {"cudnn_conv_algo_search": "1", "gpu_mem_limit": "4294967296", "arena_extend_strategy": "1",
                  "do_copy_in_default_stream": "0", "execution_mode": "0"}
    assert cuda_provider_options(parameters, 1) == {
        "device_id": "1", "cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "4294967296",
        "arena_extend_strategy": "kSameAsRequested", "do_copy_in_default_stream": "0"}
    assert cuda_parameters(parameters) == ["cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy",
                                           "do_copy_in_default_stream"]
    assert cuda_provider_options({"cudnn_conv_algo_search": "0", "arena_extend_strategy": "0"}, 0) == {
        "device_id": "0", "cudnn_conv_algo_search": "EXHAUSTIVE", "arena_extend_strategy": "kNextPowerOfTwo"}
    assert cuda_provider_options({"cudnn_conv_algo_search": "2"}, 0)["cudnn_conv_algo_search"] == "DEFAULT"
    assert cuda_provider_options({"gpu_mem_limit": str(2**64 - 1)}, 0)["gpu_mem_limit"] == str(2**64 - 1)


@pytest.mark.parametrize(("key", "value"), [
    ("cudnn_conv_algo_search", "3"), ("cudnn_conv_algo_search", "HEURISTIC"), ("gpu_mem_limit", "-1"),
    ("gpu_mem_limit", "4GB"), ("gpu_mem_limit", str(2**64)), ("arena_extend_strategy", "kSameAsRequested"),
    ("do_copy_in_default_stream", "yes"),
])
def test_a_bad_value_names_its_parameter(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"parameter '{key}' of the CUDA execution provider must be .*, got '{value}'"):
        cuda_provider_options({key: value}, 0)


def test_why_no_instance_runs_on_cuda() -> None:
    assert "no CUDA execution provider" in no_cuda_reason(cuda_provider=False, gpus=0)
    assert no_cuda_reason(cuda_provider=True, gpus=0) == "no GPU is usable"
    assert no_cuda_reason(cuda_provider=True, gpus=2) == "its instances are in KIND_CPU groups"


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(identity_model(TensorProto.FLOAT), str(path))
    return path


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse('name: "m"\n' + text, mc.ModelConfig())


def test_cpu_instances_share_one_session_and_unused_cuda_parameters_are_logged_once(
        model_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    """On this host (no GPU) the CPU path: one session for every CPU instance, one line for the CUDA keys."""
    completed = config('instance_group [{ name: "m_0" kind: KIND_CPU count: 3 }]\n'
                       'parameters { key: "gpu_mem_limit" value: { string_value: "1024" } }\n'
                       'parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }')
    with caplog.at_level(logging.WARNING, logger=onnx_backend.__name__):
        sessions = onnx_backend.open_sessions(model_file, completed)
    assert len(sessions) == 3 and all(s is sessions[0] for s in sessions) and not sessions[0].on_cuda
    texts = [r.getMessage() for r in caplog.records]
    assert len(texts) == 1, texts
    assert "parameters ['cudnn_conv_algo_search', 'gpu_mem_limit'] have no effect" in texts[0]
    assert "the model runs on the CPU" in texts[0]


def test_gpus_of_a_cpu_group_are_logged_once(model_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    completed = config('instance_group [{ name: "m_0" kind: KIND_CPU count: 1 gpus: [0] }]')
    with caplog.at_level(logging.WARNING, logger=onnx_backend.__name__):
        onnx_backend.open_sessions(model_file, completed)
    assert [r.getMessage() for r in caplog.records] == [
        "model 'm': config field 'instance_group.gpus' has no effect on KIND_CPU instance group(s) ['m_0']: "
        "their instances run on the CPU"]


def test_a_bad_cuda_parameter_fails_the_load_without_a_gpu(model_file: Path) -> None:
    bad = config('instance_group [{ name: "m_0" kind: KIND_CPU count: 1 }]\n'
                 'parameters { key: "arena_extend_strategy" value: { string_value: "2" } }')
    with pytest.raises(ValueError, match="parameter 'arena_extend_strategy' of the CUDA execution provider"):
        onnx_backend.open_sessions(model_file, bad)


def test_a_model_on_several_sessions_runs_each_execution_on_a_free_one(model_file: Path) -> None:
    """Instances with sessions of their own (GPU instances) take turns; here two CPU sessions stand in."""
    completed = config('instance_group [{ name: "m_0" kind: KIND_CPU count: 1 }]')
    sessions = [onnx_backend.open_sessions(model_file, completed)[0] for _ in range(2)]
    model = onnx_backend.OnnxModel(sessions)
    assert not model.on_cuda and [t.name for t in model.inputs] == ["INPUT0"]
    results: list[list[float]] = []
    start = threading.Barrier(4, timeout=10)

    def run(value: float) -> None:
        start.wait()
        feeds = {"INPUT0": np.full((1, 2), value, np.float32)}
        results.append(model.execute(feeds, ["OUTPUT0"], {}).outputs[0].ravel().tolist())

    threads = [threading.Thread(target=run, args=(float(i),)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
