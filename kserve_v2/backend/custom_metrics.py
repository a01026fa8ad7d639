"""Metric families that model code creates (Triton's custom metrics: ``TRITONSERVER_MetricFamilyNew``,
used by its python backend's ``pb_utils.MetricFamily``), exported in the server's ``/metrics``.

``CUSTOM_METRICS`` is the process's one store: backends create families and metrics in it from any
thread, and ``kserve_v2.app`` registers it as a collector on its Prometheus registry (with
``--workers N`` every replica has its own, and the replicas' samples are summed as the built-in
families'). A family belongs to the loaded model versions that created it (``owner``); it is
dropped, with its metrics, when the last of them unloads (``release``), as Triton's python backend
deletes a model's families when the model unloads. Counters are exposed untyped under their exact
names (as the built-in families: Triton's names have no ``_total``), gauges as gauges, histograms as
histograms with ``_bucket`` (cumulative, ``le``), ``_sum`` and ``_count``. Error texts are Triton's
(its core's ``src/metric_family.cc``).
"""

from __future__ import annotations

import bisect
import enum
import math
import threading
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.utils import floatToGoString


class MetricKind(enum.IntEnum):
    """Triton's ``TRITONSERVER_MetricKind``."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class MetricError(Exception):
    """A metric operation that Triton refuses (its text)."""


class CustomMetric:
    """One labelled series of a family; thread-safe. ``value`` is a counter's or gauge's number."""

    def __init__(self, family: CustomFamily, labels: dict[str, str], buckets: Sequence[float]) -> None:
        self.family = family
        self.labels = labels
        self.buckets = tuple(buckets)
        self._value = 0.0
        self._counts = [0] * (len(self.buckets) + 1)  # per bucket, the last one +Inf
        self._sum = 0.0

    def increment(self, value: float) -> None:
        """Add ``value`` (a counter: never negative).

        Raises:
            MetricError: a histogram; a negative counter increment (Triton's texts).
        """
        kind = self.family.kind
        if kind is MetricKind.HISTOGRAM:
            raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")
        if kind is MetricKind.COUNTER and value < 0:
            raise MetricError("TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                              "non-negative values.")
        with self.family.lock:
            self._value += value

    def set(self, value: float) -> None:
        """Set a gauge to ``value``.

        Raises:
            MetricError: a counter or histogram (Triton's texts).
        """
        if self.family.kind is not MetricKind.GAUGE:
            raise MetricError(f"TRITONSERVER_METRIC_KIND_{self.family.kind.name} does not support Set")
        with self.family.lock:
            self._value = value

    def observe(self, value: float) -> None:
        """Count ``value`` in a histogram (the first bucket whose upper bound is >= it).

        Raises:
            MetricError: a counter or gauge (Triton's texts).
        """
        if self.family.kind is not MetricKind.HISTOGRAM:
            raise MetricError(f"TRITONSERVER_METRIC_KIND_{self.family.kind.name} does not support Observe")
        with self.family.lock:
            self._counts[bisect.bisect_left(self.buckets, value)] += 1
            self._sum += value

    def value(self) -> float:
        """A counter's or gauge's number.

        Raises:
            MetricError: a histogram (Triton's text).
        """
        if self.family.kind is MetricKind.HISTOGRAM:
            raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")
        return self._value

    def histogram(self) -> tuple[list[tuple[str, float]], float]:
        """A histogram's cumulative buckets (upper bound as text, count; the last ``+Inf``) and sum."""
        with self.family.lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
            running += count
            cumulative.append((floatToGoString(bound), float(running)))
        return cumulative, total


class CustomFamily:
    """A family: its name, description, kind, metrics by labels and the owners that hold it."""

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.lock = threading.Lock()
        self.metrics: dict[tuple[tuple[str, str], ...], CustomMetric] = {}
        self.owners: set[object] = set()

    def metric(self, labels: dict[str, str], buckets: Sequence[float] | None) -> CustomMetric:
        """The series with ``labels`` (made on first use; the same labels give the same series).

        Raises:
            MetricError: buckets given for a counter or gauge, or missing for a histogram; labels
                other than those of the family's first series (Prometheus needs one label set).
        """
        if self.kind is MetricKind.HISTOGRAM and buckets is None:
            raise MetricError("Failed to create metric. Missing required buckets.")
        if self.kind is not MetricKind.HISTOGRAM and buckets is not None:
            raise MetricError("Failed to create metric. Unexpected buckets found.")
        key = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        with self.lock:
            found = self.metrics.get(key)
            if found is None:
                first = next(iter(self.metrics), None)
                if first is not None and [k for k, _ in first] != [k for k, _ in key]:
                    raise MetricError(f"Failed to create metric. Metric family '{self.name}' has the labels "
                                      f"{[k for k, _ in first]}, not {[k for k, _ in key]}.")
                found = self.metrics[key] = CustomMetric(self, dict(key), sorted(float(b) for b in buckets or ()))
            return found

    def collect(self) -> Metric:
        """The family as Prometheus exposes it."""
        with self.lock:
            metrics = list(self.metrics.items())
        names = [k for k, _ in metrics[0][0]] if metrics else []
        family: Metric
        if self.kind is MetricKind.HISTOGRAM:
            family = HistogramMetricFamily(self.name, self.description, labels=names)
            for key, metric in metrics:
                buckets, total = metric.histogram()
                family.add_metric([v for _, v in key], buckets, total)
            return family
        family = (GaugeMetricFamily if self.kind is MetricKind.GAUGE else UnknownMetricFamily)(
            self.name, self.description, labels=names)
        for key, metric in metrics:
            family.add_metric([v for _, v in key], metric.value())
        return family


class CustomMetrics:
    """The process's custom metric families (see the module docstring); a Prometheus collector."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, CustomFamily] = {}

    def family(self, name: str, description: str, kind: MetricKind, owner: object) -> CustomFamily:
        """The family ``name`` held by ``owner`` too (the same name and kind give the same family).

        Raises:
            MetricError: an empty name, or a name a family of another kind has.
        """
        if not name:
            raise MetricError("Error when creating MetricFamily: the name is empty")
        with self._lock:
            found = self._families.get(name)
            if found is None:
                found = self._families[name] = CustomFamily(name, description, kind)
            elif found.kind is not kind:
                raise MetricError(f"Error when creating MetricFamily: a metric family named '{name}' of kind "
                                  f"{found.kind.name} exists")
            found.owners.add(owner)
            return found

    def release(self, owner: object) -> None:
        """``owner`` unloaded: the families no other owner holds are dropped."""
        with self._lock:
            for name, family in list(self._families.items()):
                family.owners.discard(owner)
                if not family.owners:
                    del self._families[name]

    def collect(self) -> Iterator[Metric]:
        """Each family (called by the registry at each scrape)."""
        with self._lock:
            families = list(self._families.values())
        for family in families:
            yield family.collect()

    def describe(self) -> list[Metric]:
        """Nothing: the families come and go with models (the registry must not check names at registration)."""
        return []


CUSTOM_METRICS = CustomMetrics()
