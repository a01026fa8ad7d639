"""Metric families that model code creates (Triton's custom metrics: ``TRITONSERVER_MetricFamilyNew``,
used by its python backend's ``pb_utils.MetricFamily``), exported in the server's ``/metrics``.

Each server has one store, ``CustomMetrics`` (its ``BackendHost.custom_metrics``,
``kserve_v2.backend.host``): backends create families and metrics in it from any thread, and
``kserve_v2.app`` registers it as a collector on the server's Prometheus registry (with
``--workers N`` every replica has its own, and the replicas' samples are summed as the built-in
families'). A family belongs to the loaded model versions that created it (``owner``); it is
dropped, with its metrics, when the last of them unloads (``release``), as Triton's python backend
deletes a model's families when the model unloads. Each ``MetricFamily`` object model code makes
has a view of its family (``CustomFamily``), as in Triton's python backend: the series its metrics
use stay while it lives; once it is gone (garbage collected) its metrics refuse every operation
with Triton's text, and a series no view uses any more leaves the exposition (a family with no
series is left out, as prometheus-cpp does). The series of a family may have different label names.
Counters are exposed untyped under their exact names (as the built-in families: Triton's names have
no ``_total``), gauges as gauges, histograms as histograms with ``_bucket`` (cumulative, ``le`` as
Triton writes it: ``bound_text``), ``_sum`` and ``_count``. Error texts are Triton's (its core's
``src/metric_family.cc``, and prometheus-cpp's that it reports).
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
import re
import threading
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.utils import floatToGoString


# a metric name as Prometheus's data model allows it (prometheus-cpp's CheckMetricName, with no leading "__")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class MetricKind(enum.IntEnum):
    """Triton's ``TRITONSERVER_MetricKind``."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class MetricError(Exception):
    """A metric operation that Triton refuses (its text)."""


class _Series:
    """One labelled series of a family; thread-safe. ``value`` is a counter's or gauge's number."""

    def __init__(self, family: _Family, labels: dict[str, str], buckets: Sequence[float]) -> None:
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
            cumulative.append((bound_text(bound), float(running)))
        return cumulative, total


def bound_text(bound: float) -> str:
    """A histogram bucket's upper bound as Triton's ``le`` label value: prometheus-cpp's (v1.0.1, Triton's
    third_party) ``%.16g`` of a finite bound, so ``1`` and ``2.5`` (prometheus-client's would be ``1.0``);
    ``+Inf`` for the last bucket."""
    return f"{bound:.16g}" if math.isfinite(bound) else floatToGoString(bound)


class _Family:
    """A family: its name, description, kind, series by labels (each with the number of views that
    use it) and the owners that hold it."""

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.lock = threading.RLock()  # a view collected by the garbage collector may release while it is held
        self.series: dict[tuple[tuple[str, str], ...], _Series] = {}
        self._uses: dict[_Series, int] = {}
        self.owners: set[object] = set()

    def hold(self, labels: dict[str, str], buckets: Sequence[float] | None, held: set[_Series]) -> _Series:
        """The series with ``labels`` (made on first use; the same labels give the same series), used by
        the view whose series are ``held`` from now on. Series of one family may have different label
        names, as in Triton (prometheus-cpp's families allow it).

        Raises:
            MetricError: buckets given for a counter or gauge, or missing for a histogram, or not
                strictly increasing (Triton's texts; an empty list is a histogram of one ``+Inf`` bucket).
        """
        if self.kind is MetricKind.HISTOGRAM and buckets is None:
            raise MetricError("Failed to create metric. Missing required buckets.")
        if self.kind is not MetricKind.HISTOGRAM and buckets is not None:
            raise MetricError("Failed to create metric. Unexpected buckets found.")
        bounds = [float(bound) for bound in buckets or ()]
        if any(lower >= upper for lower, upper in itertools.pairwise(bounds)):  # prometheus-cpp's check and text
            raise MetricError("Error when creating Metric: Bucket Boundaries must be strictly sorted")
        key = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        with self.lock:
            found = self.series.get(key)
            if found is None:
                found = self.series[key] = _Series(self, dict(key), bounds)
            if found not in held:
                held.add(found)
                self._uses[found] = self._uses.get(found, 0) + 1
            return found

    def release(self, held: set[_Series]) -> None:
        """A view that used the series ``held`` is gone: the series no view uses any more are dropped."""
        with self.lock:
            for series in held:
                self._uses[series] -= 1
                if not self._uses[series]:
                    del self._uses[series], self.series[tuple(sorted(series.labels.items()))]

    def collect(self) -> Metric:
        """The family as Prometheus exposes it: each series' samples made by prometheus-client's family
        of the kind for its own label names, gathered in one family."""
        with self.lock:
            series_now = list(self.series.items())
        family = self._exposed([])
        for key, series in series_now:
            one, values = self._exposed([k for k, _ in key]), [v for _, v in key]
            if isinstance(one, HistogramMetricFamily):
                buckets, total = series.histogram()
                one.add_metric(values, buckets, total)
            else:
                one.add_metric(values, series.value())
            family.samples.extend(one.samples)
        return family

    def _exposed(self, names: list[str]) -> GaugeMetricFamily | HistogramMetricFamily | UnknownMetricFamily:
        """prometheus-client's family of this kind, with label names ``names`` (counters untyped: see the
        module docstring)."""
        if self.kind is MetricKind.HISTOGRAM:
            return HistogramMetricFamily(self.name, self.description, labels=names)
        if self.kind is MetricKind.GAUGE:
            return GaugeMetricFamily(self.name, self.description, labels=names)
        return UnknownMetricFamily(self.name, self.description, labels=names)


