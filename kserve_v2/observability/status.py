"""The server status object of SIE's ``/ws/status`` (SIE's HTTP API reference), transport-free.

Server facts, every model with its state, pending requests and memory, the GPU list (empty on
CPU hosts), and the registry's counters and histograms. Built on the event loop, every 200 ms
per connected client.
"""

from __future__ import annotations

import getpass
import os
import time
from collections import defaultdict
from typing import Any

from prometheus_client import CollectorRegistry

from kserve_v2 import __version__
from kserve_v2.models.lifecycle import READY, RecordView, Records
from kserve_v2.observability.gpu import gpu_readings

# A version's state (Triton's names, the ``value`` of the state enum) -> the status object's model state.
_STATES = {"READY": "loaded", "LOADING": "loading", "UNLOADING": "unloading"}


class StatusReporter:
    """Builds status snapshots.

    Args:
        manager: the model lifecycle.
        registry: the Prometheus registry (None when metrics are off: no counters then).
        gpus: usable CUDA devices (0 on CPU hosts).
    """

    def __init__(self, manager: Records, registry: CollectorRegistry | None, gpus: int) -> None:
        self._manager = manager
        self._registry = registry
        self._gpus = gpus
        self._started = time.time()
        self._user = getpass.getuser()

    def snapshot(self) -> dict[str, Any]:
        """The status object (JSON-ready)."""
        models = [self._model(record) for record in self._manager.records()]
        counters, histograms = self._metrics()
        return {
            "timestamp": time.time(),
            "gpu": "cuda" if self._gpus else "",
            "loaded_models": [m["name"] for m in models if m["state"] == "loaded"],
            "server": {"version": __version__, "uptime_seconds": int(time.time() - self._started), "user": self._user,
                       "working_dir": os.getcwd(), "pid": os.getpid()},
            "gpus": gpu_readings() if self._gpus else [],
            "models": models,
            "counters": counters,
            "histograms": histograms,
        }

    @staticmethod
    def _model(record: RecordView) -> dict[str, Any]:
        states = {s.state.value for s in record.versions.values()}
        ready = [s.model for s in record.versions.values() if s.state.value == READY and s.model is not None]
        entry: dict[str, Any] = {
            "name": record.name,
            "state": next((_STATES[s] for s in _STATES if s in states), "available"),
            "versions": {str(v): s.state.value for v, s in sorted(record.versions.items())},
            "device": ("cuda:0" if any(m.on_gpu for m in ready) else "cpu") if ready else None,
            "memory_bytes": record.memory_bytes if ready else 0,
            "queue_depth": sum(m.inflight for m in ready),
            "queue_pending_items": sum(m.inflight for m in ready),
        }
        if record.config is not None:
            entry["config"] = {"platform": record.config.platform, "max_batch_size": record.config.max_batch_size}
        return entry

    def _metrics(self) -> tuple[dict[str, Any], dict[str, Any]]:
        counters: dict[str, Any] = {}
        histograms: dict[str, Any] = defaultdict(dict)
        if self._registry is None:
            return counters, {}
        for family in self._registry.collect():
            if family.type in ("counter", "unknown"):
                counters[family.name] = [{"labels": s.labels, "value": s.value} for s in family.samples
                                         if not s.name.endswith("_created")]
            elif family.type == "histogram":
                for sample in family.samples:
                    labels = {k: v for k, v in sample.labels.items() if k != "le"}
                    key = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                    entry = histograms[family.name].setdefault(key, {"labels": labels, "buckets": {}})
                    if sample.name.endswith("_bucket"):
                        entry["buckets"][sample.labels["le"]] = sample.value
                    elif sample.name.endswith("_count"):
                        entry["count"] = sample.value
                    elif sample.name.endswith("_sum"):
                        entry["sum"] = sample.value
        return counters, {name: list(entries.values()) for name, entries in histograms.items()}
