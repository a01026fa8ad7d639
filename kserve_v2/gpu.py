"""GPU readings through NVML (nvidia-ml-py): Triton's GPU metric families and the status GPU list.

Used only when CUDA is usable (``runtime.device.cuda_device_count() > 0``); CPU hosts never load NVML.
Triton's names (``metrics.md``): ``nv_gpu_utilization`` (0.0-1.0), ``nv_gpu_memory_total_bytes``,
``nv_gpu_memory_used_bytes``, labelled by ``gpu_uuid``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypedDict

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class GpuReading(TypedDict):
    """One GPU as NVML reports it (the status object's ``gpus`` entries)."""

    index: int
    name: str
    uuid: str
    utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: int


def gpu_readings() -> list[GpuReading]:
    """One entry per GPU: index, name, uuid, utilization_percent, memory used/total bytes, temperature_c."""
    import pynvml  # only on GPU hosts

    pynvml.nvmlInit()
    readings: list[GpuReading] = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        readings.append({
            "index": index,
            "name": name.decode() if isinstance(name, bytes) else name,
            "uuid": pynvml.nvmlDeviceGetUUID(handle),
            "utilization_percent": float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "memory_used_bytes": int(memory.used),
            "memory_total_bytes": int(memory.total),
            "temperature_c": int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
        })
    return readings


class GpuCollector(Collector):
    """Triton's GPU families, read from NVML at each scrape."""

    def collect(self) -> Iterator[Metric]:
        readings = gpu_readings()
        families: tuple[tuple[str, str, Callable[[GpuReading], float]], ...] = (
            ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", lambda r: r["utilization_percent"] / 100),
            ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", lambda r: r["memory_total_bytes"]),
            ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", lambda r: r["memory_used_bytes"]),
        )
        for name, text, read in families:
            family = GaugeMetricFamily(name, text, labels=["gpu_uuid"])
            for reading in readings:
                family.add_metric([reading["uuid"]], read(reading))
            yield family
