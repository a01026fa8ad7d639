"""The ensemble scheduler (kserve_v2.scheduling.ensemble_scheduler) in-process, its steps answered by fakes of
the server's inference and stream calls: each step is a request of the wire codec's objects, validated by the
request decoder against its model as the server validates it, its tensors passed as read-only views (never
serialized); the steps the requested outputs need run, those ready together concurrently; batch dims added
and removed between batching and non-batching models (Triton's ``ReshapeTensorDims``); an optional input
left out and an output a step's model did not produce left out of the next step's request (Triton's
``ensemble_scheduler.cc``: an empty placeholder for the missing output, which may feed an optional input);
and a decoupled step's responses each running the steps after it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import RequestContext
from kserve_v2.backend.decoupled import ResponseStream, Streamed
from kserve_v2.codec.messages import InferRequest, InferResponse, OutputTensor
from kserve_v2.protocol import datatypes
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.protocol.model_spec import ModelSpec
from kserve_v2.protocol.statistics import RequestReport
from kserve_v2.protocol.tensors import as_buffer
from kserve_v2.request.decode import decode_request
from kserve_v2.scheduling.ensemble import check_config, plan
from kserve_v2.scheduling.ensemble_scheduler import EnsembleScheduler
from tests.pbtxt import ensemble_step

ANY = "data_type: TYPE_FP32 dims: [ -1 ]"
OPTIONAL = "data_type: TYPE_FP32 dims: [ 1 ] optional: true"
Compute = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def _spec(text: str) -> ModelSpec:
    return ModelSpec.from_config(text_format.Parse(text, mc.ModelConfig()))


# each step model: its interface, and what it answers (an output it leaves out is not produced)
MODELS: dict[str, tuple[ModelSpec, Compute]] = {
    "double": (_spec(f'name: "double" input [{{ name: "X" {ANY} }}] output [{{ name: "Y" {ANY} }}]'),
               lambda feeds: {"Y": feeds["X"] * 2}),
    "plus": (_spec(f'name: "plus" input [{{ name: "X" {ANY} }}, {{ name: "Z" {ANY} optional: true }}] '
                   f'output [{{ name: "Y" {ANY} }}]'),
             lambda feeds: {"Y": feeds["X"] + 100 + feeds.get("Z", 0)}),
    # Triton's qa optional_identity: OUTPUTi for each INPUTi given, no other output
    "optional_identity": (_spec(f'name: "optional_identity" max_batch_size: 4 input [{{ name: "INPUT0" {OPTIONAL} }}, '
                                f'{{ name: "INPUT1" {OPTIONAL} }}] output [{{ name: "OUTPUT0" data_type: TYPE_FP32 '
                                'dims: [ 1 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] }]'),
                          lambda feeds: {f"OUTPUT{name[-1]}": array for name, array in feeds.items()}),
    "fails": (_spec(f'name: "fails" input [{{ name: "X" {ANY} }}] output [{{ name: "Y" {ANY} }}]'),
              lambda feeds: {}),
}


class Server:
    """The server's inference call for the steps: each request decoded against its model as the
    service decodes it, answered with its model's outputs as raw views."""

    def __init__(self) -> None:
        self.requests: list[InferRequest] = []
        self.feeds: list[dict[str, np.ndarray]] = []
        self.gate: asyncio.Event | None = None  # when set: every step waits for it
        self.together = asyncio.Event()  # set once two steps run at the same time
        self.running = 0
        self.most_running = 0

    async def infer(self, request: InferRequest) -> tuple[InferResponse, RequestReport]:
        self.requests.append(request)
        spec, compute = MODELS[request.model_name]
        if request.model_name == "fails":
            raise InvalidInput("the step's model refuses it")
        decoded = decode_request(request, spec)
        self.feeds.append(decoded.feeds)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        if self.running == 2:
            self.together.set()
        if self.gate is not None:
            await self.gate.wait()
        self.running -= 1
        return _response(request.model_name, compute(decoded.feeds), decoded.output_names), _report()


def _response(model: str, produced: dict[str, np.ndarray], requested: list[str] | tuple[str, ...]) -> InferResponse:
    names = [name for name in requested if name in produced]
    return InferResponse(model, "1", "", None, [OutputTensor(n, "FP32", produced[n].shape) for n in names],
                         [as_buffer(np.asarray(produced[n], np.float32), datatypes.BY_V2["FP32"]) for n in names])


def _report() -> RequestReport:
    return RequestReport(1, 1, 0, 0, 0, 0, 0, 0)


def _ensemble(steps: list[tuple[str, dict[str, str], dict[str, str]]], inputs: str, outputs: str,
              batch: int = 0) -> mc.ModelConfig:
    config = text_format.Parse(
        f'name: "ensemble" platform: "ensemble" max_batch_size: {batch} input [ {inputs} ] output [ {outputs} ] '
        f'ensemble_scheduling {{ step [ {", ".join(ensemble_step(*s) for s in steps)} ] }}', mc.ModelConfig())
    check_config(config)
    return config


