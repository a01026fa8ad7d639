"""Request tracing in Triton's two trace modes: OpenTelemetry spans, or Triton's JSON trace file.

``opentelemetry`` mode (``--trace-otlp-endpoint``, the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
or ``--trace-config mode=opentelemetry``): a span per inference request with its phases as child
spans, batched and exported over OTLP/HTTP off the request path. A W3C ``traceparent`` arriving in
HTTP headers or gRPC metadata makes the request span its child, so the server joins the caller's trace.

``triton`` mode (``--trace-config triton,file=<path>``): a traced request becomes Triton's trace
records (``kserve_v2.observability.trace_file``): the model, its timestamps REQUEST_START, QUEUE_START,
COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END and REQUEST_END (steady-clock
ns; the phases as measured, laid end to end in Triton's order from the request's start), and at
level TENSORS its inputs (TENSOR_QUEUE_INPUT) and outputs (TENSOR_BACKEND_OUTPUT). An ensemble's
steps are traced with it, each with the ensemble's trace as ``parent_id``. Without a trace file
nothing is traced, as in Triton. Triton's trace settings (``kserve_v2.observability.trace_settings``) pick the
traced requests in both modes.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import numpy as np
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kserve_v2.codec.messages import InferRequest, InferResponse
from kserve_v2.models.version import ModelVersion
from kserve_v2.observability.trace_file import Entry, TraceFile, tensor_entry
from kserve_v2.observability.trace_settings import Setting, TraceSettings
from kserve_v2.protocol.datatypes import BY_V2
from kserve_v2.protocol.errors import ServerError
from kserve_v2.protocol.tensors import from_raw
from kserve_v2.request.decode import decode_request
from kserve_v2.request.shared_memory import RequestRegions, SharedMemoryRegistry
from kserve_v2.settings.trace_config import OPENTELEMETRY, TRITON, TraceConfig

log = logging.getLogger(__name__)
PHASES = ("compute_input", "queue", "compute_infer", "compute_output")  # in the order they happen
_PROPAGATOR = TraceContextTextMapPropagator()
_CURRENT: ContextVar[TritonTrace | None] = ContextVar("triton_trace", default=None)  # the request a step belongs to


class RequestTrace:
    """One traced request; the service calls ``begin`` once the model version is resolved and
    ``end`` with the request's report (``RequestReport`` fields, ns)."""

    trace_id: str | None = None  # the W3C trace id (X-Trace-ID), when there is one

    def begin(self, request: InferRequest, model: ModelVersion, memory: SharedMemoryRegistry | None) -> None:
        """The request is about to run on ``model``."""

    def end(self, response: InferResponse, durations_ns: Mapping[str, int], outputs: tuple[np.ndarray, ...]) -> None:
        """The request succeeded: ``durations_ns`` holds ``PHASES`` and ``total``; ``outputs`` are
        the output arrays when the response carries no raw contents."""


class Tracing:
    """The trace mode in force, its trace settings, and the traces of the requests they pick.

    Args:
        config: ``--trace-config`` (mode and startup settings).
        service_name: the ``service.name`` resource attribute of OpenTelemetry spans.
    """

    def __init__(self, config: TraceConfig, service_name: str) -> None:
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        output = TraceFile(Path(config.file)) if config.mode == TRITON and config.file else None
        self.settings = TraceSettings(config, output)
        self._file = output is not None
        self._ids = itertools.count(1)
        if config.mode == OPENTELEMETRY:
            resource = {"service.name": service_name, **dict(config.resource)}
            bsp = dict(config.bsp)  # None: the SDK's default (or its OTEL_BSP_* variable)
            self._provider = TracerProvider(resource=Resource.create(resource))
            self._provider.add_span_processor(BatchSpanProcessor(
                OTLPSpanExporter(endpoint=config.url), max_queue_size=bsp.get("bsp_max_queue_size"),
                schedule_delay_millis=bsp.get("bsp_schedule_delay", 500),
                max_export_batch_size=bsp.get("bsp_max_export_batch_size")))
            self._tracer = self._provider.get_tracer("kserve_v2")
            log.info("tracing: exporting spans over OTLP/HTTP to %s", config.url)
        elif output is not None:
            log.info("tracing: writing Triton trace files to %s", output.path)

    @property
    def enabled(self) -> bool:
        """Whether requests can be traced (else callers skip the trace and the carrier)."""
        return self._tracer is not None or self._file

    @contextmanager
    def request(self, name: str, carrier: Mapping[str, str], model: str) -> Iterator[RequestTrace | None]:
        """The trace of one request, or None when the trace settings do not pick it. A call made
        inside this server (an ensemble step: no carrier) belongs to the trace of its request."""
        if self._tracer is not None:
            with self._span(name, carrier, model) as span:
                yield span
            return
        parent = _CURRENT.get()
        if parent is not None and not carrier:
            traced = TritonTrace(next(self._ids), parent.id, model, parent.setting)
            parent.children.append(traced)
        else:
            setting = self.settings.sample(model) if self._file else None
            if setting is None:
                yield None
                return
            traced = TritonTrace(next(self._ids), 0, model, setting)
        token = _CURRENT.set(traced)
        try:
            yield traced
        finally:
            _CURRENT.reset(token)
            traced.finish()
            if not traced.parent_id:
                self.settings.collect(traced.setting, traced.entries())

    @contextmanager
    def _span(self, name: str, carrier: Mapping[str, str], model: str) -> Iterator[RequestTrace | None]:
        assert self._tracer is not None
        if not self.settings.sample(model):
            yield None
            return
        # no carrier: a call made inside this server (an ensemble step) is a child of the current span
        parent = _PROPAGATOR.extract(carrier={k.lower(): v for k, v in carrier.items()}) if carrier else None
        kind = trace.SpanKind.SERVER if carrier else trace.SpanKind.INTERNAL
        with self._tracer.start_as_current_span(name, context=parent, kind=kind,
                                                attributes={"model.name": model}) as span:
            yield SpanTrace(self._tracer, span)

    def shutdown(self) -> None:
        """Export or write what is pending (server exit)."""
        if self._provider is not None:
            self._provider.shutdown()
        self.settings.close()


