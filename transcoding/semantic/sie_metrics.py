"""SIE's metric families (SIE's HTTP API reference, "Metrics"), for SIE dashboards.

Rendered at each scrape from the core's per-API totals (``InferenceMetrics.api_totals``) and the
model lifecycle's records, on the same registry as Triton's families:
``sie_requests_total`` (model, endpoint, status), ``sie_request_duration_seconds`` (model,
endpoint, phase), ``sie_batch_size``, ``sie_tokens_processed_total`` and ``sie_queue_depth``
(model), ``sie_model_loaded`` and ``sie_model_memory_bytes`` (model, device). SIE's ``endpoint``
label is the API a request came through: ``infer`` for V2 inference, ``encode``, ``score``,
``extract``, ``embeddings``, ``rerank``, ``tokenize`` for the semantic routes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kserve_v2.models.lifecycle import READY, Records
from kserve_v2.observability.metrics import BATCH_EDGES, LATENCY_EDGES, InferenceMetrics, histogram_family

# SIE's phase names (as in the semantic routes' timing headers) for the core's phases
PHASE_NAMES = {"queue": "queue", "input": "tokenization", "infer": "inference", "output": "postprocessing",
               "total": "total"}


class SieMetrics(Collector):
    """SIE's request, batch, token, queue and model families, read at each scrape."""

    def __init__(self, metrics: InferenceMetrics, records: Records, registry: CollectorRegistry) -> None:
        self._metrics, self._records = metrics, records
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """Called by the registry at each scrape (on the event loop, where the totals are updated)."""
        totals = self._metrics.api_totals()
        requests = CounterMetricFamily("sie_requests", "Total request count", labels=["model", "endpoint", "status"])
        for model, api in {key[:2] for key in totals.requests}:
            for status in ("ok", "error"):
                requests.add_metric([model, api, status], totals.requests.get((model, api, status), 0))
        yield requests
        yield histogram_family("sie_request_duration_seconds", "Latency by phase", ["model", "endpoint", "phase"],
                               LATENCY_EDGES, {(model, api, PHASE_NAMES[phase]): counts
                                                 for (model, api, phase), counts in totals.phases.items()})
        yield histogram_family("sie_batch_size", "Batch size distribution", ["model"], BATCH_EDGES,
                               {(model,): counts for model, counts in totals.batches.items()})
        tokens = CounterMetricFamily("sie_tokens_processed", "Total tokens processed", labels=["model"])
        for model, count in totals.tokens.items():
            tokens.add_metric([model], count)
        yield tokens
        depth = GaugeMetricFamily("sie_queue_depth", "Pending items per model", labels=["model"])
        for model, pending in totals.pending.items():
            depth.add_metric([model], pending)
        yield depth
        yield from self._models()

    def _models(self) -> Iterator[Metric]:
        loaded = GaugeMetricFamily("sie_model_loaded", "Model load status (1/0)", labels=["model", "device"])
        memory = GaugeMetricFamily("sie_model_memory_bytes", "Memory per model (resident memory its load added)",
                                   labels=["model", "device"])
        for record in self._records.records():
            ready = [s.model for s in record.versions.values() if s.state.value == READY and s.model is not None]
            device = "cuda:0" if any(m.on_gpu for m in ready) else "cpu"
            loaded.add_metric([record.name, device], 1 if ready else 0)
            memory.add_metric([record.name, device], record.memory_bytes if ready else 0)
        yield loaded
        yield memory
