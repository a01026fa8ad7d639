"""Model warmup (``model_warmup``, Triton's "Model Warmup") through a real server and unmodified tritonclient:
each instance runs every sample ``count`` times before the version is READY, a ``batch_size`` sample is that
many requests in one execution, the runs count in ModelStatistics as Triton counts them, ``zero_data``,
``random_data`` and ``input_data_file`` (from the model's ``warmup/`` folder) feed them, and a failing sample
fails the load with Triton's text (RepositoryIndex reason). Python models (a model that records its calls)
and ONNX models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto

from helpers import Server, add_model, add_python_model, identity_model, start_server

# records each execute: its instance, its requests, and each request's inputs
RECORDING = '''
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.instance = args["model_instance_name"]
            config = json.loads(args["model_config"])
            self.calls = config["parameters"]["CALLS"]["string_value"]
            self.inputs = [i["name"] for i in config["input"]]

        def execute(self, requests):
            seen = []
            for request in requests:
                arrays = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
                seen.append({name: {"shape": list(a.shape), "values": a.ravel().tolist()} for name, a in arrays.items()})
            with open(self.calls, "a") as out:
                out.write(json.dumps({"instance": self.instance, "requests": seen}) + "\\n")
            return [pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", np.zeros((1, 1) if "batch" in self.instance else (1,), np.int32))])
                for _ in requests]
'''
FAILING = '''
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("An Error Occurred"))
                    for _ in requests]
'''

# a decoupled model: two responses, then the final flag alone, from a thread of its own after execute returned
DECOUPLED = '''
    import threading

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.fail = "fail" in args["model_name"]

        def execute(self, requests):
            for request in requests:
                threading.Thread(target=self.answer, args=(request.get_response_sender(),)).start()

        def answer(self, sender):
            if self.fail:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad stream")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            for i in range(2):
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.full(1, i, np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''
DECOUPLED_CONFIG = '''
    model_transaction_policy { decoupled: true }
    input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
    output [{ name: "OUT", data_type: TYPE_INT32, dims: [1] }]
    instance_group [{ count: 1, kind: KIND_CPU }]
    model_warmup [{ name: "d" batch_size: 1 count: 2 inputs { key: "IN" value: { data_type: TYPE_INT32 dims: [1] zero_data: true } } }]
'''


def _recording(repository: Path, name: str, calls: Path, body: str) -> None:
    add_python_model(repository, name, f'''
        parameters {{ key: "CALLS" value: {{ string_value: "{calls}" }} }}
        output [{{ name: "OUTPUT", data_type: TYPE_INT32, dims: [1] }}]
        {body}''', RECORDING)


def _calls(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _sample(name: str, inputs: str, count: int = 0, batch_size: int = 1) -> str:
    return f'{{ name: "{name}" batch_size: {batch_size} count: {count} {inputs} }}'


def _input(name: str, data_type: str, dims: str, data: str) -> str:
    return f'inputs {{ key: "{name}" value: {{ data_type: {data_type} dims: {dims} {data} }} }}'


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """A server whose models all warm up: ``counting`` (python, 2 instances, count 3, zero data),
    ``batched`` (python, max_batch_size 8, a batch_size 4 sample of random data and a file),
    ``onnx`` (2 instances, count 2), ``onnx_batch`` (a batch_size 2 sample) and ``decoupled`` (responses
    sent after execute returned)."""
    repository = tmp_path_factory.mktemp("repository")
    calls = tmp_path_factory.mktemp("calls")
    _recording(repository, "counting", calls / "counting.jsonl", f'''
        input [{{ name: "INPUT", data_type: TYPE_FP32, dims: [4] }}]
        instance_group [{{ count: 2, kind: KIND_CPU }}]
        model_warmup [{_sample("zero sample", _input("INPUT", "TYPE_FP32", "[4]", "zero_data: true"), count=3)}]''')
    folder = repository / "batched"
    (folder / "warmup").mkdir(parents=True)
    # the file holds more than a request needs: its first 16 bytes are read, as Triton reads them
    (folder / "warmup" / "ints").write_bytes(np.arange(6, dtype="<i4").tobytes())
    inputs = (_input("RANDOM", "TYPE_FP32", "[3]", "random_data: true")
              + _input("FILE", "TYPE_INT32", "[4]", 'input_data_file: "ints"'))
    _recording(repository, "batched", calls / "batched.jsonl", f'''
        max_batch_size: 8
        input [{{ name: "RANDOM", data_type: TYPE_FP32, dims: [3] }}, {{ name: "FILE", data_type: TYPE_INT32, dims: [4] }}]
        instance_group [{{ name: "batch", count: 1, kind: KIND_CPU }}]
        dynamic_batching {{ }}
        model_warmup [{_sample("four", inputs, batch_size=4)}, {_sample("skipped", inputs, batch_size=0)}]''')
    identity = identity_model(TensorProto.FLOAT, [2])
    add_model(repository, "onnx", identity, f'''
        name: "onnx" backend: "onnxruntime"
        instance_group [{{ count: 2, kind: KIND_CPU }}]
        model_warmup [{_sample("zeros", _input("INPUT0", "TYPE_FP32", "[2]", "zero_data: true"), count=2)}]''')
    add_model(repository, "onnx_batch", identity_model(TensorProto.FLOAT, [None, 2]), f'''
        name: "onnx_batch" backend: "onnxruntime" max_batch_size: 4
        instance_group [{{ count: 1, kind: KIND_CPU }}]
        model_warmup [{_sample("pair", _input("INPUT0", "TYPE_FP32", "[2]", "random_data: true"), batch_size=2)}]''')
    add_python_model(repository, "decoupled", DECOUPLED_CONFIG, DECOUPLED)
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    try:
        yield server, calls
    finally:
        server.stop()


def test_each_instance_runs_each_sample_count_times_before_ready(warmed: tuple[Server, Path]) -> None:
    """2 instances, ``count: 3``: 3 executions of one request on each instance, zeros, before READY,
    shown in ModelStatistics as 6 inferences and 6 executions (Triton's core counts warmup requests);
    a client's request adds one execution, and no warmup runs after it."""
    server, calls = warmed
    warmup = _calls(calls / "counting.jsonl")
    assert sorted(call["instance"] for call in warmup) == ["counting_0_0"] * 3 + ["counting_0_1"] * 3, warmup
    assert all(call["requests"] == [{"INPUT": {"shape": [4], "values": [0.0] * 4}}] for call in warmup), warmup
    client = grpcclient.InferenceServerClient(server.url)
    assert client.is_model_ready("counting")
    before = client.get_inference_statistics("counting").model_stats[0]
    assert (before.inference_count, before.execution_count, before.inference_stats.success.count) == (6, 6, 6), before
    data = grpcclient.InferInput("INPUT", [4], "FP32")
    data.set_data_from_numpy(np.ones(4, np.float32))
    client.infer("counting", [data])
    after = _calls(calls / "counting.jsonl")
    assert len(after) == 7 and after[-1]["requests"] == [{"INPUT": {"shape": [4], "values": [1.0] * 4}}], after
    stats = client.get_inference_statistics("counting").model_stats[0]
    assert (stats.inference_count, stats.execution_count, stats.inference_stats.success.count) == (7, 7, 7), stats


def test_statistics_before_the_first_request(warmed: tuple[Server, Path]) -> None:
    """Triton's core reports warmup requests like a client's: ``onnx`` (2 instances, count 2) shows 4
    inferences and 4 executions before any request; ``onnx_batch`` (batch_size 2) 2 inferences in 1
    execution of batch 2; both over gRPC and HTTP."""
    server, _ = warmed
    stats = grpcclient.InferenceServerClient(server.url).get_inference_statistics("onnx").model_stats[0]
    assert (stats.inference_count, stats.execution_count) == (4, 4), stats
    assert (stats.inference_stats.success.count, stats.inference_stats.fail.count) == (4, 0)
    assert stats.inference_stats.compute_infer.count == 4 and stats.last_inference > 0
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(1, 4)]
    http = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("onnx_batch")["model_stats"][0]
    assert (http["inference_count"], http["execution_count"]) == (2, 1), http
    assert http["inference_stats"]["success"]["count"] == 2
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in http["batch_stats"]] == [(2, 1)]


