"""What model code asks of the server from a thread it started (``pb_utils.running()``), in both
execution modes, through a real server: two python models whose threads run only after both models
have executed, each calling ``get_model_dir()``, a BLS request and ``MetricFamily``. Each acts as
itself: its own folder, its BLS answered, its family its own (unloading the other model leaves it in
``/metrics``). Threads do not inherit context variables; a process-wide "last model" would make both
threads act as the model that executed last."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from helpers import add_python_model, scrape, start_server, wait_until

IO = '''
input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [1] }]
'''
ECHO = '''
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                    for r in requests]
'''
THREADED = '''
    import json
    import os
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.name = args["model_name"]
            self.repository = os.path.dirname(args["model_repository"])
            self.armed = threading.Event()
            threading.Thread(target=self._work, daemon=True).start()

        def _work(self):
            self.armed.wait()
            trigger = os.path.join(self.repository, "trigger")
            while not os.path.exists(trigger):  # the test creates it once both models have executed
                time.sleep(0.01)
            seen = {"dir": pb_utils.get_model_dir()}
            family = pb_utils.MetricFamily(f"thread_family_{self.name}", "made by a thread", pb_utils.MetricFamily.COUNTER)
            family.Metric(labels={"made_by": self.name}).increment(1)
            self.family = family
            request = pb_utils.InferenceRequest(model_name="echo", requested_output_names=["OUT"],
                                                inputs=[pb_utils.Tensor("IN", np.array([len(self.name)], np.int32))])
            response = request.exec()
            seen["bls"] = (response.error().message() if response.has_error()
                           else int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0]))
            with open(os.path.join(self.repository, f"seen_{self.name}.json"), "w") as out:
                json.dump(seen, out)

        def execute(self, requests):
            self.armed.set()
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]) for _ in requests]
'''


@pytest.mark.parametrize("mode", ["in_process", "process"])
def test_threads_a_model_started_act_as_that_model(tmp_path: Path, mode: str) -> None:
    repository = tmp_path / "repo"
    parameter = f'parameters: {{ key: "EXECUTION_MODE" value: {{ string_value: "{mode}" }} }}\n'
    add_python_model(repository, "echo", IO, ECHO)
    for name in ("first", "second_model"):
        add_python_model(repository, name, IO + parameter, THREADED)
    server = start_server(repository, tmp_path / "logs", "--model-control-mode", "explicit", "--load-model", "*")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            for name in ("first", "second_model"):  # "second_model" executes last
                given = grpcclient.InferInput("IN", [1], "INT32")
                given.set_data_from_numpy(np.array([0], np.int32))
                assert client.infer(name, [given]).as_numpy("OUT")[0] == 1
            (repository / "trigger").touch()
            seen = {name: json.loads(wait_until(lambda n=name: (repository / f"seen_{n}.json").exists()
                                                and (repository / f"seen_{n}.json").read_text(), f"{name}'s thread"))
                    for name in ("first", "second_model")}
            for name in ("first", "second_model"):
                assert Path(seen[name]["dir"]).resolve() == (repository / name / "1").resolve()
                assert seen[name]["bls"] == len(name)
            families = {name for name, _ in scrape(server.metrics_port) if name.startswith("thread_family_")}
            assert {f.split("_")[2] for f in families} == {"first", "second"}
            client.unload_model("second_model")
            wait_until(lambda: not client.is_model_ready("second_model"), "second_model unloaded")
            families = {name for name, _ in scrape(server.metrics_port) if name.startswith("thread_family_")}
            assert {f.split("_")[2] for f in families} == {"first"}  # the first model's stays; the other's went
    finally:
        assert server.stop() == 0


GPU_ASKS = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            gpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)
            for _ in range(2):
                response = pb_utils.InferenceRequest(model_name="echo", requested_output_names=["OUT"],
                                                     inputs=[pb_utils.Tensor("IN", np.array([7], np.int32))],
                                                     preferred_memory=gpu).exec()
            out = pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
'''


@pytest.mark.parametrize("mode", ["in_process", "process"])
def test_gpu_settings_a_python_model_gives_are_named_in_the_log(tmp_path: Path, mode: str) -> None:
    """FORCE_CPU_ONLY_INPUT_TENSORS 'no' and a BLS request's GPU preferred_memory have no effect here
    (tensors are in CPU memory only): each logs one warning naming it, and the model serves."""
    repository = tmp_path / "repo"
    add_python_model(repository, "echo", IO, ECHO)
    add_python_model(repository, "gpu_asks", IO + f'parameters: {{ key: "EXECUTION_MODE" value: {{ string_value: "{mode}" }} }}\n'
                     'parameters: { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }\n', GPU_ASKS)
    server = start_server(repository, tmp_path / "logs")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            given = grpcclient.InferInput("IN", [1], "INT32")
            given.set_data_from_numpy(np.array([0], np.int32))
            for _ in range(2):
                assert client.infer("gpu_asks", [given]).as_numpy("OUT")[0] == 7
        log = wait_until(lambda: "preferred_memory asks for GPU memory" in server.log() and server.log(), "the warning")
        assert log.count("FORCE_CPU_ONLY_INPUT_TENSORS 'no' has no effect") == 1
        assert log.count("preferred_memory asks for GPU memory") == 1
    finally:
        assert server.stop() == 0
