"""Per-stage CPU budget of one request, in-process: each stage of the request path timed on its own.

The server's objects are built as the app builds them (an ``InferenceService`` over the example
repository with ``simple`` and ``simple_python`` loaded, metrics on, tracing off as by default, the
REST app of ``transcoding.app.build_app``), then each stage's function is called many times on the
bytes perf_analyzer sends, and its process CPU time (``time.process_time_ns``: every thread, the
python model's instance thread included) divided by the calls. A table per case:

- gRPC ModelInfer of ``simple`` (ONNX Runtime; the ``DynamicBatcher`` that auto-complete turns on,
  a lone request executing inline on the loop) and of ``simple_python`` (the python backend in
  process, ``DynamicBatcher``, executions on the instance thread);
- REST JSON ``POST /v2/models/simple/infer``, with the do-nothing ASGI app of ``ceiling_rest.py``
  (in_process.py's ``bare`` case) beside it.

The stages, in the order ``Servicer.ModelInfer`` and ``InferenceService._run`` run them:

1. receive/decode: the wire codec's ``codec.requests.decode_request`` on the request bytes (REST:
   ``transcoding.v2.json_tensors.parse_infer_request`` on the JSON body: orjson and the tensors);
2. planning and validation into feeds: ``request.budget.request_cost`` and ``request.decode.decode_request``;
3. model lookup: the repository's ``acquire_version`` and the version's ``release``;
4. scheduling and the hand-off to the instance: ``submit`` of the scheduler the version's
   configuration picks (``models.version.open_version`` over the same configuration), on an
   executable that does nothing but answer the outputs of one real run. This is the scheduler's
   own cost measured directly (its queue, batch forming, the instance pool's timing and, for the
   python model, the thread hand-off both ways), rather than the full submit minus a run measured
   elsewhere, which would be a difference of two noisy figures. A hand-off around real work costs
   more than around none (the loop's thread goes to sleep meanwhile and is woken): that extra is
   left in "unattributed";
5. the runtime's run alone: the backend's ``execute`` on the decoded feeds (``OnnxModel.execute``:
   ONNX Runtime's ``run_with_ort_values``; ``PythonModel.execute``: the model's ``execute`` in
   process with its ``pb_utils`` requests and responses), here on the event loop's thread;
6. encode: 6a, the response object (``request.encode.encode_response``, in the service); 6b, what
   the transport writes of it: ``codec.responses.response_parts`` joined as the servicer joins them
   (REST: ``render_infer_response`` to JSON, ``timing_pairs`` and the ``Response`` of
   ``transcoding.http.body.compressed``);
7. statistics and metrics: the ``RequestReport``, ``ModelStats.record_success`` and
   ``InferenceMetrics.started`` / ``succeeded``;

then the whole handler as it is registered (in_process.py's ``grpc`` case; REST: the ASGI app, its
``rest`` case), and "unattributed", the whole less the stages' sum, split in two with one more
measurement, ``InferenceService.model_infer_reported`` on the decoded request: in the service (that
call less stages 2-6a and 7: the clock reads, branches and coroutine calls between the stages, the
trace hooks, which with tracing off are one attribute read per request) and in the transport (the
rest: the servicer and its registration wrapper; for REST the routing, the HTTP metrics middleware
and reading the body). Each figure has the harness's own cost of a call (an empty function, or an
empty coroutine for the awaited stages) taken out; the whole is timed as the stages are, call after
call without yielding to the loop in between (a handler that never suspends is one task step).
Figures are the median of the rounds, all rounds in one process.

Private names used (a benchmark may): the version's executable is reached through its scheduler's
``_pool`` (no public accessor), and in_process.py's harness helpers (``_post``, ``_Context``,
``_model_infer_handler``) are imported from it.

Usage: python benchmarks/stages.py [--requests 20000] [--rounds 3] [--smoke]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from ceiling_rest import application, prepared
from in_process import BODY, WARM_UP, _Context, _model_infer_handler, _post, perf_analyzer_request
from prometheus_client import CollectorRegistry

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import grpc_service_pb2_grpc as pb_grpc
from kserve_v2.backend import NO_CONTEXT, BatchStrategy, Execution, Parameter, RequestContext
from kserve_v2.codec.requests import decode_request as decode_wire
from kserve_v2.codec.responses import response_parts
from kserve_v2.grpc import servicer as servicer_module
from kserve_v2.models.version import ModelVersion, open_version
from kserve_v2.observability.metrics import V2_API, InferenceMetrics
from kserve_v2.protocol.statistics import RequestReport
from kserve_v2.repository.manager import ModelManager
from kserve_v2.request.budget import request_cost
from kserve_v2.request.decode import decode_request
from kserve_v2.request.encode import encode_response
from kserve_v2.service.inference_service import InferenceService, ServerState
from transcoding.app import build_app
from transcoding.http.body import compressed
from transcoding.http.timing import timing_pairs
from transcoding.v2.json_tensors import HttpInfer, parse_infer_request, render_infer_response

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "examples" / "model_repository"
MAX_INPUT_BYTES = 64 << 20  # as in_process.py builds the app
HEADERS = [(b"host", b"127.0.0.1"), (b"content-length", str(len(BODY)).encode()), (b"accept", b"*/*")]
Call = Callable[[], Any]  # a stage: a function, or a coroutine function (awaited)


@dataclass
class Case:
    """One request kind's stages, the service call that runs those of them ``inside`` names, its whole
    handler and, where there is one, the do-nothing server's call."""

    title: str
    stages: list[tuple[str, Call]]
    service: tuple[str, Call]
    inside: tuple[str, ...]
    whole: tuple[str, Call]
    ceiling: tuple[str, Call] | None = None