def test_a_batch_sample_counts_one_execution(warmed: tuple[Server, Path]) -> None:
    """``batched`` (python, a ``batch_size: 4`` sample): 4 inferences in 1 execution of batch 4."""
    server, _ = warmed
    stats = grpcclient.InferenceServerClient(server.url).get_inference_statistics("batched").model_stats[0]
    assert (stats.inference_count, stats.execution_count, stats.inference_stats.success.count) == (4, 1, 4), stats
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(4, 1)]


def test_batch_size_is_that_many_requests_in_one_execution(warmed: tuple[Server, Path]) -> None:
    """``batch_size: 4`` on a batching model: one execute of 4 identical requests of one row each; the
    file's first 4 INT32s, random FP32s; the ``batch_size: 0`` sample is skipped."""
    _, calls = warmed
    warmup = _calls(calls / "batched.jsonl")
    assert len(warmup) == 1 and len(warmup[0]["requests"]) == 4, warmup
    first = warmup[0]["requests"][0]
    assert all(request == first for request in warmup[0]["requests"])
    assert first["FILE"] == {"shape": [1, 4], "values": [0, 1, 2, 3]}
    assert first["RANDOM"]["shape"] == [1, 3] and len(first["RANDOM"]["values"]) == 3


def test_a_decoupled_model_warms_up_on_its_response_streams(warmed: tuple[Server, Path]) -> None:
    """Each warmup request waits for its final flag; the model is READY and counted (2 runs)."""
    server, _ = warmed
    client = grpcclient.InferenceServerClient(server.url)
    assert client.is_model_ready("decoupled")
    stats = client.get_inference_statistics("decoupled").model_stats[0]
    assert (stats.inference_count, stats.execution_count) == (2, 2), stats


