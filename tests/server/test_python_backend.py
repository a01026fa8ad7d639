"""Triton python-backend models through a real server and unmodified tritonclient (gRPC and HTTP):
a model written for Triton (ONNX Runtime called from model.py, numpy pre- and post-processing,
string tensors, auto_complete_config), the dynamic batcher handing execute several requests, errors
in initialize (a load error naming the model) and in execute (Triton's text; the model serves on),
the refused EXECUTION_ENV_PATH, execute kept off the event loop, business logic scripting (a cycle
refused by the request's depth or its callers' instances), and the example repository's python
models. Decoupled models: ``test_decoupled.py``; the generate routes: ``test_generate.py``."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from helpers import (PIPELINE, PYTHON_MODES, SENTENCES, Server, TextModels, add_python_model, cosines, make_model,
                     metric, python_mode, scrape, start_server)

TRITON_STYLE = '''
    """A model as Triton users keep them: ONNX Runtime called from model.py, numpy around it, strings."""
    import json
    import os

    import numpy as np
    import onnxruntime as ort
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            auto_complete_model_config.add_input({"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]})
            auto_complete_model_config.add_output({"name": "SCALED", "data_type": "TYPE_FP32", "dims": [-1]})
            auto_complete_model_config.add_output({"name": "LABEL", "data_type": "TYPE_STRING", "dims": [-1]})
            auto_complete_model_config.set_max_batch_size(0)
            return auto_complete_model_config

        def initialize(self, args):
            self.config = json.loads(args["model_config"])
            self.args = args
            folder = os.path.join(args["model_repository"], args["model_version"])
            assert folder == pb_utils.get_model_dir(), (folder, pb_utils.get_model_dir())
            self.session = ort.InferenceSession(os.path.join(folder, "scale.onnx"), providers=["CPUExecutionProvider"])
            self.scaled_dtype = pb_utils.triton_string_to_numpy(
                pb_utils.get_output_config_by_name(self.config, "SCALED")["data_type"])

        def execute(self, requests):
            responses = []
            for request in requests:
                texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
                numbers = np.array([float(t.decode()) for t in texts], dtype=np.float32)  # pre-processing
                (scaled,) = self.session.run(None, {"X": numbers})
                labels = np.array([b"big" if v > 10 else b"small" for v in scaled], dtype=np.object_)  # post
                pb_utils.Logger.log_info(f"scaled {len(scaled)} numbers for {request.request_id()!r}")
                info = json.dumps({"id": request.request_id(), "parameters": json.loads(request.parameters()),
                                   "kind": self.args["model_instance_kind"], "name": self.args["model_name"],
                                   "outputs": request.requested_output_names()})
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("SCALED", scaled.astype(self.scaled_dtype)),
                    pb_utils.Tensor("LABEL", np.append(labels, info.encode()))]))
            return responses
'''
BATCHED = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("BATCH", np.full((1, 1), len(requests), np.int32))]) for _ in requests]
'''
FAILING = '''
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            if args["model_name"] == "init_fails":
                raise ValueError("no weights here")

        def execute(self, requests):
            value = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
            if value[0] < 0:
                raise ValueError("a negative number")
            if value[0] > 1000:
                time.sleep(float(value[0]) / 1000)  # a slow model: the event loop must not wait for it
            return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", value * 2)])]
'''
# calls itself through BLS until the server refuses, then answers with the refusal
CYCLE = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.name = args["model_name"]

        def execute(self, requests):
            depth = pb_utils.get_input_tensor_by_name(requests[0], "DEPTH").as_numpy()
            answer = pb_utils.InferenceRequest(model_name=self.name, requested_output_names=["DEPTH_OUT"],
                                               inputs=[pb_utils.Tensor("DEPTH", depth + 1)]).exec()
            if answer.has_error():
                return [pb_utils.InferenceResponse(error=answer.error())]
            return [pb_utils.InferenceResponse(output_tensors=answer.output_tensors())]
'''
def _repository(root: Path) -> Path:
    repository = root / "models"
    folder = add_python_model(repository, "triton_style", 'instance_group [{ kind: KIND_CPU count: 1 }]', TRITON_STYLE)
    scale = make_model([helper.make_node("Mul", ["X", "two"], ["doubled"]), helper.make_node("Add", ["doubled", "one"], ["Y"])],
                       [("X", TensorProto.FLOAT, [None])], [("Y", TensorProto.FLOAT, [None])])
    scale.graph.initializer.extend([helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
                                    helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    (folder / "1" / "scale.onnx").write_bytes(scale.SerializeToString())
    add_python_model(repository, "batched", 'max_batch_size: 8\n'
                     'input [{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }]\n'
                     'output [{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }]\n'
                     'instance_group [{ count: 1 }]\n'
                     'dynamic_batching { max_queue_delay_microseconds: 200000 }', BATCHED)
    tensors = ('input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
               'output [{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }]\ninstance_group [{ count: 1 }]')
    add_python_model(repository, "execute_fails", tensors, FAILING)
    add_python_model(repository, "init_fails", tensors, FAILING)
    add_python_model(repository, "env_path", tensors + '\nparameters { key: "EXECUTION_ENV_PATH" value: '
                     '{ string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }', FAILING)
    cycle = ('input [{ name: "DEPTH" data_type: TYPE_INT32 dims: [ 1 ] }]\n'
             'output [{ name: "DEPTH_OUT" data_type: TYPE_INT32 dims: [ 1 ] }]\n')
    add_python_model(repository, "cycle", cycle + 'instance_group [{ count: 1 }]', CYCLE)
    add_python_model(repository, "deep_cycle", cycle + 'instance_group [{ count: 20 }]', CYCLE)
    return repository


LOADED = ("triton_style", "batched", "execute_fails", "cycle", "deep_cycle")


@pytest.fixture(scope="module", params=PYTHON_MODES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("python_backend")
    loads = [arg for name in LOADED for arg in ("--load-model", name)]
    running = start_server(_repository(root), root / "logs", "--model-control-mode", "explicit", *loads,
                           *python_mode(request.param))
    yield running
    assert running.stop() == 0


def _text(client_module, values: list[bytes]):
    tensor = client_module.InferInput("TEXT", [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=np.object_))
    return tensor


def _number(client_module, name: str, value, dtype=np.float32, shape=(1,)):
    tensor = client_module.InferInput(name, list(shape), {np.float32: "FP32", np.int32: "INT32"}[dtype])
    tensor.set_data_from_numpy(np.full(shape, value, dtype))
    return tensor


@pytest.mark.parametrize("module", [grpcclient, httpclient])
def test_a_model_written_for_triton_runs_unchanged(server: Server, module) -> None:
    url = server.url if module is grpcclient else server.http_url
    with module.InferenceServerClient(url) as client:
        result = client.infer("triton_style", [_text(module, [b"1.5", b"7"])], request_id="req-1",
                              parameters={"temperature": 3})
        config = client.get_model_config("triton_style")
    np.testing.assert_array_equal(result.as_numpy("SCALED"), np.array([4.0, 15.0], np.float32))
    labels = result.as_numpy("LABEL")
    assert list(labels[:2]) == [b"small", b"big"]
    info = json.loads(labels[2])
    assert info == {"id": "req-1", "parameters": {"temperature": 3}, "kind": "CPU", "name": "triton_style",
                    "outputs": ["SCALED", "LABEL"]}
    # auto_complete_config filled the tensors config.pbtxt left out
    config = config.config if module is grpcclient else config
    assert config is not None
    names = [t.name for t in config.input] if module is grpcclient else [t["name"] for t in config["input"]]
    assert names == ["TEXT"]
    assert "scaled 2 numbers for 'req-1'" in server.log()


def test_the_dynamic_batcher_hands_execute_several_requests(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        before = client.get_inference_statistics("batched").model_stats[0]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda n: client.infer("batched", [_number(grpcclient, "X", n, np.int32, (1, 1))]),
                                    range(6)))
        after = client.get_inference_statistics("batched").model_stats[0]
    sizes = [int(r.as_numpy("BATCH")[0][0]) for r in results]
    assert max(sizes) > 1, sizes  # the 200 ms queue delay gathers them
    assert after.inference_count - before.inference_count == 6
    assert after.execution_count - before.execution_count < 6


def test_an_error_in_initialize_fails_the_load_naming_the_model(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("init_fails")
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("env_path")
    assert "load failed for model 'init_fails'" in raised.value.message()
    assert "python model 'init_fails' instance 'init_fails_0_0' failed to initialize: ValueError: no weights here" \
        in raised.value.message()
    # an EXECUTION_ENV_PATH that names no file: Triton's text (a real environment: test_python_execution_env)
    assert "Failed to get the canonical path for <model folder>/env.tar.gz." in refused.value.message()


@pytest.mark.parametrize("module", [grpcclient, httpclient])
def test_an_error_in_execute_fails_the_request_and_the_model_serves_on(server: Server, module) -> None:
    url = server.url if module is grpcclient else server.http_url
    with module.InferenceServerClient(url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("execute_fails", [_number(module, "X", -1.0)])
        good = client.infer("execute_fails", [_number(module, "X", 4.0)])
    assert raised.value.message() == ("Failed to process the request(s) for model 'execute_fails_0_0', message: "
                                      "ValueError: a negative number")
    assert str(raised.value.status()) == ("StatusCode.INTERNAL" if module is grpcclient else "500")
    np.testing.assert_array_equal(good.as_numpy("Y"), [8.0])
    assert metric(scrape(server.metrics_port), "nv_inference_request_failure", model="execute_fails", version="1",
                  reason="BACKEND") >= 1


def test_execute_runs_off_the_event_loop(server: Server) -> None:
    """While an instance sleeps 3 s in execute, other requests are answered at once."""
    with grpcclient.InferenceServerClient(server.url) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(client.infer, "execute_fails", [_number(grpcclient, "X", 3000.0)])
        time.sleep(0.3)  # let it start (its instance is then busy for 3 s)
        began = time.monotonic()
        fast = client.infer("triton_style", [_text(grpcclient, [b"1"])])
        waited = time.monotonic() - began
        np.testing.assert_array_equal(slow.result(timeout=60).as_numpy("Y"), [6000.0])
    assert fast.as_numpy("SCALED")[0] == 3.0
    assert waited < 2.0, waited


@pytest.mark.parametrize(("model", "refusal"), [
    ("cycle", "model 'cycle' is called by its own execution (cycle -> cycle) while its callers hold all 1 of its "
              "instances: the request would wait for itself forever"),
    ("deep_cycle", "business logic scripting calls nest deeper than 16 requests"),
])
def test_a_bls_cycle_is_refused_by_the_request_depth_instead_of_hanging(server: Server, model: str, refusal: str) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.infer(model, [_number(grpcclient, "DEPTH", 0, np.int32)], client_timeout=60)
        assert client.is_model_ready(model)
    assert refusal in raised.value.message()
    assert str(raised.value.status()) == "StatusCode.INVALID_ARGUMENT"


def test_the_example_python_models(example_server: Server) -> None:
    """simple_python (numpy), bls_simple (async BLS to an ONNX and a python model) over gRPC and HTTP."""
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 3, np.int32)
    for module, url in ((grpcclient, example_server.url), (httpclient, example_server.http_url)):
        with module.InferenceServerClient(url) as client:
            for model in ("simple_python", "bls_simple"):
                inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(b)
                result = client.infer(model, inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    with grpcclient.InferenceServerClient(example_server.url) as client:
        stats = {s.name: s for s in client.get_inference_statistics("").model_stats}
    assert stats["simple"].inference_count >= 2  # bls_simple's calls are requests the server counts


def test_the_text_pipeline_example_turns_text_into_embeddings(text_models: TextModels, tmp_path: Path) -> None:
    """examples/text_pipeline as `make models` installs it: a python tokenizer, MiniLM on ONNX Runtime
    and a python pooling step in the ensemble minilm_embed give MiniLM's reference cosines."""
    repository = text_models.link_into(tmp_path / "models", PIPELINE)
    server = start_server(repository, tmp_path / "logs")
    try:
        text = grpcclient.InferInput("TEXT", [len(SENTENCES)], "BYTES")
        text.set_data_from_numpy(np.array([s.encode() for s in SENTENCES], dtype=np.object_))
        with grpcclient.InferenceServerClient(server.url) as client:
            embeddings = client.infer("minilm_embed", [text]).as_numpy("EMBEDDING")
            stats = {s.name: s.inference_count for s in client.get_inference_statistics("").model_stats}
    finally:
        assert server.stop() == 0
    assert embeddings.shape == (3, 384)
    np.testing.assert_allclose(cosines(embeddings), text_models.reference["minilm_embed"], atol=5e-4)
    assert stats["minilm_tokenize"] == stats["minilm_pool"] == stats["minilm_onnx"] == 1  # each step a request