class _PreparedBatching:
    """A backend's batch strategy (keys, sizes, limit, fast path) whose executions answer prepared outputs."""

    def __init__(self, strategy: BatchStrategy, outputs: list[np.ndarray]) -> None:
        self.inline = strategy.inline
        self.limit, self.items, self.key = strategy.limit, strategy.items, strategy.key
        self._outputs = outputs

    def execute_batch(self, members: list[dict[str, np.ndarray]], output_names: Sequence[str],
                      parameters: Mapping[str, Parameter], contexts: Sequence[RequestContext] = ()
                      ) -> list[Execution | Exception]:
        return [Execution(list(self._outputs)) for _ in members]


class _Prepared:
    """A backend's executable that does nothing but answer ``outputs`` (one real run's): what stage 4
    schedules, so that the scheduler's own cost is what it measures."""

    def __init__(self, real: Any, outputs: list[np.ndarray]) -> None:
        self.inputs, self.outputs, self.on_cuda = real.inputs, real.outputs, real.on_cuda
        self.batchable, self.threaded, self.text = real.batchable, real.threaded, real.text
        self.batching = None if real.batching is None else _PreparedBatching(real.batching, outputs)
        self._outputs = outputs

    def execute(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                parameters: Mapping[str, Parameter], context: RequestContext = NO_CONTEXT) -> Execution:
        return Execution(list(self._outputs))

    def close(self) -> None:
        pass


async def build_cases() -> tuple[list[Case], list[ModelVersion]]:
    """The server's objects, as the app builds them, and each case's stage calls; the versions to close after."""
    manager = ModelManager([REPOSITORY], 0, lambda: None, ready_when_empty=True)
    await manager.load_startup_models(["simple", "simple_python"])
    state = ServerState(False)
    state.started = True
    registry = CollectorRegistry()
    metrics = InferenceMetrics(registry)
    service = InferenceService(manager, state, "in-process", "explicit", metrics)
    handler = _model_infer_handler(servicer_module, pb_grpc, service)
    cases, quiet = [], []
    for name, runtime in (("simple", "ONNX Runtime"), ("simple_python", "python model in process")):
        case, version = _grpc_case(service, manager, metrics, handler, name, runtime)
        cases.append(case)
        quiet.append(version)

    app = build_app(service, MAX_INPUT_BYTES, registry)
    bare = application(prepared(REPOSITORY))
    statuses: list[object] = []

    async def rest_whole() -> None:
        await _post(app, HEADERS, statuses)

    async def bare_whole() -> None:
        await _post(bare, HEADERS, [])

    def parse() -> HttpInfer:
        return parse_infer_request(BODY, None, "simple", "", MAX_INPUT_BYTES)

    parsed = parse()
    core, call, version = _core_stages(service, manager, metrics, "simple", parsed.request, None)
    quiet.append(version)
    response, report = core[4][1](), RequestReport(1, 1, 0, 100_000, 1_000, 10_000, 50_000, 10_000)

    def render() -> object:
        content, _ = render_infer_response(response, parsed)
        return compressed(content, None, timing_pairs(report, 120_000), b"application/json")

    stages = [("1. receive/decode: `json_tensors.parse_infer_request` on the JSON body", parse), *core[:5],
              ("6b. encode, to the body: `render_infer_response` (JSON), `timing_pairs`, `compressed`", render), core[5]]
    cases.append(Case("REST JSON `POST /v2/models/simple/infer`", stages, call, tuple(label for label, _ in core),
                      ("whole: the ASGI app of `build_app` (in_process.py's `rest` case)", rest_whole),
                      ("the do-nothing ASGI app of `ceiling_rest.py` (in_process.py's `bare` case)", bare_whole)))
    await rest_whole()
    if set(statuses) != {200}:
        raise SystemExit(f"REST answered {set(statuses)}, not 200")
    return cases, quiet


