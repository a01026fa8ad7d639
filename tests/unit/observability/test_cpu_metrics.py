"""``cpu_metrics.utilization``: Triton's formula over two ``/proc/stat`` readings, at full precision."""

from __future__ import annotations

from types import SimpleNamespace

import psutil
import pytest

from kserve_v2.observability.cpu_metrics import CpuCollector, utilization


def _times(**columns: float) -> SimpleNamespace:
    base = dict.fromkeys(("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"), 0.0)
    return SimpleNamespace(**{**base, **columns})


def test_busy_columns_over_busy_and_idle_at_full_precision() -> None:
    old = _times(user=100.0, idle=100.0)
    new = _times(user=100.0 + 1.0, nice=0.5, system=0.25, irq=0.125, softirq=0.0625, steal=0.0625, idle=100.0 + 0.0003,
                 iowait=0.0001)
    busy = 1.0 + 0.5 + 0.25 + 0.125 + 0.0625 + 0.0625
    share = utilization(new, old)
    assert share == pytest.approx(busy / (busy + 0.0004), rel=1e-9)
    assert share < 0.9999 and round(share * 100, 1) == 100.0  # psutil's cpu_percent would have said 100.0


def test_a_column_that_went_down_counts_0_and_no_time_is_none() -> None:
    assert utilization(_times(user=5.0, idle=1.0), _times(user=6.0, idle=0.0)) == 0.0
    assert utilization(_times(user=1.0), _times(user=1.0)) is None


def test_the_collector_reads_this_host() -> None:
    collector = CpuCollector()
    collector.refresh()
    assert 0.0 <= collector.utilization <= 1.0
    assert 0 < collector.used_bytes <= collector.total_bytes == psutil.virtual_memory().total
