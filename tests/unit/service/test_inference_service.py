"""InferenceService in-process, against a fake of our own ModelLifecycle protocol: the one request
path (decode, schedule, encode, statistics, metrics) without a repository, a network or ONNX Runtime."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pytest
from google.protobuf import text_format
from prometheus_client import CollectorRegistry

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Execution, Parameter
from kserve_v2.backend.text import InputKind, OutputKind, TextContract, TextInput, TextOutput, TextRequest
from kserve_v2.models.version import ModelVersion
from kserve_v2.observability.metrics import InferenceMetrics
from kserve_v2.protocol.errors import ErrorCode, InternalError, NotFound, Overloaded
from kserve_v2.repository.records import ModelRecords
from kserve_v2.scheduling.base import DirectScheduler
from kserve_v2.scheduling.instances import InstancePool
from kserve_v2.service.inference_service import InferenceService, ServerState, failure_code
from tests.unit.fakes import Doubling

TENSOR_MODEL = ('name: "double" max_batch_size: 8 input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [2] }] '
                'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [2] }] instance_group [{ count: 1 }]')


def version(config_text: str, number: int = 1, backend: Doubling | None = None) -> ModelVersion:
    config = text_format.Parse(config_text, mc.ModelConfig())
    executable = backend or Doubling()
    pool = InstancePool(config.name, number, 1, executable)
    return ModelVersion(config.name, number, config, DirectScheduler(pool), text=executable.text)


class Lifecycle:
    """A fake ModelLifecycle: READY versions by name; ``resolve`` answers from ``serving(name)``,
    which a test may change between calls (a reload)."""

    def __init__(self, *versions: ModelVersion) -> None:
        self.versions = {v.name: [v] for v in versions}
        self.resolved: list[tuple[str, int]] = []
        self.step_runner = None

    def serving(self, name: str) -> ModelVersion:
        return self.versions[name][-1]

    def models_ready(self) -> bool:
        return True

    def knows(self, name: str) -> bool:
        return name in self.versions

    def stored_config(self, name: str) -> mc.ModelConfig | None:
        return self.versions[name][-1].config if name in self.versions else None

    def stored_configs(self) -> Iterator[tuple[str, mc.ModelConfig]]:
        return iter([(name, found[-1].config) for name, found in sorted(self.versions.items())])

    def is_ready(self, name: str, version: str) -> bool:
        return name in self.versions

    def resolve(self, name: str, version: str) -> ModelVersion:
        if name not in self.versions:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        model = self.serving(name)
        self.resolved.append((name, model.version))
        return model

    def ready_versions(self, name: str) -> list[ModelVersion]:
        return [self.serving(name)]

    def all_ready_versions(self) -> Iterator[ModelVersion]:
        return iter([self.serving(name) for name in sorted(self.versions)])

    # holding a resolved version is the manager's own code, not faked (it only calls resolve)
    acquire = ModelRecords.acquire
    acquire_version = ModelRecords.acquire_version

    def index(self, ready_only: bool) -> list:
        return []

    async def refresh(self) -> None:
        raise AssertionError("not used")

    async def load_requested(self, name: str, parameters: Mapping[str, pb.ModelRepositoryParameter]) -> None:
        raise AssertionError("not used")

    async def unload(self, name: str) -> None:
        raise AssertionError("not used")

    async def unload_with_composing(self, name: str) -> None:
        raise AssertionError("not used")


def service(lifecycle: Lifecycle) -> tuple[InferenceService, CollectorRegistry]:
    state = ServerState(strict_readiness=True)
    state.started = True
    registry = CollectorRegistry()
    return InferenceService(lifecycle, state, "in-process", "none", InferenceMetrics(registry)), registry


def infer_request(rows: int = 1, model: str = "double") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[rows, 2])
    request.raw_input_contents.append(np.arange(rows * 2, dtype="<i4").tobytes())
    return request


def failures(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value("nv_inference_request_failure",
                                     {"model": "double", "version": "1", "reason": reason})


def test_a_request_runs_through_the_one_path_and_is_counted() -> None:
    model = version(TENSOR_MODEL)
    lifecycle = Lifecycle(model)
    inference, registry = service(lifecycle)
    try:
        response, report = asyncio.run(inference.model_infer_reported(infer_request(rows=3)))
    finally:
        model.close()
    assert (response.model_name, response.model_version, response.outputs[0].name) == ("double", "1", "OUTPUT0")
    assert np.frombuffer(response.raw_output_contents[0], "<i4").tolist() == [0, 2, 4, 6, 8, 10]
    assert (report.batch_size, report.executions) == (3, 1) and report.total_ns >= report.compute_infer_ns
    [stats] = asyncio.run(inference.model_statistics(pb.ModelStatisticsRequest(name="double"))).model_stats
    assert (stats.inference_count, stats.execution_count, stats.inference_stats.success.count) == (3, 1, 1)
    assert [b.batch_size for b in stats.batch_stats] == [3]
    labels = {"model": "double", "version": "1"}
    assert registry.get_sample_value("nv_inference_request_success", labels) == 1
    assert registry.get_sample_value("nv_inference_count", labels) == 3
    assert model.inflight == 0  # released


def test_a_failing_backend_is_internal_and_counted_as_a_backend_failure() -> None:
    def broken(feeds: dict[str, np.ndarray], names: Sequence[str]) -> Execution:
        raise RuntimeError("the graph broke")

    model = version(TENSOR_MODEL, backend=Doubling(broken))
    inference, registry = service(Lifecycle(model))
    try:
        with pytest.raises(InternalError, match="execution failed for model 'double': the graph broke"):
            asyncio.run(inference.model_infer_reported(infer_request()))
    finally:
        model.close()
    assert failures(registry, "BACKEND") == 1 and failures(registry, "CANCELED") is None


def test_only_a_cancelled_request_counts_as_cancelled() -> None:
    started, release = threading.Event(), threading.Event()

    def slow(feeds: dict[str, np.ndarray], names: Sequence[str]) -> Execution:
        started.set()
        release.wait(10)
        return Execution([feeds["INPUT0"]])

    model = version(TENSOR_MODEL, backend=Doubling(slow))
    inference, registry = service(Lifecycle(model))

    async def cancel_one() -> None:
        task = asyncio.ensure_future(inference.model_infer_reported(infer_request()))
        await asyncio.to_thread(started.wait, 10)  # running on the instance thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(cancel_one())
    finally:
        release.set()
        model.close()
    assert failures(registry, "CANCELED") == 1 and failures(registry, "BACKEND") is None
    assert model.stats.fail.count == 1


def test_failures_are_classified_by_what_they_were() -> None:
    assert failure_code(Overloaded("full")) is ErrorCode.UNAVAILABLE
    assert failure_code(asyncio.CancelledError()) is ErrorCode.CANCELLED
    assert failure_code(KeyError("a bug")) is ErrorCode.INTERNAL  # not CANCELLED


def text_model(number: int) -> ModelVersion:
    """Version ``number`` of a text model whose output is named after the version (``v1``, ``v2``)."""
    output = f"v{number}"

    class Counting(Doubling):
        text = TextContract((TextInput(InputKind.TEXT),), (TextOutput(OutputKind.SCORE, "float32", 0, output),), 8)

        def execute(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                    parameters: Mapping[str, Parameter], context: object = None) -> Execution:
            return Execution([np.full(len(feeds["text"]), number, np.float32)])

    config = ('name: "words" input [{ name: "text" data_type: TYPE_STRING dims: [-1] }] '
              f'output [{{ name: "{output}" data_type: TYPE_FP32 dims: [-1] }}] instance_group [{{ count: 1 }}]')
    return version(config, number, Counting())


class ScoreCall:
    """A semantic route's call: score two texts with the contract's score output."""

    def resolved(self, name: str) -> None:
        self.name = name

    def plan(self, name: str, contract: TextContract) -> TextRequest:
        output = contract.output(OutputKind.SCORE)
        assert output is not None
        return TextRequest({InputKind.TEXT: ["a", "b"]}, [output.values])


def test_a_text_call_runs_on_the_version_whose_contract_planned_it() -> None:
    first, second = text_model(1), text_model(2)
    lifecycle = Lifecycle(first)
    inference, _ = service(lifecycle)
    original = lifecycle.resolve

    def reloading(name: str, version: str) -> ModelVersion:
        model = original(name, version)
        lifecycle.versions["words"] = [second]  # a reload right after this resolution
        return model

    lifecycle.resolve = reloading
    try:
        arrays, report = asyncio.run(inference.text.infer("words", ScoreCall()))
    finally:
        first.close()
        second.close()
    assert lifecycle.resolved == [("words", 1)]  # one resolution per call
    assert {name: a.tolist() for name, a in arrays.items()} == {"v1": [1.0, 1.0]}  # version 1's contract and run
    assert first.stats.success.count == 1 and second.stats.success.count == 0
    assert first.inflight == 0