def _scheduler(config: mc.ModelConfig, server: Server, decoupled: tuple[str, ...] = (),
               streamer: Callable[[InferRequest], AsyncGenerator[Streamed, None]] | None = None) -> EnsembleScheduler:
    steps = plan(config, lambda model, _: MODELS[model][0] if model in MODELS else STREAMED.get(model),
                 lambda model, _: model in decoupled)
    return EnsembleScheduler(config, steps, server.infer, streamer)


def _run(scheduler: EnsembleScheduler, feeds: dict[str, np.ndarray], outputs: list[str],
         parameters: dict[str, bool | int | float | str] | None = None, batch: int = 0) -> list[np.ndarray]:
    execution, queue_ns, _ = asyncio.run(scheduler.submit(feeds, outputs, parameters or {}, batch))
    assert queue_ns == 0
    return execution.outputs


CHAIN = _ensemble([("double", {"X": "IN"}, {"Y": "doubled"}), ("plus", {"X": "doubled"}, {"Y": "OUT"})],
                  f'{{ name: "IN" {ANY} }}', f'{{ name: "OUT" {ANY} }}')


def test_each_step_is_a_codec_request_to_its_model_with_the_ensemble_parameters() -> None:
    server = Server()
    out = _run(_scheduler(CHAIN, server), {"IN": np.array([1, 2], np.float32)}, ["OUT"],
               {"sequence_id": 7, "tag": "a"})
    assert out[0].tolist() == [102, 104]
    first, second = server.requests
    assert (first.model_name, first.model_version, second.model_name) == ("double", "", "plus")
    assert [(t.name, t.datatype, t.shape) for t in second.inputs] == [("X", "FP32", [2])]
    assert [o.name for o in second.outputs] == ["Y"]
    assert {k: v.value for k, v in second.parameters.items()} == {"sequence_id": 7, "tag": "a"}
    assert first.id == ""


def test_the_tensors_pass_as_read_only_views_not_copies() -> None:
    """A large tensor reaches the step's model as a view of the array that made it (no serialization), and
    the model cannot write into it (another step may read it too)."""
    server = Server()
    fed = np.arange(1 << 16, dtype=np.float32)
    out = _run(_scheduler(CHAIN, server), {"IN": fed}, ["OUT"])
    assert np.shares_memory(server.feeds[0]["X"], fed)
    assert not server.feeds[0]["X"].flags.writeable and not server.feeds[1]["X"].flags.writeable
    assert not out[0].flags.writeable
    assert out[0][:3].tolist() == [100, 102, 104]


def test_only_the_steps_the_requested_outputs_need_run_and_ready_steps_run_together() -> None:
    config = _ensemble([("double", {"X": "IN"}, {"Y": "A"}), ("plus", {"X": "IN"}, {"Y": "B"}),
                        ("plus", {"X": "A", "Z": "B"}, {"Y": "C"})], f'{{ name: "IN" {ANY} }}',
                       f'{{ name: "A" {ANY} }}, {{ name: "B" {ANY} }}, {{ name: "C" {ANY} }}')
    server = Server()
    assert _run(_scheduler(config, server), {"IN": np.array([1], np.float32)}, ["A"])[0].tolist() == [2]
    assert [r.model_name for r in server.requests] == ["double"]

    async def gated() -> list[np.ndarray]:
        server.gate = asyncio.Event()
        task = asyncio.ensure_future(_scheduler(config, server).submit({"IN": np.array([1], np.float32)}, ["C"], {}, 0))
        await asyncio.wait_for(server.together.wait(), 5)  # the two steps fed by IN wait for the gate together
        server.gate.set()
        execution, _, _ = await task
        return execution.outputs

    server = Server()
    assert asyncio.run(gated())[0].tolist() == [2 + 100 + 101]
    assert server.most_running == 2 and [r.model_name for r in server.requests] == ["double", "plus", "plus"]


def test_a_batching_step_gets_and_gives_back_the_batch_dim() -> None:
    """IN [1] from a non-batching ensemble gains a batch dim of 1 into optional_identity (max_batch_size 4), and
    OUTPUT0 [1, 1] loses it again on its way out (Triton's ReshapeTensorDims)."""
    config = _ensemble([("optional_identity", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})],
                       '{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }', '{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }')
    server = Server()
    out = _run(_scheduler(config, server), {"IN": np.array([5], np.float32)}, ["OUT"])
    assert server.requests[0].inputs[0].shape == [1, 1]
    assert out[0].shape == (1,) and out[0].tolist() == [5]


