"""The custom metric store behind ``pb_utils.MetricFamily``: Triton's refusals, histogram buckets as
Triton exposes them, families shared by name and dropped when their last owner unloads, and metrics
refused once their ``MetricFamily`` object is gone."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kserve_v2.backend.custom_metrics import CustomMetrics, MetricError, MetricKind


def _exposed(store: CustomMetrics) -> str:
    registry = CollectorRegistry()
    registry.register(store)
    return generate_latest(registry).decode()


def test_counter_gauge_and_histogram_are_exposed() -> None:
    store, owner = CustomMetrics(), object()
    families = [store.family(name, name.title(), kind, owner) for name, kind in
                (("hits", MetricKind.COUNTER), ("level", MetricKind.GAUGE), ("sizes", MetricKind.HISTOGRAM))]
    counter = families[0].metric({"model": "m"}, None)
    gauge = families[1].metric({"model": "m"}, None)
    histogram = families[2].metric({"model": "m"}, [1, 10])
    counter.increment(2)
    gauge.set(-4)
    gauge.increment(1)
    for value in (0.5, 1, 7, 100):
        histogram.observe(value)
    families[0].metric({}, None)  # a series with other label names
    text = _exposed(store)
    assert 'hits{model="m"} 2.0' in text and "\nhits 0.0\n" in text and "hits_total" not in text  # no _total
    assert 'level{model="m"} -3.0' in text
    assert 'sizes_bucket{le="1",model="m"} 2.0' in text  # an observation equal to a bound is in its bucket
    assert 'sizes_bucket{le="10",model="m"} 3.0' in text  # Triton's le: 10, not 10.0
    assert 'sizes_bucket{le="+Inf",model="m"} 4.0' in text
    assert 'sizes_sum{model="m"} 108.5' in text


def test_triton_refusals() -> None:
    store, owner = CustomMetrics(), object()
    counters, histograms = store.family("c", "", MetricKind.COUNTER, owner), store.family("h", "", MetricKind.HISTOGRAM, owner)
    counter = counters.metric({}, None)
    with pytest.raises(MetricError, match="can only be incremented monotonically by non-negative values"):
        counter.increment(-1)
    with pytest.raises(MetricError, match="TRITONSERVER_METRIC_KIND_COUNTER does not support Set"):
        counter.set(1)
    with pytest.raises(MetricError, match="Missing required buckets"):
        histograms.metric({}, None)
    for buckets in ([2.5, 0.1], [1, 1, 2]):
        with pytest.raises(MetricError, match="^Error when creating Metric: Bucket Boundaries must be strictly sorted$"):
            histograms.metric({}, buckets)
    histograms.metric({}, [])  # one +Inf bucket
    with pytest.raises(MetricError, match="Unexpected buckets found"):
        store.family("g", "", MetricKind.GAUGE, owner).metric({}, [1.0])
    with pytest.raises(MetricError, match="^Error when creating MetricFamily: Family name already exists with "
                                          "different type$"):
        store.family("c", "", MetricKind.GAUGE, owner)
    for name in ("", "9lives", "a b", "__reserved"):
        with pytest.raises(MetricError, match="^Error when creating MetricFamily: Invalid metric name$"):
            store.family(name, "", MetricKind.GAUGE, owner)


def test_families_are_shared_and_go_with_their_last_owner() -> None:
    store, first, second = CustomMetrics(), object(), object()
    one_family = store.family("shared", "first description", MetricKind.COUNTER, first)
    same_family = store.family("shared", "second description", MetricKind.COUNTER, second)
    one, same = one_family.metric({"a": "1"}, None), same_family.metric({"a": "1"}, None)
    one.increment(2)
    assert same.value() == 2  # one series
    assert "# HELP shared first description" in _exposed(store)
    store.release(first)
    assert [family.name for family in store.collect()] == ["shared"]
    store.release(second)
    assert list(store.collect()) == []


def test_a_metric_of_a_deleted_family_is_refused_and_its_series_goes_with_its_last_family() -> None:
    store, owner = CustomMetrics(), object()
    first, second = (store.family("f", "", MetricKind.GAUGE, owner) for _ in range(2))
    gone, kept = first.metric({"a": "1"}, None), second.metric({"a": "1"}, None)
    only_first = first.metric({"a": "2"}, None)
    del first
    for operation in (gone.value, lambda: gone.set(1), only_first.value):
        with pytest.raises(MetricError, match="^Invalid metric operation as the corresponding 'MetricFamily' has been "
                                              "deleted"):
            operation()
    kept.set(3)
    text = _exposed(store)
    assert 'f{a="1"} 3.0' in text and 'a="2"' not in text  # the series only the deleted family used is gone
    del second
    assert list(store.collect()) == []  # no series: the family is left out, as prometheus-cpp does
