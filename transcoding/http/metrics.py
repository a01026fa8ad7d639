"""HTTP metrics as mistral.rs labels them (mistral.rs's HTTP API reference, ``docs/src/content/docs/reference/http-api.md``, Metrics).

``http_requests_total`` and ``http_request_duration_seconds`` by method, path, model and
status; ``http_requests_in_flight`` and ``http_request_body_bytes`` by method, path and model.
``path`` is the matched route template as users write it (``/v1/encode/{model}``, converters
dropped), never the concrete URI; unmatched requests are ``<unmatched>``; ``model`` is the model
the route resolved (an alias or a body's ``model`` becomes its repository name; the in-flight gauge
keeps the path's), else the path's model when the server knows it, ``unknown`` for any other name
(so clients cannot grow label cardinality), or ``none``. V2 health,
metrics, docs and status requests, ``/`` and CORS preflights are not counted (SIE's ``/healthz`` and
``/readyz`` are). A pure ASGI middleware.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import re
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kserve_v2.observability.metrics import histogram_family
from transcoding.http.body import header_values

EXCLUDED_PREFIXES = ("/v2/health/", "/metrics", "/docs", "/api-doc/", "/status", "/ws/")
EXCLUDED_PATHS = frozenset({"/"})
_CONVERTER = re.compile(r"\{(\w+):\w+\}")  # "{model:path}" -> "{model}": the template users see
BODY_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864, float("inf"))
# prometheus-client's default latency buckets (what its Histogram used here before)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, float("inf"))
# the buckets' ``le`` labels as prometheus-client's own Histogram writes them
BODY_EDGES = tuple(map(floatToGoString, BODY_BUCKETS))
DURATION_EDGES = tuple(map(floatToGoString, DURATION_BUCKETS))
FOLD_REQUESTS = 1024  # completed requests noted before they are added up (and at every scrape)


class HttpMetrics(Collector):
    """The four HTTP families, registered on the given registry.

    Plain numbers updated on the event loop and turned into metric families at scrape time (the
    scrape runs on the loop too): no lock and no child lookup per request. A completed request is
    only noted; the notes are added to the counters and histograms at each scrape, and every
    ``FOLD_REQUESTS`` requests. Exposed as prometheus-client's own Counter, Histogram (its default
    buckets) and Gauge would be.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests: dict[tuple[str, ...], int] = {}  # by method, path, model, status
        self._durations: dict[tuple[str, ...], list[float]] = {}  # bucket counts (+Inf last), then the sum
        self._in_flight: dict[tuple[str, ...], int] = {}  # by method, path, model
        self._bodies: dict[tuple[str, ...], list[float]] = {}
        self._completed: list[tuple[tuple[str, ...], float, int | None]] = []  # not yet added up
        registry.register(self)

    def started(self, labels: tuple[str, ...]) -> None:
        """A request with these (method, path, model) labels is being served."""
        self._in_flight[labels] = self._in_flight.get(labels, 0) + 1

    def ended(self, labels: tuple[str, ...]) -> None:
        """A request counted by ``started`` with these labels is no longer served."""
        self._in_flight[labels] -= 1

    def completed(self, labels: tuple[str, ...], seconds: float, body_bytes: int | None) -> None:
        """A request completed: ``labels`` are (method, path, model, status); ``body_bytes`` when known."""
        completed = self._completed
        completed.append((labels, seconds, body_bytes))
        if len(completed) >= FOLD_REQUESTS:
            self._fold()

    def _fold(self) -> None:
        """Add the completed requests noted so far to the counters and histograms."""
        completed, self._completed = self._completed, []
        requests = self._requests
        for labels, seconds, body_bytes in completed:
            requests[labels] = requests.get(labels, 0) + 1
            _observe(self._durations, labels, DURATION_BUCKETS, seconds)
            if body_bytes is not None:
                _observe(self._bodies, labels[:3], BODY_BUCKETS, body_bytes)

    def collect(self) -> Iterator[Metric]:
        """Called by the registry at each scrape."""
        self._fold()
        labels = ["method", "path", "model"]
        requests = CounterMetricFamily("http_requests", "Completed HTTP requests", labels=labels + ["status"])
        for values, count in self._requests.items():
            requests.add_metric(list(values), count)
        yield requests
        yield histogram_family("http_request_duration_seconds", "HTTP request latency in seconds",
                               labels + ["status"], DURATION_EDGES, self._durations)
        in_flight = GaugeMetricFamily("http_requests_in_flight", "HTTP requests being served", labels=labels)
        for values, count in self._in_flight.items():
            in_flight.add_metric(list(values), count)
        yield in_flight
        yield histogram_family("http_request_body_bytes", "HTTP request body size in bytes (when known)", labels,
                               BODY_EDGES, self._bodies)


def _observe(series: dict[tuple[str, ...], list[float]], labels: tuple[str, ...], bounds: tuple[float, ...],
             value: float) -> None:
    counts = series.get(labels)
    if counts is None:
        counts = series[labels] = [0.0] * (len(bounds) + 1)
    counts[bisect.bisect_left(bounds, value)] += 1  # the first bucket whose bound is >= value (``le``)
    counts[-1] += value


class HttpMetricsMiddleware:
    """Wraps the REST application.

    Args:
        app: the application; ``routes``: its routes, for pattern matching.
        metrics: the families to record in.
        is_known_model: whether a model name from a path is one the server knows.
    """

    def __init__(self, app: ASGIApp, metrics: HttpMetrics, routes: Sequence[BaseRoute],
                 is_known_model: Callable[[str], bool]) -> None:
        self.app = app
        self._metrics = metrics
        self._routes = routes
        self._is_known_model = is_known_model
        self._match = functools.lru_cache(maxsize=4096)(self._pattern)

    def _pattern(self, method: str, path: str) -> tuple[str, str]:
        """(route pattern, model from the path) for a request line; cached, bounded."""
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        for route in self._routes:
            match, child = route.matches(scope)
            if match is not Match.NONE:
                template = _CONVERTER.sub(r"{\1}", getattr(route, "path", "<unmatched>"))
                return template, child.get("path_params", {}).get("model", "none")
        return "<unmatched>", "none"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (scope["type"] != "http" or scope.get("method") == "OPTIONS" or path in EXCLUDED_PATHS
                or path.startswith(EXCLUDED_PREFIXES)):
            await self.app(scope, receive, send)
            return
        pattern, model = self._match(scope["method"], path)
        if model != "none" and not self._is_known_model(model):
            model = "unknown"
        labels = (scope["method"], pattern, model)
        state = scope.setdefault("state", {})  # a route that resolves its model sets request.state.model
        status = ["500"]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = str(message["status"])
            await send(message)

        metrics = self._metrics
        metrics.started(labels)
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:
            status[0] = "499"  # the client went away (transcoding.http.limits cancels its request)
            raise
        finally:
            metrics.ended(labels)
            if state.get("model"):
                labels = (scope["method"], pattern, state["model"])
            (length,) = header_values(scope, b"content-length")
            metrics.completed(labels + (status[0],), time.perf_counter() - started,
                              int(length) if length and length.isdigit() else None)
