"""Triton's ensembles through real servers and unmodified tritonclient: outputs, statistics of the
ensemble and its steps, batching of steps, readiness, unload_dependents, and load errors naming the step."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from helpers import add_model, make_model, metrics_text, start_server
from pbtxt import ensemble_step

A = np.linspace(-3, 3, 32, dtype=np.float32).reshape(2, 16)
B = np.full((2, 16), 1.4, np.float32)


def _stats(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model).model_stats[0]
    return stats.inference_count, stats.inference_stats.success.count


def _inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    tensors = [module.InferInput("INPUT0", list(a.shape), "FP32"), module.InferInput("INPUT1", list(b.shape), "FP32")]
    tensors[0].set_data_from_numpy(a)
    tensors[1].set_data_from_numpy(b)
    return tensors


def test_example_ensemble_output_and_statistics(example_server) -> None:
    expected_sum = (np.round(A) + np.round(B)).astype(np.int32)
    expected_diff = (np.round(A) - np.round(B)).astype(np.int32)
    with grpcclient.InferenceServerClient(example_server.url) as client:
        before = {m: _stats(client, m) for m in ("simple_ensemble", "preprocess_round", "simple")}
        result = client.infer("simple_ensemble", _inputs(grpcclient, A, B))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected_sum)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), expected_diff)
        with httpclient.InferenceServerClient(example_server.http_url) as http:
            reply = http.infer("simple_ensemble", _inputs(httpclient, A[:1], B[:1]),
                               outputs=[httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)])
            np.testing.assert_array_equal(reply.as_numpy("OUTPUT1"), expected_diff[:1])
            config = http.get_model_config("simple_ensemble")
            assert config["platform"] == "ensemble"
            assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["preprocess_round", "simple"]
        after = {m: _stats(client, m) for m in before}
        metadata = client.get_model_metadata("simple_ensemble")
        assert client.is_model_ready("simple_ensemble")
    assert metadata.platform == "ensemble" and [t.datatype for t in metadata.inputs] == ["FP32", "FP32"]
    for model in before:  # the ensemble and each step: 3 rows in 2 successful requests
        assert after[model][0] - before[model][0] == 3, model
        assert after[model][1] - before[model][1] == 2, model
    metrics = metrics_text(example_server.metrics_port)
    for model in before:  # Triton's metrics see the steps too
        assert f'nv_inference_request_success{{model="{model}",version="1"}}' in metrics, model


def _add_sub(repository: Path, name: str, config: str = "max_batch_size: 8") -> None:
    shape = [None, 4]
    add_model(repository, name, make_model(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]), helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        [("INPUT0", TensorProto.FLOAT, shape), ("INPUT1", TensorProto.FLOAT, shape)],
        [("OUTPUT0", TensorProto.FLOAT, shape), ("OUTPUT1", TensorProto.FLOAT, shape)]), config)


def _ensemble(repository: Path, name: str, steps: list[tuple[str, dict[str, str], dict[str, str]]],
              inputs: tuple[str, ...] = ("A", "B"), outputs: tuple[str, ...] = ("S",),
              datatype: str = "TYPE_FP32") -> None:
    def tensors(names: tuple[str, ...]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: {datatype} dims: [ 4 ] }}' for n in names)

    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        f'platform: "ensemble"\nmax_batch_size: 8\ninput [ {tensors(inputs)} ]\noutput [ {tensors(outputs)} ]\n'
        f'ensemble_scheduling {{ step [ {", ".join(ensemble_step(*s) for s in steps)} ] }}\n')


@pytest.fixture(scope="module")
def ensembles(tmp_path_factory):
    """An explicit-mode server with good and broken ensembles over small add/sub models."""
    repository = tmp_path_factory.mktemp("repo")
    _add_sub(repository, "add_sub")
    _add_sub(repository, "batched", "max_batch_size: 8\ninstance_group [{ kind: KIND_CPU count: 1 }]\n"
                                    "dynamic_batching { preferred_batch_size: [4] max_queue_delay_microseconds: 10000000 }")
    # S = (A + B) + (A - B) = 2A, through two steps
    _ensemble(repository, "chain", [("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "sum", "OUTPUT1": "diff"}),
                                    ("batched", {"INPUT0": "sum", "INPUT1": "diff"}, {"OUTPUT0": "S", "OUTPUT1": "unused_d"})],
              outputs=("S", "unused_d"))
    _ensemble(repository, "unknown_step", [("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "t", "OUTPUT1": "u"}),
                                           ("missing", {"INPUT0": "t", "INPUT1": "u"}, {"OUTPUT0": "S"})])
    _ensemble(repository, "wrong_name", [("add_sub", {"INPUT0": "A", "WRONG": "B"}, {"OUTPUT0": "S"})])
    _ensemble(repository, "wrong_type", [("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "S"})],
              datatype="TYPE_INT32")
    _ensemble(repository, "cycle", [("add_sub", {"INPUT0": "A", "INPUT1": "y"}, {"OUTPUT0": "x"}),
                                    ("add_sub", {"INPUT0": "x", "INPUT1": "B"}, {"OUTPUT0": "y", "OUTPUT1": "S"})])
    _ensemble(repository, "written_twice", [("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "S"}),
                                            ("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "S"})])
    _ensemble(repository, "unused_input", [("add_sub", {"INPUT0": "A", "INPUT1": "A"}, {"OUTPUT0": "S"})])
    _ensemble(repository, "loop_a", [("loop_b", {"A": "A", "B": "B"}, {"S": "S"})])
    _ensemble(repository, "loop_b", [("loop_a", {"A": "A", "B": "B"}, {"S": "S"})])
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit")
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("name, text", [
    ("unknown_step", "ensemble 'unknown_step' depends on 'missing' which has no loaded version (step 1)"),
    ("wrong_name", "ensemble 'wrong_name' step 0 (model 'add_sub'): the model has no input 'WRONG'"),
    ("wrong_type", "ensemble 'wrong_type' step 0 (model 'add_sub'): ensemble tensor 'A' is INT32 but the model's "
                   "input 'INPUT0' is FP32"),
    ("cycle", "ensemble 'cycle' step 0 (model 'add_sub') can never run: its input tensors ['y']"),
    ("written_twice", "ensemble tensor 'S' can appear in an output map only once for ensemble 'written_twice' step 1"),
    ("unused_input", "ensemble input 'B' for ensemble unused_input' is not used"),
    ("loop_a", "ensemble 'loop_b' step 0: model 'loop_a' is an ensemble that depends on 'loop_b' (circular dependency"),
])
def test_ensemble_load_errors_name_the_step(ensembles, name: str, text: str) -> None:
    with grpcclient.InferenceServerClient(ensembles.url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.load_model(name)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert err.value.message().startswith(f"load failed for model '{name}': ")
        assert text in err.value.message()
        assert not client.is_model_ready(name)
    assert ensembles.proc.poll() is None


def test_ensemble_loads_its_steps_batches_them_and_is_ready_only_with_them(ensembles) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)

    async def four_requests() -> list[np.ndarray]:
        async with aioclient.InferenceServerClient(ensembles.url) as client:
            results = await asyncio.gather(*(client.infer("chain", _named(aioclient, a + i, a)) for i in range(4)))
        return [r.as_numpy("S") for r in results]

    with grpcclient.InferenceServerClient(ensembles.url) as client:
        client.load_model("chain")  # loads add_sub and batched first, as Triton does
        assert client.is_model_ready("chain") and client.is_model_ready("add_sub") and client.is_model_ready("batched")
        for i, out in enumerate(asyncio.run(four_requests())):
            np.testing.assert_array_equal(out, 2 * (a + i))
        batched = client.get_inference_statistics("batched").model_stats[0]
        assert batched.inference_count == 4 and batched.execution_count == 1  # the steps met in one dynamic batch
        assert [(b.batch_size, b.compute_infer.count) for b in batched.batch_stats] == [(4, 1)]
        client.unload_model("batched")
        assert not client.is_model_ready("chain")  # a step is gone: the ensemble is not ready
        with pytest.raises(InferenceServerException, match="batched"):
            client.infer("chain", _named(grpcclient, a, a))
        client.load_model("batched")
        assert client.is_model_ready("chain")
        client.unload_model("chain", unload_dependents=True)
        assert not any(client.is_model_ready(m) for m in ("chain", "add_sub", "batched"))


def _named(module, a: np.ndarray, b: np.ndarray) -> list:
    tensors = [module.InferInput("A", list(a.shape), "FP32"), module.InferInput("B", list(b.shape), "FP32")]
    tensors[0].set_data_from_numpy(a)
    tensors[1].set_data_from_numpy(b)
    return tensors