class SpanTrace(RequestTrace):
    """A request's OpenTelemetry span; its phases become child spans laid end to end."""

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer, self._span = tracer, span
        self.trace_id = format(span.get_span_context().trace_id, "032x")
        self._started = time.time_ns()

    def begin(self, request: InferRequest, model: ModelVersion, memory: SharedMemoryRegistry | None) -> None:
        self._started = time.time_ns()

    def end(self, response: InferResponse, durations_ns: Mapping[str, int], outputs: tuple[np.ndarray, ...]) -> None:
        context = trace.set_span_in_context(self._span)
        at = self._started
        for phase in PHASES:
            child = self._tracer.start_span(phase, context=context, start_time=at)
            at += durations_ns[phase]
            child.end(end_time=at)


class TritonTrace(RequestTrace):
    """A request's records in Triton's trace file (see the module docstring)."""

    def __init__(self, trace_id: int, parent_id: int, model: str, setting: Setting) -> None:
        self.id, self.parent_id, self.setting = trace_id, parent_id, setting
        self.children: list[TritonTrace] = []
        self._header: Entry = {"id": trace_id, "model_name": model, "model_version": -1}
        self._started = time.monotonic_ns()
        self._stamps: list[tuple[str, int]] = []
        self._inputs: list[Entry] = []
        self._outputs: list[Entry] = []
        self._ended = False

    def begin(self, request: InferRequest, model: ModelVersion, memory: SharedMemoryRegistry | None) -> None:
        self._header["model_version"] = model.version
        if request.id:
            self._header["request_id"] = request.id
        if self.parent_id:
            self._header["parent_id"] = self.parent_id
        if not self.setting.tensors:
            return
        regions = RequestRegions(memory) if memory is not None else None
        try:
            feeds = decode_request(request, model.spec, regions).feeds
        except ServerError:
            return  # the request fails as it runs, with its own error
        finally:
            if regions is not None:
                regions.release()
        for sent in request.inputs:
            if sent.name in feeds:
                array = feeds[sent.name]
                shape = list(sent.shape)
                self._inputs.append(tensor_entry(self.id, "TENSOR_QUEUE_INPUT", sent.name, sent.datatype,
                                                 array.reshape(shape) if array.size == _size(shape) else array))

    def end(self, response: InferResponse, durations_ns: Mapping[str, int], outputs: tuple[np.ndarray, ...]) -> None:
        at = self._started
        self._stamps = [("REQUEST_START", at)]
        for name, phase in (("QUEUE_START", ""), ("COMPUTE_START", "queue"), ("COMPUTE_INPUT_END", "compute_input"),
                            ("COMPUTE_OUTPUT_START", "compute_infer"), ("COMPUTE_END", "compute_output")):
            at += durations_ns.get(phase, 0)
            self._stamps.append((name, at))
        self._stamps.append(("REQUEST_END", max(at, self._started + durations_ns["total"])))
        self._ended = True
        if self.setting.tensors:
            self._outputs = list(_output_entries(self.id, response, outputs))

    def finish(self) -> None:
        """The request is over; a failed one records its start and end only."""
        if not self._ended:
            self._stamps = [("REQUEST_START", self._started), ("REQUEST_END", time.monotonic_ns())]

    def entries(self) -> list[Entry]:
        """This trace's entries in the order they happened, then its ensemble steps'."""
        stamps = [{"id": self.id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in self._stamps]
        if self._ended:  # inputs once queued, outputs before the compute ends
            own = [self._header, *stamps[:2], *self._inputs, *stamps[2:5], *self._outputs, *stamps[5:]]
        else:
            own = [self._header, stamps[0], *self._inputs, *stamps[1:]]
        return own + [entry for child in self.children for entry in child.entries()]


def _size(shape: list[int]) -> int:
    size = 1
    for dim in shape:
        size *= dim
    return size


def _output_entries(trace_id: int, response: InferResponse, arrays: tuple[np.ndarray, ...]) -> Iterator[Entry]:
    """TENSOR_BACKEND_OUTPUT entries of the response's outputs (those written to shared memory have no data here)."""
    raw = response.raw_output_contents
    for index, tensor in enumerate(response.outputs):
        shape = list(tensor.shape)
        if index < len(arrays):
            array = arrays[index]
        elif index < len(raw) and (raw[index] or not _size(shape)):
            array = from_raw(raw[index], BY_V2[tensor.datatype], shape, f"output '{tensor.name}'")
        else:
            continue
        yield tensor_entry(trace_id, "TENSOR_BACKEND_OUTPUT", tensor.name, tensor.datatype, array)
