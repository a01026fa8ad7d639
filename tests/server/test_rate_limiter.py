"""Triton's rate limiter (--rate-limit, --rate-limit-resource, instance groups' rate_limiter): two models
whose instances share one copy of a resource never execute at once; with --rate-limit off they do."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from helpers import ROOT, add_python_model, start_server

RECORDING = '''
    """Sleeps 0.3 s per request and appends "<model> <start> <end>" (time.time()) to the LOG parameter's file."""
    import json
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.log = json.loads(args["model_config"])["parameters"]["LOG"]["string_value"]
            self.name = args["model_name"]

        def execute(self, requests):
            responses = []
            for request in requests:
                start = time.time()
                time.sleep(0.3)
                end = time.time()
                with open(self.log, "a") as log:
                    log.write(f"{self.name} {start} {end}\\n")
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
            return responses
'''


def _repository(root: Path, log: Path, resource: str = 'name: "R" count: 1') -> Path:
    repository = root / "repo"
    for name in ("first", "second"):
        add_python_model(repository, name, 'input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
                         'output [{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
                         f'instance_group [{{ kind: KIND_CPU count: 1 rate_limiter {{ resources [{{ {resource} }}] }} }}]\n'
                         f'parameters {{ key: "LOG" value: {{ string_value: "{log}" }} }}', RECORDING)
    return repository


def _intervals(server_url: str, log: Path) -> dict[str, list[tuple[float, float]]]:
    """Three requests to each model at once; each model's executions as (start, end)."""
    def infer(model: str) -> None:
        with grpcclient.InferenceServerClient(server_url) as client:
            tensor = grpcclient.InferInput("X", [1], "FP32")
            tensor.set_data_from_numpy(np.ones(1, np.float32))
            assert client.infer(model, [tensor]).as_numpy("Y").tolist() == [1.0]

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(infer, ["first", "second"] * 3))
    found: dict[str, list[tuple[float, float]]] = {"first": [], "second": []}
    for line in log.read_text().splitlines():
        name, start, end = line.split()
        found[name].append((float(start), float(end)))
    return found


def _overlaps(one: list[tuple[float, float]], other: list[tuple[float, float]]) -> int:
    return sum(a_start < b_end and b_start < a_end for a_start, a_end in one for b_start, b_end in other)


@pytest.mark.parametrize("mode", ["execution_count", "off"])
def test_a_shared_resource_keeps_two_models_apart(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "executions.txt"
    server = start_server(_repository(tmp_path, log), tmp_path / "logs", "--rate-limit", mode)
    try:
        executions = _intervals(server.url, log)
    finally:
        assert server.stop() == 0
    assert len(executions["first"]) == len(executions["second"]) == 3
    ignored = [line for line in server.log().splitlines() if "config field 'instance_group.rate_limiter' has no effect "
               "with --rate-limit off" in line]
    if mode == "execution_count":
        assert _overlaps(executions["first"], executions["second"]) == 0, executions
        assert ignored == []
    else:  # Triton's default: the rate_limiter settings are ignored and both models run at once, but not in silence
        assert _overlaps(executions["first"], executions["second"]) > 0, executions
        assert len(ignored) == 2 and "WARNING" in ignored[0], ignored  # one per model


def test_resource_flags_refuse_what_cannot_be_scheduled(tmp_path: Path) -> None:
    log = tmp_path / "executions.txt"
    server = start_server(_repository(tmp_path, log, 'name: "R" count: 2'), tmp_path / "logs",
                          "--rate-limit", "execution_count", "--rate-limit-resource", "R:1", "--exit-on-error=false")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert not client.is_model_ready("first")
            reasons = [m.reason for m in client.get_model_repository_index().models if m.name == "first"]
        assert 'Resource count for "R" is limited to 1 which will prevent scheduling of one or more model ' \
               "instances, the minimum required count is 2" in reasons[0]
    finally:
        server.stop()


def test_a_malformed_resource_flag_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(tmp_path),
                           "--rate-limit-resource", "R"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert ("--rate-limit-resource option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. "
            "Got R") in done.stderr