def test_the_log_gives_the_warmup_time(warmed: tuple[Server, Path]) -> None:
    server, _ = warmed
    log = server.log()
    for name in ("counting", "batched", "onnx", "onnx_batch", "decoupled"):
        assert f"model '{name}' version 1 warmed up in " in log, log


def test_a_failing_sample_fails_the_load_with_tritons_text(tmp_path: Path) -> None:
    """Each failure is the version's reason in RepositoryIndex, Triton's text: an execution that fails
    ("failed to run warmup sample '<s>': <error>; "), a file too short, dims the model refuses, a wildcard
    dim, a sample without data, a missing file, a sample without the model's inputs; the other models load."""
    repository = tmp_path / "repository"
    zero = _input("INPUT", "TYPE_FP32", "[4]", "zero_data: true")
    interface = '''
        input [{ name: "INPUT", data_type: TYPE_FP32, dims: [4] }]
        output [{ name: "OUTPUT", data_type: TYPE_FP32, dims: [4] }]'''
    add_python_model(repository, "failing_infer", f'{interface}\nmodel_warmup [{_sample("zero sample", zero)}]',
                     FAILING)
    add_python_model(repository, "decoupled_fail", DECOUPLED_CONFIG, DECOUPLED)
    cases = {
        "short_file": _input("INPUT0", "TYPE_FP32", "[4]", 'input_data_file: "short"'),
        "wrong_dims": _input("INPUT0", "TYPE_FP32", "[3]", "zero_data: true"),
        "wildcard": _input("INPUT0", "TYPE_FP32", "[-1]", "zero_data: true"),
        "no_data": _input("INPUT0", "TYPE_FP32", "[4]", ""),
        "no_file": _input("INPUT0", "TYPE_FP32", "[4]", 'input_data_file: "absent"'),
        "undeclared": zero,  # not a model input: the request has none of the model's inputs
        "fine": _input("INPUT0", "TYPE_FP32", "[4]", "zero_data: true"),
    }
    for name, inputs in cases.items():
        folder = add_model(repository, name, identity_model(TensorProto.FLOAT, [4]), f'''
            name: "{name}" backend: "onnxruntime"
            model_warmup [{_sample("s", inputs)}]''')
        (folder / "warmup").mkdir()
        (folder / "warmup" / "short").write_bytes(bytes(8))
    server = start_server(repository, tmp_path / "logs", "--exit-on-error=false")
    try:
        client = grpcclient.InferenceServerClient(server.url)
        index = {m.name: (m.state, m.reason) for m in client.get_model_repository_index().models}
    finally:
        server.stop()
    unknown = "[request id: <id_unknown>] "
    assert index == {
        "failing_infer": ("UNAVAILABLE", "failed to run warmup sample 'zero sample': An Error Occurred; "),
        "decoupled_fail": ("UNAVAILABLE", "failed to run warmup sample 'd': bad stream; "),
        "short_file": ("UNAVAILABLE", f"{unknown}warmup setting expects 16 bytes, but the data provided from "
                                      "shortonly has 8 bytes"),
        "wrong_dims": ("UNAVAILABLE", f"{unknown}unexpected shape for input 'INPUT0' for model 'wrong_dims'. "
                                      "Expected [4], got [3]"),
        "wildcard": ("UNAVAILABLE", "warmup setting expects all variable-size dimensions are specified for "
                                    "input 'INPUT0'"),
        "no_data": ("UNAVAILABLE", f"{unknown}warmup setting expects input 'INPUT0' to have input_data_type set"),
        "no_file": ("UNAVAILABLE", "failed to open text file for read <model folder>/warmup/absent: "
                                   "No such file or directory"),
        "undeclared": ("UNAVAILABLE", f"{unknown}expected 1 inputs but got 0 inputs for model 'undeclared'. Got "
                                      "input(s) [], but missing required input(s) ['INPUT0']. Please provide all "
                                      "required input(s)."),
        "fine": ("READY", ""),
    }, index
