"""Triton's CPU metric families, read with psutil once every ``--metrics-interval-ms``.

Names and meanings follow Triton's ``docs/user_guide/metrics.md`` ("CPU Metrics"):
``nv_cpu_utilization`` is the busy share of all cores since the previous reading (0.0-1.0), from
the jiffies of ``/proc/stat`` at full precision as Triton's ``Metrics::CpuUtilization`` computes it
(psutil's ``cpu_percent`` rounds to 0.1%, which pins a busy host's readings to one value),
``nv_cpu_memory_total_bytes`` the machine's RAM and ``nv_cpu_memory_used_bytes`` total minus
available (``MemTotal - MemAvailable`` of ``/proc/meminfo``, as Triton computes it). Values are
read at the interval (``kserve_v2.app`` calls ``refresh``), not at each scrape, so a scrape sees the
last interval's utilization.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psutil
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


_BUSY = ("user", "nice", "system", "irq", "softirq", "steal")  # Triton's busy columns
_IDLE = ("idle", "iowait")


def utilization(new: Any, old: Any) -> float | None:
    """The busy share of CPU time between two ``psutil.cpu_times()`` readings (seconds per column, as
    ``/proc/stat`` has them): Triton's sum of user, nice, system, irq, softirq and steal over that plus
    idle and iowait, a column that went down counting 0. None when no time passed."""
    def spent(columns: tuple[str, ...]) -> float:
        return sum(max(getattr(new, c, 0.0) - getattr(old, c, 0.0), 0.0) for c in columns)

    busy, idle = spent(_BUSY), spent(_IDLE)
    return busy / (busy + idle) if busy + idle > 0 else None


class CpuCollector(Collector):
    """The three CPU gauges, as read by the last ``refresh``."""

    def __init__(self) -> None:
        self._times = psutil.cpu_times()  # the first reading starts the measuring interval
        self.utilization = 0.0
        self.total_bytes = self.used_bytes = 0
        self.refresh()

    def refresh(self) -> None:
        """Read utilization since the previous call, and memory now (a few /proc reads)."""
        times = psutil.cpu_times()
        share = utilization(times, self._times)
        if share is not None:  # else the last reading stands
            self.utilization, self._times = min(share, 1.0), times
        memory = psutil.virtual_memory()
        self.total_bytes = int(memory.total)
        self.used_bytes = max(int(memory.total) - int(memory.available), 0)

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=self.utilization)
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=self.total_bytes)
        yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=self.used_bytes)