def _grpc_case(service: InferenceService, manager: ModelManager, metrics: InferenceMetrics, handler: Any,
               name: str, runtime: str) -> tuple[Case, ModelVersion]:
    """The gRPC ModelInfer case of model ``name``, and the do-nothing version its stage 4 schedules on."""
    wire = perf_analyzer_request(pb, name)
    deserialize = handler.request_deserializer or (lambda data: data)  # none: the handler takes bytes
    serialize = handler.response_serializer or (lambda message: message)
    context = _Context()
    core, call, version = _core_stages(service, manager, metrics, name, decode_wire(wire), len(wire))
    response = core[4][1]()  # stage 6a's response object, which 6b writes out

    def decode() -> object:
        return decode_wire(wire)

    def encode() -> bytes:
        return b"".join(response_parts(response)[0])

    async def whole() -> None:
        serialize(await handler.unary_unary(deserialize(wire), context))

    stages = [("1. receive/decode: `codec.requests.decode_request` on the wire bytes", decode), *core[:5],
              ("6b. encode, to bytes: `codec.responses.response_parts` joined", encode), core[5]]
    return Case(f"gRPC ModelInfer, `{name}` ({runtime})", stages, call, tuple(label for label, _ in core),
                ("whole: `ModelInfer` as registered (in_process.py's `grpc` case)", whole)), version


def _core_stages(service: InferenceService, manager: ModelManager, metrics: InferenceMetrics, name: str,
                 request: Any, wire_bytes: int | None
                 ) -> tuple[list[tuple[str, Call]], tuple[str, Call], ModelVersion]:
    """Stages 2 to 7 of ``InferenceService._run`` on one decoded request (stage 6a: the response object,
    which the transport's encoding, 6b, writes out), the service call that runs them all, and the
    do-nothing version stage 4 schedules on."""
    model = manager.acquire_version(name, "")
    model.release()
    spec, version = model.spec, model.version
    decoded = decode_request(request, spec, None)
    feeds, output_names, parameters = decoded.feeds, decoded.output_names, decoded.parameters
    executable = model.scheduler._pool.executable  # type: ignore[attr-defined]  # no public accessor
    execution = executable.execute(feeds, output_names, parameters, NO_CONTEXT)
    quiet = open_version(name, version, model.config, _Prepared(executable, execution.outputs))
    if type(quiet.scheduler) is not type(model.scheduler):
        raise SystemExit(f"{name}: the do-nothing version got {type(quiet.scheduler).__name__}, "
                         f"the model {type(model.scheduler).__name__}")
    outputs = execution.outputs
    batch_size = decoded.batch_size

    def lookup() -> None:
        manager.acquire_version(name, "").release()

    async def schedule() -> None:
        await quiet.scheduler.submit(feeds, output_names, parameters, batch_size,
                                     RequestContext(request.id, (), None, service.calls, parameters))

    def record() -> None:
        metrics.started(name, model.label)
        done = RequestReport(batch_size, 1, 0, 100_000, 1_000, 10_000, 50_000, 10_000)  # ns, as a run reports them
        model.stats.record_success(done)
        metrics.succeeded(name, model.label, V2_API, done)

    stages: list[tuple[str, Call]] = [
        ("2. planning and validation into feeds: `request_cost`, `request.decode.decode_request`",
         lambda: (request_cost(request, False, wire_bytes), decode_request(request, spec, None))),
        ("3. model lookup: `acquire_version` + `release`", lookup),
        (f"4. scheduling and hand-off to the instance: `{type(quiet.scheduler).__name__}.submit`, do-nothing executable",
         schedule),
        (f"5. the runtime's run: `{type(executable).__name__}.execute`",
         lambda: executable.execute(feeds, output_names, parameters, NO_CONTEXT)),
        ("6a. encode, the response object: `request.encode.encode_response`",
         lambda: encode_response(request, spec, version, decoded, list(outputs))[0]),
        ("7. statistics and metrics: `RequestReport`, `record_success`, `started` / `succeeded`", record),
    ]

    async def call() -> None:
        await service.model_infer_reported(request, None, wire_bytes=wire_bytes)

    return stages, ("`InferenceService.model_infer_reported`", call), quiet


