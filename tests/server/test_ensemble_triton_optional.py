"""Ensembles over models with optional inputs, as Triton 2.51's ``qa/L0_optional_input`` has them, through a
real server and unmodified tritonclient.

- The dynamic batcher (``test_optional_mix_inputs``, ``test_ensemble_optional_mix_inputs``,
  ``test_ensemble_all_inputs``): an ensemble's step request meets its model's scheduler as any request
  does. Requests that give different optional inputs do not batch together (Triton's
  ``RequiredEqualInputs``): a queued request is sent as soon as one with other inputs arrives, the last
  one waits the queue delay; requests with the same inputs wait the delay and run as one batch. The step
  model here is an ONNX stand-in for the qa's ``identity`` backend (``Identity`` nodes, each optional input
  a graph input with an initializer).
- A step output its model does not produce (``test_ensemble_optional_connecting_tensor``): Triton's
  ensemble scheduler puts an empty placeholder for it (``ensemble_scheduler.cc``), so a later step that
  takes it as an optional input runs without it; a required input left without it fails that step with its
  model's missing-input error; a requested ensemble output left without it is missing from the response.
  The step model is the qa's python ``optional_identity``, which answers only the outputs of the inputs it
  was given.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from helpers import Server, add_model, add_python_model, make_model, pending, start_server, wait_until
from pbtxt import ensemble_step

DELAY_S = 0.8  # the step model's max_queue_delay
OPTIONAL = "data_type: TYPE_FP32 dims: [ 1 ] optional: true"
OUTPUT = "data_type: TYPE_FP32 dims: [ 1 ]"
TWO_IN_TWO_OUT = (f'max_batch_size: 4 input [{{ name: "INPUT0" {OPTIONAL} }}, {{ name: "INPUT1" {OPTIONAL} }}]\n'
                  f'output [{{ name: "OUTPUT0" {OUTPUT} }}, {{ name: "OUTPUT1" {OUTPUT} }}]\n')
BATCHER = f'dynamic_batching {{ preferred_batch_size: [ 4 ] max_queue_delay_microseconds: {int(DELAY_S * 1e6)} }}\n'
# the qa's optional_identity: OUTPUTi for each INPUTi given, no other output
OPTIONAL_IDENTITY = '''
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                outputs = []
                for index in ("0", "1"):
                    given = pb_utils.get_input_tensor_by_name(request, "INPUT" + index)
                    if given is not None:
                        outputs.append(pb_utils.Tensor("OUTPUT" + index, given.as_numpy()))
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
'''
# the identity backend's behaviour in python: OUTPUTi = INPUTi, zeros for an input not given
PYTHON_IDENTITY = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                given = {i: pb_utils.get_input_tensor_by_name(request, "INPUT" + i) for i in ("0", "1")}
                rows = next(t.as_numpy().shape[0] for t in given.values() if t is not None)
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT" + i, t.as_numpy() if t is not None else np.zeros((rows, 1), np.float32))
                    for i, t in given.items()]))
            return responses
'''


def _onnx_identity() -> bytes:
    """OUTPUTi = Identity(INPUTi), FP32 [-1, 1], each input with an initializer (optional)."""
    model = make_model([helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]) for i in (0, 1)],
                       [(f"INPUT{i}", TensorProto.FLOAT, [None, 1]) for i in (0, 1)],
                       [(f"OUTPUT{i}", TensorProto.FLOAT, [None, 1]) for i in (0, 1)])
    for i in (0, 1):
        model.graph.initializer.append(helper.make_tensor(f"INPUT{i}", TensorProto.FLOAT, [1, 1], [0.0]))
    return model.SerializeToString()


def _ensemble(repository, name: str, steps: list[tuple[str, dict[str, str], dict[str, str]]]) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}" platform: "ensemble"\n{TWO_IN_TWO_OUT}'
                                         f'ensemble_scheduling {{ step [ {", ".join(ensemble_step(*s) for s in steps)} ] }}\n')


BOTH = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
BOTH_OUT = {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("ensemble_optional")
    repository = root / "models"
    for name in ("identity_mix", "identity_mix_ensembled", "identity_all", "identity_all_ensembled"):
        add_model(repository, name, _onnx_identity(), f'name: "{name}"\n{TWO_IN_TWO_OUT}{BATCHER}')
    add_python_model(repository, "python_identity_mix_ensembled", TWO_IN_TWO_OUT + BATCHER, PYTHON_IDENTITY)
    for step in ("identity_mix_ensembled", "identity_all_ensembled", "python_identity_mix_ensembled"):
        _ensemble(repository, f"ensemble_of_{step}", [(step, BOTH, BOTH_OUT)])  # qa's ensemble_identity_2_float32
    add_python_model(repository, "optional_identity", TWO_IN_TWO_OUT, OPTIONAL_IDENTITY)
    add_python_model(repository, "required_identity", TWO_IN_TWO_OUT.replace(" optional: true", ""), OPTIONAL_IDENTITY)
    _ensemble(repository, "optional_connecting_tensor", [
        ("optional_identity", BOTH, {"OUTPUT0": "internal_output0", "OUTPUT1": "internal_output1"}),
        ("optional_identity", {"INPUT0": "internal_output0", "INPUT1": "internal_output1"}, BOTH_OUT)])
    _ensemble(repository, "required_connecting_tensor", [
        ("optional_identity", BOTH, {"OUTPUT0": "internal_output0", "OUTPUT1": "internal_output1"}),
        ("required_identity", {"INPUT0": "internal_output0", "INPUT1": "internal_output1"}, BOTH_OUT)])
    running = start_server(repository, root / "logs")
    yield running
    assert running.stop() == 0


def _inputs(provided: tuple[str, ...]) -> list[grpcclient.InferInput]:
    inputs = []
    for name in provided:
        tensor = grpcclient.InferInput(name, [1, 1], "FP32")
        tensor.set_data_from_numpy(np.full((1, 1), 1.0 if name == "INPUT0" else 2.0, np.float32))
        inputs.append(tensor)
    return inputs


def _outputs(provided: tuple[str, ...]) -> list[grpcclient.InferRequestedOutput]:
    return [grpcclient.InferRequestedOutput(name.replace("INPUT", "OUTPUT")) for name in provided]


def _batches(client: grpcclient.InferenceServerClient, model: str) -> tuple[dict[int, int], int, int]:
    """(batch size -> executions, successful requests, inferences) of a model so far."""
    stats = client.get_inference_statistics(model, "1").model_stats[0]
    return ({b.batch_size: b.compute_infer.count for b in stats.batch_stats}, stats.inference_stats.success.count,
            stats.inference_count)


class _Sent:
    """One request sent with ``async_infer``: its answer (or error) and the seconds it took."""

    def __init__(self, client: grpcclient.InferenceServerClient, model: str, provided: tuple[str, ...]) -> None:
        self.provided = provided
        self._answers: queue.Queue[tuple[object, object, float]] = queue.Queue()
        self.answered = False
        started = time.monotonic()
        def done(result: object, error: object) -> None:
            self._answers.put((result, error, time.monotonic() - started))
            self.answered = True

        client.async_infer(model, _inputs(provided), done, outputs=_outputs(provided))

    def answer(self) -> float:
        """The seconds it took; fails on an error or wrong outputs."""
        result, error, seconds = self._answers.get(timeout=60)
        assert error is None, error
        for name in self.provided:
            expected = 1.0 if name == "INPUT0" else 2.0
            assert result.as_numpy(name.replace("INPUT", "OUTPUT")).tolist() == [[expected]]  # type: ignore[attr-defined]
        return seconds


@pytest.mark.parametrize("model, step", [
    ("identity_mix", "identity_mix"),
    ("ensemble_of_identity_mix_ensembled", "identity_mix_ensembled"),
    ("ensemble_of_python_identity_mix_ensembled", "python_identity_mix_ensembled"),
])
@pytest.mark.parametrize("sequence", [
    pytest.param((("INPUT0",), ("INPUT1",), ("INPUT0",), ("INPUT1",)), id="mix_inputs"),
    pytest.param((("INPUT0",), ("INPUT0", "INPUT1"), ("INPUT0",), ("INPUT0", "INPUT1")), id="mix_inputs_2"),
])
def test_a_request_with_other_optional_inputs_sends_the_queued_one_at_once(
        server: Server, model: str, step: str, sequence: tuple[tuple[str, ...], ...]) -> None:
    """Each request is sent once the one before it is queued at the step model: that one is answered at
    once (well before the queue delay), the last one after the delay; each ran alone."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    batches, requests, inferences = _batches(client, step)
    sent: list[_Sent] = []
    took: list[float] = []
    for provided in sequence:
        if sent:  # the one before is queued at the step model (or, batched with another, answered already)
            wait_until(lambda: pending(server, step) >= 1 or sent[-1].answered, "the request queued")
        sent.append(_Sent(client, model, provided))
        if len(sent) > 1:
            took.append(sent[-2].answer())
    took.append(sent[-1].answer())
    assert all(seconds < DELAY_S for seconds in took[:-1]), took
    assert took[-1] >= DELAY_S * 0.95, took
    after = _batches(client, step)
    assert (after[0].get(1, 0) - batches.get(1, 0), after[1] - requests, after[2] - inferences) == (4, 4, 4)
    assert set(after[0]) - set(batches) <= {1}  # no larger batch was formed


