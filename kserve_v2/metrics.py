"""Triton's inference metric families on an injected Prometheus registry.

Names, labels and units follow Triton's ``docs/user_guide/metrics.md`` so existing dashboards
keep working: per ``model`` and ``version``, request counts, cumulative durations in
microseconds, a pending-request gauge, and failures by ``reason`` (REJECTED, CANCELED, BACKEND,
OTHER). prometheus-client would print counters as ``<name>_total``, which Triton's names do not
have, so the counting families are exposed as untyped under their exact names (PromQL's
``rate()`` works the same). A latency histogram in seconds is added for percentiles. Nothing is
module-global: ``app.py`` builds the registry. Updated on the event loop by ``InferenceService``.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.registry import Collector

from kserve_v2.errors import ErrorCode

LABELS = ["model", "version"]
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# (name, help), in the order of the accumulator slots
FAMILIES = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (batch elements)"),
    ("nv_inference_exec_count", "Number of model executions performed"),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds"),
)
FAILURE = ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes")
_REASONS = {ErrorCode.UNAVAILABLE: "REJECTED", ErrorCode.CANCELLED: "CANCELED", ErrorCode.INTERNAL: "BACKEND"}


class InferenceMetrics(Collector):
    """The nv_inference_* families of every model version that has served a request.

    Plain numbers updated on the event loop and turned into metric families at scrape time:
    no lock or label lookup on the request path.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._values: defaultdict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * len(FAMILIES))
        self._failures: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self._pending: defaultdict[tuple[str, str], int] = defaultdict(int)
        # per version: counts per latency bucket (the last is +Inf), and the sum in seconds
        self._latency: defaultdict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * (len(LATENCY_BUCKETS) + 2))
        registry.register(self)

    def started(self, model: str, version: str) -> None:
        """A request for this version is pending."""
        self._pending[(model, version)] += 1

    def succeeded(self, model: str, version: str, batch_size: int, total_ns: int, queue_ns: int, input_ns: int,
                  infer_ns: int, output_ns: int) -> None:
        """Account a successful request (durations in ns; exported in us, latency in s)."""
        key = (model, version)
        self._pending[key] -= 1
        v = self._values[key]
        v[0] += 1
        v[1] += batch_size
        v[2] += 1
        v[3] += total_ns / 1000
        v[4] += queue_ns / 1000
        v[5] += input_ns / 1000
        v[6] += infer_ns / 1000
        v[7] += output_ns / 1000
        seconds = total_ns / 1e9
        latency = self._latency[key]
        latency[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        latency[-1] += seconds

    def failed(self, model: str, version: str, code: ErrorCode, total_ns: int) -> None:
        """Account a failed request under Triton's failure reason for its error class."""
        self._pending[(model, version)] -= 1
        self._values[(model, version)][3] += total_ns / 1000
        self._failures[(model, version, _REASONS.get(code, "OTHER"))] += 1

    def collect(self) -> Iterator[Metric]:
        """Called by the registry at each scrape."""
        for index, (name, text) in enumerate(FAMILIES):
            family = UnknownMetricFamily(name, text, labels=LABELS)
            for (model, version), values in self._values.items():
                family.add_metric([model, version], values[index])
            yield family
        failures = UnknownMetricFamily(FAILURE[0], FAILURE[1], labels=LABELS + ["reason"])
        for labels, count in self._failures.items():
            failures.add_metric(list(labels), count)
        yield failures
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model", labels=LABELS)
        for (model, version), count in self._pending.items():
            pending.add_metric([model, version], count)
        yield pending
        latency = HistogramMetricFamily("nv_inference_request_latency_seconds",
                                        "Latency of successful inference requests in seconds", labels=LABELS)
        bounds = [str(b) for b in LATENCY_BUCKETS] + ["+Inf"]
        for (model, version), counts in self._latency.items():
            latency.add_metric([model, version], list(zip(bounds, itertools.accumulate(counts[:-1]))), counts[-1])
        yield latency