class CustomFamily:
    """A ``MetricFamily`` object's view of its family (Triton's python backend ``MetricFamily``):
    ``metric`` gives its metrics. When the view is garbage collected (the model deleted its
    ``MetricFamily``), its metrics are cleared, as Triton's are, and the series only it used go."""

    def __init__(self, family: _Family) -> None:
        self._family = family
        self._held: set[_Series] = set()
        self._deleted = threading.Event()

    def metric(self, labels: dict[str, str], buckets: Sequence[float] | None) -> CustomMetric:
        """A metric of the series with ``labels`` (see ``_Family.hold``; its errors)."""
        return CustomMetric(self._family.hold(labels, buckets, self._held), self._deleted)

    def __del__(self) -> None:
        self._deleted.set()
        self._family.release(self._held)


class CustomMetric:
    """A ``Metric`` object's series (Triton's python backend ``Metric``): its operations, refused once
    the ``MetricFamily`` that made it is gone.

    Raises:
        MetricError: the ``MetricFamily`` is gone (Triton's text, "Invalid metric operation as the
            corresponding 'MetricFamily' has been deleted. ..."); the series' own refusals.
    """

    def __init__(self, series: _Series, deleted: threading.Event) -> None:
        self._series, self._deleted = series, deleted

    def increment(self, value: float) -> None:
        """Add ``value`` to a counter or gauge."""
        self._live().increment(value)

    def set(self, value: float) -> None:
        """Set a gauge to ``value``."""
        self._live().set(value)

    def observe(self, value: float) -> None:
        """Count ``value`` in a histogram."""
        self._live().observe(value)

    def value(self) -> float:
        """A counter's or gauge's number."""
        return self._live().value()

    def _live(self) -> _Series:
        if self._deleted.is_set():
            raise MetricError("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
                              "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
                              "been deleted.")
        return self._series


class CustomMetrics:
    """One server's custom metric families (see the module docstring); a Prometheus collector."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}

    def family(self, name: str, description: str, kind: MetricKind, owner: object) -> CustomFamily:
        """A new ``MetricFamily`` object's view of the family ``name``, held by ``owner`` too (the same
        name and kind give the same family; the first description stays).

        Raises:
            MetricError: a name Prometheus does not allow (empty, other characters than
                ``[a-zA-Z0-9_:]``, a leading digit or ``__``), or a name a family of another kind has
                (prometheus-cpp's texts, as Triton reports them).
        """
        if not _METRIC_NAME.fullmatch(name) or name.startswith("__"):
            raise MetricError("Error when creating MetricFamily: Invalid metric name")
        with self._lock:
            found = self._families.get(name)
            if found is None:
                found = self._families[name] = _Family(name, description, kind)
            elif found.kind is not kind:
                raise MetricError("Error when creating MetricFamily: Family name already exists with different type")
            found.owners.add(owner)
        return CustomFamily(found)

    def release(self, owner: object) -> None:
        """``owner`` unloaded: the families no other owner holds are dropped."""
        with self._lock:
            for name, family in list(self._families.items()):
                family.owners.discard(owner)
                if not family.owners:
                    del self._families[name]

    def collect(self) -> Iterator[Metric]:
        """Each family that has series (called by the registry at each scrape; prometheus-cpp leaves a
        family with none out too)."""
        with self._lock:
            families = list(self._families.values())
        for family in families:
            exposed = family.collect()
            if exposed.samples:
                yield exposed

    def describe(self) -> list[Metric]:
        """Nothing: the families come and go with models (the registry must not check names at registration)."""
        return []
