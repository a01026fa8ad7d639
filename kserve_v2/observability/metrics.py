"""Triton's inference metric families, and per-API totals for other exporters, on an injected
Prometheus registry.

Names, labels and units follow Triton's ``docs/user_guide/metrics.md`` so existing dashboards
keep working: per ``model`` and ``version``, request counts, cumulative durations in
microseconds, a pending-request gauge, and failures by ``reason`` (REJECTED, CANCELED, BACKEND,
OTHER). prometheus-client would print counters as ``<name>_total``, which Triton's names do not
have, so the counting families are exposed as untyped under their exact names (PromQL's
``rate()`` works the same). A latency histogram in seconds is added for percentiles. Triton's
``--metrics-config`` (``kserve_v2.settings.metrics_config``) drops the cumulative latency counters, adds
its latency summaries (quantiles over a sliding window, ``kserve_v2.observability.summaries``) or its
first-response histogram. Nothing is module-global:
``app.py`` builds the registry. Updated on the event loop by ``InferenceService``.

The same requests are also totalled per (model, API): ``infer`` for V2, the semantic routes name
theirs. ``InferenceMetrics.api_totals`` hands those totals to exporters outside the core (the
semantic routes' SIE families are rendered in ``transcoding.semantic.sie_metrics``).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import (GaugeMetricFamily, HistogramMetricFamily, Metric,
                                   UnknownMetricFamily)
from prometheus_client.registry import Collector

from kserve_v2.observability.summaries import WindowQuantiles, summary_family
from kserve_v2.protocol.errors import ErrorCode
from kserve_v2.protocol.statistics import RequestReport
from kserve_v2.settings.metrics_config import MetricsConfig

LABELS = ["model", "version"]
_Labels = TypeVar("_Labels", bound=tuple[str, ...])  # one series' label values
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_EDGES = (*map(str, LATENCY_BUCKETS), "+Inf")  # the buckets' ``le`` labels
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
_LATENCY_COUNTERS = range(3, 8)  # FAMILIES' cumulative durations, left out with counter_latencies=false
# (name, help, column of a row's observations): Triton's latency summaries, in microseconds
SUMMARIES = (
    ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds", 3),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds", 4),
    ("nv_inference_compute_input_summary_us", "Summary of compute input duration in microseconds", 5),
    ("nv_inference_compute_infer_summary_us", "Summary of compute inference duration in microseconds", 6),
    ("nv_inference_compute_output_summary_us", "Summary of inference compute output duration in microseconds", 7),
)
SUMMARY_AGE_BUCKETS = 5  # prometheus-cpp's default, as Triton has it
FIRST_RESPONSE = ("nv_inference_first_response_histogram_ms", "Duration from request to first response in milliseconds")
FIRST_RESPONSE_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)  # ms, Triton's default buckets
FIRST_RESPONSE_EDGES = (*map(str, FIRST_RESPONSE_BUCKETS), "+Inf")
V2_API = "infer"  # the API name of V2 inference requests
# phase -> index in (batch_size, total, queue, input, infer, output)
PHASES = (("queue", 2), ("input", 3), ("infer", 4), ("output", 5), ("total", 1))
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_EDGES = (*map(str, BATCH_BUCKETS), "+Inf")
# successes whose numbers are kept before they are added to the series (and at every scrape)
FOLD_REQUESTS = 1024
_COLUMNS = 8
# PHASES' index (into batch size, total, queue, input, infer, output) -> column of a row's observations
_DURATION_COLUMNS = (0, 3, 4, 5, 6, 7)
_REASONS = {ErrorCode.UNAVAILABLE: "REJECTED", ErrorCode.CANCELLED: "CANCELED", ErrorCode.INTERNAL: "BACKEND"}
_FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")  # Triton's, in its order
FAILURE_LABELS = ["model", "reason", "version"]  # in Triton's exposition order (sorted by name)


class InferenceMetrics(Collector):
    """The nv_inference_* families of every model version that has served a request.

    Plain numbers updated on the event loop and turned into metric families at scrape time:
    no lock or label lookup on the request path.

    Args:
        registry: the registry to report in.
        config: which latency families to export (Triton's ``--metrics-config``).
    """

    def __init__(self, registry: CollectorRegistry, config: MetricsConfig | None = None) -> None:
        self._config = config = config or MetricsConfig()
        self._values: defaultdict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * len(FAMILIES))
        self._failures: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # (model, reason, version)
        self._pending: defaultdict[tuple[str, str], int] = defaultdict(int)
        # per version: counts per latency bucket (the last is +Inf), and the sum in seconds
        self._latency: defaultdict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * (len(LATENCY_BUCKETS) + 2))
        self._first_response: defaultdict[tuple[str, str], list[float]] = defaultdict(
            lambda: [0.0] * (len(FIRST_RESPONSE_BUCKETS) + 2))
        # per API: requests per (model, api, status); per (model, api, phase) latency buckets + sum;
        # per model batch-size buckets + sum, and tokens
        self._requests: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self._phases: defaultdict[tuple[str, str, str], list[float]] = defaultdict(
            lambda: [0.0] * (len(LATENCY_BUCKETS) + 2))
        self._batches: defaultdict[str, list[float]] = defaultdict(lambda: [0.0] * (len(BATCH_BUCKETS) + 2))
        self._tokens: defaultdict[str, int] = defaultdict(int)
        # per (model, version, api): the slots above that a success updates, and its observations
        self._rows: dict[tuple[str, str, str], _Row] = {}
        # per summary of SUMMARIES (when on): (model, version) -> its window
        self._summaries: list[dict[tuple[str, str], WindowQuantiles]] = [{} for _ in SUMMARIES] if (
            config.summary_latencies) else []
        registry.register(self)

    def loaded(self, versions: Iterable[tuple[str, str]]) -> None:
        """Give each (model, version label) its series at 0, as Triton's model reporter does when a
        version loads: the counters, every failure ``reason`` and, when on, the latency summaries
        (quantiles NaN until a request is seen)."""
        for key in versions:
            self._values[key]  # noqa: B018 -- the defaultdict creates the zeroed series
            for reason in _FAILURE_REASONS:
                self._failures[(key[0], reason, key[1])] += 0
            for windows in self._summaries:
                if key not in windows:
                    windows[key] = WindowQuantiles(self._config.summary_max_age_secs, SUMMARY_AGE_BUCKETS)

    def started(self, model: str, version: str) -> None:
        """A request for this version is pending."""
        self._pending[(model, version)] += 1

    def succeeded(self, model: str, version: str, api: str, report: RequestReport) -> None:
        """Account a successful request (durations in ns; exported in us, latency in s).

        The request's numbers are appended to its row and folded into the counters and histogram
        buckets in bulk (``_fold``: at every scrape, and every ``FOLD_REQUESTS`` requests).
        """
        self._pending[(model, version)] -= 1
        row = self._rows.get((model, version, api))
        if row is None:
            row = self._rows[(model, version, api)] = self._row(model, version, api)
        observed = row.observed
        observed += (report.batch_size, report.executions, report.tokens, report.total_ns, report.queue_ns,
                     report.compute_input_ns, report.compute_infer_ns, report.compute_output_ns)
        if len(observed) >= FOLD_REQUESTS * _COLUMNS:
            self._fold(row)

    def _row(self, model: str, version: str, api: str) -> _Row:
        key = (model, version)
        row = _Row(model, api, self._values[key], self._latency[key],
                   [(self._phases[(model, api, phase)], _DURATION_COLUMNS[index]) for phase, index in PHASES],
                   self._batches[model])
        for windows, (_, _, column) in zip(self._summaries, SUMMARIES, strict=False):
            if key not in windows:  # one window per version, whatever API its requests came through
                windows[key] = WindowQuantiles(self._config.summary_max_age_secs, SUMMARY_AGE_BUCKETS)
            row.summaries.append((windows[key], column))
        if self._config.histogram_latencies:
            row.first_response = self._first_response[key]
        return row

    def fold(self) -> None:
        """Add every request so far to the series (each scrape does; ``kserve_v2.app`` also calls it
        every metrics interval, so that the summaries' sliding windows see requests when they happen)."""
        for row in self._rows.values():
            self._fold(row)

    def _fold(self, row: _Row) -> None:
        """Add a row's observations to the counters and histograms."""
        if not row.observed:
            return
        data = np.array(row.observed, dtype=np.float64).reshape(-1, _COLUMNS)
        row.observed.clear()
        sums = data.sum(axis=0).tolist()
        count = len(data)
        v = row.values
        v[0] += count
        v[1] += sums[0]
        v[2] += sums[1]
        for column in range(3, _COLUMNS):  # the durations: the same slots of the Triton families, in us
            v[column] += sums[column] / 1000
        seconds = data[:, 3:] / 1e9
        _observe_all(row.latency, LATENCY_BUCKETS, seconds[:, 0])
        for counts, column in row.phases:
            _observe_all(counts, LATENCY_BUCKETS, seconds[:, column - 3])
        _observe_all(row.batches, BATCH_BUCKETS, data[:, 0])
        if row.first_response is not None:
            _observe_all(row.first_response, FIRST_RESPONSE_BUCKETS, data[:, 3] / 1e6)
        for window, column in row.summaries:
            window.observe(data[:, column] / 1000)  # microseconds
        self._requests[(row.model, row.api, "ok")] += count
        self._tokens[row.model] += int(sums[2])

    def failed(self, model: str, version: str, api: str, code: ErrorCode, total_ns: int) -> None:
        """Account a failed request under Triton's failure reason for its error class."""
        self._pending[(model, version)] -= 1
        self._requests[(model, api, "error")] += 1
        self._values[(model, version)][3] += total_ns / 1000
        self._failures[(model, _REASONS.get(code, "OTHER"), version)] += 1

    def collect(self) -> Iterator[Metric]:
        """Called by the registry at each scrape (on the event loop, as the updates)."""
        self.fold()
        for index, (name, text) in enumerate(FAMILIES):
            if index in _LATENCY_COUNTERS and not self._config.counter_latencies:
                continue
            family = UnknownMetricFamily(name, text, labels=LABELS)
            for (model, version), values in self._values.items():
                family.add_metric([model, version], values[index])
            yield family
        failures = UnknownMetricFamily(FAILURE[0], FAILURE[1], labels=FAILURE_LABELS)
        for labels, count in self._failures.items():
            failures.add_metric(list(labels), count)
        yield failures
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model", labels=LABELS)
        for (model, version), count in self._pending.items():
            pending.add_metric([model, version], count)
        yield pending
        yield histogram_family("nv_inference_request_latency_seconds", "Latency of successful inference requests in seconds",
                               LABELS, LATENCY_EDGES, dict(self._latency))
        if self._config.histogram_latencies:
            yield histogram_family(*FIRST_RESPONSE, LABELS, FIRST_RESPONSE_EDGES, dict(self._first_response))
        for windows, (name, text, _) in zip(self._summaries, SUMMARIES, strict=False):
            yield summary_family(name, text, LABELS, windows, self._config.summary_quantiles)

    def api_totals(self) -> ApiTotals:
        """The per-API totals, with every request so far folded in (live views, read on the event loop)."""
        self.fold()
        pending: defaultdict[str, int] = defaultdict(int)
        for (model, _), count in self._pending.items():
            pending[model] += count
        return ApiTotals(self._requests, self._phases, self._batches, self._tokens, pending)


@dataclass(frozen=True, slots=True)
class ApiTotals:
    """Requests totalled per (model, API), for exporters outside the core.

    Attributes:
        requests: (model, api, ``ok`` | ``error``) -> requests.
        phases: (model, api, phase) -> successful requests per ``LATENCY_BUCKETS`` bucket (``le``,
            not cumulative; the slot after the bounds is +Inf), then the sum in seconds; phases
            ``queue``, ``input``, ``infer``, ``output`` and ``total``.
        batches: model -> successful requests per ``BATCH_BUCKETS`` bucket of their batch size,
            then the sum of batch sizes.
        tokens: model -> tokens the text models' requests held.
        pending: model -> requests in flight.
    """

    requests: Mapping[tuple[str, str, str], int]
    phases: Mapping[tuple[str, str, str], list[float]]
    batches: Mapping[str, list[float]]
    tokens: Mapping[str, int]
    pending: Mapping[str, int]


class _Row:
    """The series one (model, version, api) success updates, and its observations not yet
    added to them: ``_COLUMNS`` numbers a request (batch size, executions, tokens, then the
    durations in ns: total, queue, input, infer, output). ``summaries`` and ``first_response``
    are the optional latency families' series ((window, column), bucket counts), empty / None when off."""

    __slots__ = ("model", "api", "values", "latency", "phases", "batches", "observed", "summaries", "first_response")

    def __init__(self, model: str, api: str, values: list[float], latency: list[float],
                 phases: list[tuple[list[float], int]], batches: list[float]) -> None:
        self.model, self.api = model, api
        self.values, self.latency, self.phases, self.batches = values, latency, phases, batches
        self.observed: list[int] = []
        self.summaries: list[tuple[WindowQuantiles, int]] = []
        self.first_response: list[float] | None = None


def _observe_all(counts: list[float], bounds: tuple[float, ...], values: np.ndarray) -> None:
    """Count each value in its ``le`` bucket (the slot after the bounds is +Inf) and add them to the sum (last slot)."""
    buckets = np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds) + 1)
    for index, count in enumerate(buckets.tolist()):
        counts[index] += count
    counts[-1] += float(values.sum())


def histogram_family(name: str, text: str, labels: list[str], edges: Sequence[str],
                     series: Mapping[_Labels, list[float]]) -> HistogramMetricFamily:
    """A histogram family, one series per label values, from per-bucket counts (not cumulative)
    followed by the sum; ``edges`` are the buckets' ``le`` labels, ``+Inf`` last."""
    family = HistogramMetricFamily(name, text, labels=labels)
    for label_values, counts in series.items():
        family.add_metric(list(label_values), list(zip(edges, itertools.accumulate(counts[:-1]), strict=True)), counts[-1])
    return family
