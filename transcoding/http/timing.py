"""SIE's timing headers and body, and the trace id header, shared by the V2 and semantic HTTP routes."""

from __future__ import annotations

import time
from collections.abc import Mapping

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import INVALID_TRACE_ID, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kserve_v2.protocol.statistics import RequestReport

_PROPAGATOR = TraceContextTextMapPropagator()
_IDS = RandomIdGenerator()


def timing_pairs(timing: RequestReport, total_ns: int) -> list[tuple[bytes, bytes]]:
    """SIE's timing headers in ms (SIE's HTTP API reference), as ASGI sends them (lower-case name,
    value): total time of the HTTP request, and the phases the core measured - queue (waiting for an
    instance), tokenization (decoding the request into tensors, and a text model's tokenizer),
    inference (the model) and postprocessing (encoding outputs, only when > 0)."""
    pairs = [(b"x-total-time", b"%.3f" % (total_ns / 1e6)), (b"x-queue-time", b"%.3f" % (timing.queue_ns / 1e6)),
             (b"x-tokenization-time", b"%.3f" % (timing.compute_input_ns / 1e6)),
             (b"x-inference-time", b"%.3f" % (timing.compute_infer_ns / 1e6))]
    if timing.compute_output_ns > 0:
        pairs.append((b"x-postprocessing-time", b"%.3f" % (timing.compute_output_ns / 1e6)))
    return pairs


def timing_headers(timing: RequestReport, total_ns: int) -> dict[str, str]:
    """``timing_pairs`` as a header dict (``X-Total-Time``, ...)."""
    return {name.decode().title(): value.decode() for name, value in timing_pairs(timing, total_ns)}


def timing_body(timing: RequestReport, total_ns: int) -> dict[str, float]:
    """SIE's ``timing`` (TimingInfo) of a response body: the timing headers' phases, in ms, under
    the headers' names (``total_ms``, ``queue_ms``, ``tokenization_ms``, ``inference_ms``,
    ``postprocessing_ms``)."""
    return {"total_ms": round(total_ns / 1e6, 3), "queue_ms": round(timing.queue_ns / 1e6, 3),
            "tokenization_ms": round(timing.compute_input_ns / 1e6, 3),
            "inference_ms": round(timing.compute_infer_ns / 1e6, 3),
            "postprocessing_ms": round(timing.compute_output_ns / 1e6, 3)}


def trace_id(headers: Mapping[str, str], report: RequestReport | None = None) -> str:
    """The ``X-Trace-ID`` of a response (32 hex digits, W3C trace context): the request span's trace
    when tracing is on, else the caller's ``traceparent`` trace, else a new random id, so every
    response can be correlated with logs and callers even with tracing off."""
    if report is not None and report.trace_id:
        return report.trace_id
    context = get_current_span(_PROPAGATOR.extract(carrier={k.lower(): v for k, v in headers.items()})).get_span_context()
    number = context.trace_id if context.trace_id != INVALID_TRACE_ID else _IDS.generate_trace_id()
    return format(number, "032x")


def response_headers(headers: Mapping[str, str], report: RequestReport, total_ns: int) -> dict[str, str]:
    """The timing headers and ``X-Trace-ID`` of a successful response."""
    return {**timing_headers(report, total_ns), "X-Trace-ID": trace_id(headers, report)}


def semantic_timing(headers: Mapping[str, str], report: RequestReport, received_ns: int
                    ) -> tuple[dict[str, float], dict[str, str]]:
    """A semantic answer's ``timing`` body and its response headers (timing and ``X-Trace-ID``),
    for a request received at ``received_ns`` (``time.perf_counter_ns``)."""
    total = time.perf_counter_ns() - received_ns
    return timing_body(report, total), response_headers(headers, report, total)