@pytest.mark.parametrize("model, step", [("identity_all", "identity_all"),
                                         ("ensemble_of_identity_all_ensembled", "identity_all_ensembled")])
def test_requests_with_the_same_inputs_wait_the_queue_delay_and_batch_together(server: Server, model: str,
                                                                               step: str) -> None:
    """Two requests giving every input, fewer than the preferred batch size: both wait the queue delay at
    the step model and run as one batch of 2 (the qa's test_all_inputs, test_ensemble_all_inputs)."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    batches, requests, _ = _batches(client, step)
    sent = [_Sent(client, model, ("INPUT0", "INPUT1")) for _ in range(2)]
    took = [one.answer() for one in sent]
    assert min(took) >= DELAY_S * 0.95, took
    after = _batches(client, step)
    assert (after[0].get(2, 0) - batches.get(2, 0), after[1] - requests) == (1, 2)


def test_an_output_a_step_does_not_produce_leaves_out_the_optional_input_it_feeds(server: Server) -> None:
    """INPUT0 alone: the first step makes internal_output0 only, the second runs with INPUT0 alone (the qa's
    test_ensemble_optional_connecting_tensor)."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    result = client.infer("optional_connecting_tensor", _inputs(("INPUT0",)), outputs=_outputs(("INPUT0",)))
    assert result.as_numpy("OUTPUT0").tolist() == [[1.0]]


def test_an_output_not_produced_fails_a_required_input_and_is_left_out_of_the_ensembles_response(
        server: Server) -> None:
    """Triton: the step whose required input is left without the tensor fails with its model's text for a
    missing input (INVALID_ARGUMENT); an ensemble output left without it is not in the response."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    result = client.infer("optional_connecting_tensor", _inputs(("INPUT0",)), outputs=_outputs(("INPUT0", "INPUT1")))
    assert result.as_numpy("OUTPUT0").tolist() == [[1.0]] and result.as_numpy("OUTPUT1") is None
    with pytest.raises(InferenceServerException) as failed:
        client.infer("required_connecting_tensor", _inputs(("INPUT0",)), outputs=_outputs(("INPUT0",)))
    assert failed.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "expected 2 inputs but got 1 inputs for model 'required_identity'" in failed.value.message()
