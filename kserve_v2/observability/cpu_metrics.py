"""Triton's CPU metric families, read with psutil once every ``--metrics-interval-ms``.

Names and meanings follow Triton's ``docs/user_guide/metrics.md`` ("CPU Metrics"):
``nv_cpu_utilization`` is the busy share of all cores since the previous reading (0.0-1.0),
``nv_cpu_memory_total_bytes`` the machine's RAM and ``nv_cpu_memory_used_bytes`` total minus
available (``MemTotal - MemAvailable`` of ``/proc/meminfo``, as Triton computes it). Values are
read at the interval (``kserve_v2.app`` calls ``refresh``), not at each scrape, so a scrape sees the
last interval's utilization.
"""

from __future__ import annotations

from collections.abc import Iterator

import psutil
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class CpuCollector(Collector):
    """The three CPU gauges, as read by the last ``refresh``."""

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # the first call starts the measuring interval
        self.utilization = 0.0
        self.total_bytes = self.used_bytes = 0
        self.refresh()

    def refresh(self) -> None:
        """Read utilization since the previous call, and memory now (a few /proc reads)."""
        self.utilization = min(max(psutil.cpu_percent(interval=None) / 100, 0.0), 1.0)
        memory = psutil.virtual_memory()
        self.total_bytes = int(memory.total)
        self.used_bytes = max(int(memory.total) - int(memory.available), 0)

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=self.utilization)
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=self.total_bytes)
        yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=self.used_bytes)
