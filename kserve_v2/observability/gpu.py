"""GPU readings through NVML (nvidia-ml-py): Triton's GPU metric families and the status GPU list.

Used only when CUDA is usable (``runtime.device.cuda_device_count() > 0``); CPU hosts never load NVML.
Triton's names (``metrics.md``): ``nv_gpu_utilization`` (0.0-1.0), ``nv_gpu_memory_total_bytes``,
``nv_gpu_memory_used_bytes``, labelled by ``gpu_uuid``. Like Triton, only the GPUs this process's
CUDA sees are reported: NVML lists every GPU of the host, so ``CUDA_VISIBLE_DEVICES`` is applied
to NVML's list (``visible_gpus``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import TypedDict

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class GpuReading(TypedDict):
    """One GPU as NVML reports it (the status object's ``gpus`` entries); ``index`` is its CUDA
    ordinal in this process (``cuda:<index>``), which ``CUDA_VISIBLE_DEVICES`` may renumber."""

    index: int
    name: str
    uuid: str
    utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: int


def visible_gpus(uuids: Sequence[str], cuda_visible: str | None) -> list[int]:
    """NVML indices of the GPUs CUDA makes visible, in CUDA's order.

    ``uuids``: NVML's UUID of each GPU (``GPU-...``), in NVML's order (PCI bus order).
    ``cuda_visible``: ``CUDA_VISIBLE_DEVICES`` (None: unset, every GPU). As CUDA reads it (CUDA C
    Programming Guide, "CUDA Environment Variables"): a comma-separated list of indices or of
    ``GPU-`` UUIDs (a unique prefix will do); the list ends at the first entry that names no GPU,
    or one named twice, so ``""`` and ``-1`` hide every GPU. An index counts in NVML's order,
    which is CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and, for GPUs of one model, by default.
    ``MIG-`` entries end the list here (MIG instances have no utilization of their own in NVML).
    """
    if cuda_visible is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for entry in (part.strip() for part in cuda_visible.split(",")):
        if entry.isdigit():
            index = int(entry) if int(entry) < len(uuids) else None
        elif entry[:4].upper() == "GPU-":
            matches = [i for i, uuid in enumerate(uuids) if uuid.lower().startswith(entry.lower())]
            index = matches[0] if len(matches) == 1 else None
        else:
            index = None
        if index is None or index in chosen:
            break
        chosen.append(index)
    return chosen


def gpu_readings() -> list[GpuReading]:
    """One entry per GPU this process's CUDA sees: index (its CUDA ordinal), name, uuid,
    utilization_percent, memory used/total bytes, temperature_c."""
    import pynvml  # only on GPU hosts

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    uuids = [_text(pynvml.nvmlDeviceGetUUID(handle)) for handle in handles]
    readings: list[GpuReading] = []
    for ordinal, index in enumerate(visible_gpus(uuids, os.environ.get("CUDA_VISIBLE_DEVICES"))):
        handle = handles[index]
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        readings.append({
            "index": ordinal,
            "name": _text(pynvml.nvmlDeviceGetName(handle)),
            "uuid": uuids[index],
            "utilization_percent": float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "memory_used_bytes": int(memory.used),
            "memory_total_bytes": int(memory.total),
            "temperature_c": int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
        })
    return readings


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