# Triton's qa/L0_optional_input optional_connecting_tensor: two optional_identity steps joined by both outputs
CONNECTING = _ensemble([("optional_identity", {"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
                         {"OUTPUT0": "internal_output0", "OUTPUT1": "internal_output1"}),
                        ("optional_identity", {"INPUT0": "internal_output0", "INPUT1": "internal_output1"},
                         {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})],
                       f'{{ name: "INPUT0" {OPTIONAL} }}, {{ name: "INPUT1" {OPTIONAL} }}',
                       '{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }, '
                       '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] }', batch=4)


def test_an_output_not_produced_is_left_out_of_the_next_step_that_takes_it_as_an_optional_input() -> None:
    server = Server()
    out = _run(_scheduler(CONNECTING, server), {"INPUT0": np.ones((1, 1), np.float32)}, ["OUTPUT0"], batch=1)
    assert out[0].tolist() == [[1]]
    first, second = server.requests
    assert [t.name for t in first.inputs] == ["INPUT0"] and [t.name for t in second.inputs] == ["INPUT0"]
    assert [o.name for o in first.outputs] == ["OUTPUT0", "OUTPUT1"]  # a step asks for every output it maps


def test_an_ensemble_output_not_produced_is_left_out_of_the_response() -> None:
    """As Triton's ensemble scheduler leaves it out: the execution names the outputs it holds."""
    server = Server()
    execution, _, _ = asyncio.run(_scheduler(CONNECTING, server).submit({"INPUT0": np.ones((1, 1), np.float32)},
                                                                        ["OUTPUT0", "OUTPUT1"], {}, 1))
    assert execution.names == ["OUTPUT0"] and [a.tolist() for a in execution.outputs] == [[[1]]]


def test_an_optional_ensemble_input_left_out_is_left_out_of_the_step_and_a_step_error_is_the_ensembles() -> None:
    config = _ensemble([("plus", {"X": "IN", "Z": "EXTRA"}, {"Y": "OUT"})],
                       f'{{ name: "IN" {ANY} }}, {{ name: "EXTRA" {ANY} optional: true }}', f'{{ name: "OUT" {ANY} }}')
    server = Server()
    assert _run(_scheduler(config, server), {"IN": np.array([1], np.float32)}, ["OUT"])[0].tolist() == [101]
    assert [t.name for t in server.requests[0].inputs] == ["X"]
    failing = _ensemble([("fails", {"X": "IN"}, {"Y": "OUT"})], f'{{ name: "IN" {ANY} }}', f'{{ name: "OUT" {ANY} }}')
    with pytest.raises(InvalidInput, match="the step's model refuses it"):
        _run(_scheduler(failing, Server()), {"IN": np.array([1], np.float32)}, ["OUT"])


def test_the_response_carries_the_sequence_parameters() -> None:
    execution, _, _ = asyncio.run(_scheduler(CHAIN, Server()).submit(
        {"IN": np.array([1], np.float32)}, ["OUT"], {"sequence_id": 3, "sequence_start": True}, 0))
    assert execution.parameters == {"sequence_id": 3, "sequence_start": True, "sequence_end": False}


# a decoupled step: three responses OUT = IN * 10 + i, the final flag alone after them
STREAMED = {"triple": _spec(f'name: "triple" input [{{ name: "IN" {ANY} }}] output [{{ name: "OUT" {ANY} }}]')}


async def _triple(request: InferRequest) -> AsyncGenerator[Streamed, None]:
    value = decode_request(request, STREAMED["triple"]).feeds["IN"]
    for index in range(3):
        yield Streamed(_response("triple", {"OUT": value * 10 + index}, ["OUT"]), None, False)
    yield Streamed(None, None, True)


def test_each_response_of_a_decoupled_step_runs_the_steps_after_it() -> None:
    config = _ensemble([("triple", {"IN": "IN"}, {"OUT": "tripled"}), ("plus", {"X": "tripled"}, {"Y": "OUT"})],
                       f'{{ name: "IN" {ANY} }}', f'{{ name: "OUT" {ANY} }}')
    server = Server()

    async def streamed() -> list[tuple[list[float] | None, bool]]:
        responses = ResponseStream(asyncio.get_running_loop())
        scheduler = _scheduler(config, server, ("triple",), _triple)
        execution, _, _ = await scheduler.submit({"IN": np.array([1], np.float32)}, ["OUT"], {}, 0,
                                                 RequestContext("", (), responses))
        assert execution.outputs == [] and responses.taken
        got: list[tuple[list[float] | None, bool]] = []
        while not got or not got[-1][1]:  # up to the final flag
            sent = await asyncio.wait_for(responses.get(), 5)
            assert sent is not None
            got.append((None if sent.outputs is None else sent.outputs["OUT"].tolist(), sent.final))
        return got

    got = asyncio.run(streamed())
    assert [out for out, _ in got if out is not None] == [[110], [111], [112]]
    # the final flag comes with the last response, or alone after it when the step's came later (by timing)
    assert [final for _, final in got] == [False] * (len(got) - 1) + [True]
    assert [r.model_name for r in server.requests] == ["plus"] * 3
