"""The custom metric store behind ``pb_utils.MetricFamily``: Triton's refusals, histogram buckets as
Prometheus exposes them, families shared by name and dropped when their last owner unloads."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kserve_v2.backend.custom_metrics import CustomMetrics, MetricError, MetricKind


def test_counter_gauge_and_histogram_are_exposed() -> None:
    store, owner = CustomMetrics(), object()
    counter = store.family("hits", "Hits", MetricKind.COUNTER, owner).metric({"model": "m"}, None)
    gauge = store.family("level", "Level", MetricKind.GAUGE, owner).metric({"model": "m"}, None)
    histogram = store.family("sizes", "Sizes", MetricKind.HISTOGRAM, owner).metric({"model": "m"}, [10, 1])
    counter.increment(2)
    gauge.set(-4)
    gauge.increment(1)
    for value in (0.5, 1, 7, 100):
        histogram.observe(value)
    registry = CollectorRegistry()
    registry.register(store)
    text = generate_latest(registry).decode()
    assert 'hits{model="m"} 2.0' in text and "hits_total" not in text  # Triton's names have no _total
    assert 'level{model="m"} -3.0' in text
    assert 'sizes_bucket{le="1.0",model="m"} 2.0' in text  # an observation equal to a bound is in its bucket
    assert 'sizes_bucket{le="10.0",model="m"} 3.0' in text
    assert 'sizes_bucket{le="+Inf",model="m"} 4.0' in text
    assert 'sizes_sum{model="m"} 108.5' in text


def test_triton_refusals() -> None:
    store, owner = CustomMetrics(), object()
    counter = store.family("c", "", MetricKind.COUNTER, owner).metric({}, None)
    with pytest.raises(MetricError, match="can only be incremented monotonically by non-negative values"):
        counter.increment(-1)
    with pytest.raises(MetricError, match="TRITONSERVER_METRIC_KIND_COUNTER does not support Set"):
        counter.set(1)
    with pytest.raises(MetricError, match="Missing required buckets"):
        store.family("h", "", MetricKind.HISTOGRAM, owner).metric({}, None)
    with pytest.raises(MetricError, match="Unexpected buckets found"):
        store.family("g", "", MetricKind.GAUGE, owner).metric({}, [1.0])
    with pytest.raises(MetricError, match="of kind COUNTER exists"):
        store.family("c", "", MetricKind.GAUGE, owner)


def test_families_are_shared_and_go_with_their_last_owner() -> None:
    store, first, second = CustomMetrics(), object(), object()
    one = store.family("shared", "", MetricKind.COUNTER, first).metric({"a": "1"}, None)
    same = store.family("shared", "", MetricKind.COUNTER, second).metric({"a": "1"}, None)
    assert one is same
    store.release(first)
    assert [family.name for family in store.collect()] == ["shared"]
    store.release(second)
    assert list(store.collect()) == []
