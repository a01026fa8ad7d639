"""OpenTelemetry tracing: a span per inference request, with its phases as child spans.

Off unless an OTLP endpoint is configured (``--trace-otlp-endpoint``, or the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``/``OTEL_EXPORTER_OTLP_ENDPOINT``); then spans are batched
and exported over OTLP/HTTP off the request path. A W3C ``traceparent`` arriving in HTTP headers
or gRPC metadata makes the request span its child, so the server joins the caller's trace.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kserve_v2.trace_settings import TraceSettings

log = logging.getLogger(__name__)
PHASES = ("compute_input", "queue", "compute_infer", "compute_output")  # in the order they happen
_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """Request spans exported over OTLP/HTTP, or nothing at all when no endpoint is set.

    ``settings`` (Triton's trace settings) pick the traced requests: every one by default when
    an endpoint is set.

    Args:
        endpoint: OTLP/HTTP traces URL (``http://collector:4318/v1/traces``), or None for off.
        service_name: the ``service.name`` resource attribute.
    """

    def __init__(self, endpoint: str | None, service_name: str) -> None:
        self.settings = TraceSettings(bool(endpoint), endpoint or "")
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        if endpoint:
            self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
            self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint),
                                                                 schedule_delay_millis=500))
            self._tracer = self._provider.get_tracer("kserve_v2")
            log.info("tracing: exporting spans over OTLP/HTTP to %s", endpoint)

    @property
    def enabled(self) -> bool:
        """Whether spans are recorded (else callers may skip building a carrier)."""
        return self._tracer is not None

    @contextmanager
    def request(self, name: str, carrier: Mapping[str, str], model: str) -> Iterator[trace.Span | None]:
        """A span for one request, child of the caller's ``traceparent`` when the carrier has one
        (of the current span when there is no carrier: an ensemble's steps), for the requests the
        trace settings pick (Triton's trace extension)."""
        if self._tracer is None or not self.settings.sample(model):
            yield None
            return
        # no carrier: a call made inside this server (an ensemble step) is a child of the current span
        parent = _PROPAGATOR.extract(carrier={k.lower(): v for k, v in carrier.items()}) if carrier else None
        kind = trace.SpanKind.SERVER if carrier else trace.SpanKind.INTERNAL
        with self._tracer.start_as_current_span(name, context=parent, kind=kind,
                                                attributes={"model.name": model}) as span:
            yield span

    def phases(self, span: trace.Span | None, start_ns: int, durations_ns: Mapping[str, int]) -> None:
        """Record the request's phases as child spans laid end to end from ``start_ns`` (epoch ns)."""
        if span is None or self._tracer is None:
            return
        context = trace.set_span_in_context(span)
        at = start_ns
        for phase in PHASES:
            child = self._tracer.start_span(phase, context=context, start_time=at)
            at += durations_ns[phase]
            child.end(end_time=at)

    @staticmethod
    def trace_id(span: trace.Span | None) -> str | None:
        """The span's trace id as 32 hex digits (what X-Trace-ID carries), or None."""
        if span is None:
            return None
        return format(span.get_span_context().trace_id, "032x")

    def shutdown(self) -> None:
        """Export what is pending (server exit)."""
        if self._provider is not None:
            self._provider.shutdown()