def _nothing() -> None:
    pass


async def _nothing_awaited() -> None:
    pass


async def cpu_us(call: Call, count: int) -> float:
    """µs of process CPU time per call of ``call`` over ``count`` calls, after ``min(count, WARM_UP)`` unmeasured ones."""
    awaited = inspect.iscoroutinefunction(call)
    for _ in range(min(count, WARM_UP)):
        if awaited:
            await call()
        else:
            call()
    began = time.process_time_ns()
    if awaited:
        for _ in range(count):
            await call()
    else:
        for _ in range(count):
            call()
    return (time.process_time_ns() - began) / count / 1e3


async def measure(cases: list[Case], count: int) -> list[dict[str, float]]:
    """One round: each case's calls (stages, service, whole, ceiling) in µs, the harness's cost of a call taken out."""
    harness = {False: await cpu_us(_nothing, count), True: await cpu_us(_nothing_awaited, count)}
    figures = []
    for case in cases:
        rows = case.stages + [case.service, case.whole] + ([case.ceiling] if case.ceiling else [])
        figures.append({label: await cpu_us(call, count) - harness[inspect.iscoroutinefunction(call)]
                        for label, call in rows})
    return figures


def table(case: Case, rounds: list[dict[str, float]]) -> list[str]:
    """The case's markdown table: stage | µs per request | share of the whole (medians of the rounds)."""
    median = {label: statistics.median(r[label] for r in rounds) for label in rounds[0]}
    whole = median[case.whole[0]]
    lines = [f"### {case.title}", "", "| stage | µs per request | share of the whole |", "|---|---|---|"]
    total = 0.0
    for label, _ in case.stages:
        total += median[label]
        lines.append(f"| {label} | {median[label]:.2f} | {median[label] / whole:.0%} |")
    lines.append(f"| sum of 1-7 | {total:.2f} | {total / whole:.0%} |")
    in_service = median[case.service[0]] - sum(median[label] for label in case.inside)
    lines.append(f"| unattributed (whole - sum) | {whole - total:.2f} | {(whole - total) / whole:.0%} |")
    lines.append(f"| - of which in the service ({case.service[0]} less 2-6a and 7) | {in_service:.2f} "
                 f"| {in_service / whole:.0%} |")
    rest = whole - total - in_service
    lines.append(f"| - of which in the transport (the rest) | {rest:.2f} | {rest / whole:.0%} |")
    lines.append(f"| {case.whole[0]} | {whole:.2f} | 100% |")
    if case.ceiling is not None:
        ceiling = median[case.ceiling[0]]
        lines.append(f"| {case.ceiling[0]} | {ceiling:.2f} | {ceiling / whole:.0%} |")
    return lines + [""]


async def _run(count: int, rounds: int) -> None:
    cases, quiet = await build_cases()
    figures = [await measure(cases, count) for _ in range(rounds)]
    for version in quiet:
        version.scheduler.stop()
        version.close()
    print(f"In-process CPU time per request, µs (median of {rounds} round(s) of {count} calls a stage):\n")
    for i, case in enumerate(cases):
        print("\n".join(table(case, [round_[i] for round_ in figures])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000, help="calls of each stage per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a few calls: checks the harness, not the speed")
    args = parser.parse_args()
    count, rounds = (200, 1) if args.smoke else (args.requests, args.rounds)
    import uvloop

    uvloop.run(_run(count, rounds))


if __name__ == "__main__":
    main()
