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
import functools
import re
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

EXCLUDED_PREFIXES = ("/v2/health/", "/metrics", "/docs", "/api-doc/", "/status", "/ws/")
EXCLUDED_PATHS = frozenset({"/"})
_CONVERTER = re.compile(r"\{(\w+):\w+\}")  # "{model:path}" -> "{model}": the template users see
BODY_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)


class HttpMetrics:
    """The four HTTP families, registered on the given registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["method", "path", "model"]
        self.requests = Counter("http_requests", "Completed HTTP requests", labels + ["status"], registry=registry)
        self.duration = Histogram("http_request_duration_seconds", "HTTP request latency in seconds",
                                  labels + ["status"], registry=registry)
        self.in_flight = Gauge("http_requests_in_flight", "HTTP requests being served", labels, registry=registry)
        self.body = Histogram("http_request_body_bytes", "HTTP request body size in bytes (when known)", labels,
                              buckets=BODY_BUCKETS, registry=registry)


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
        self._children: dict[tuple[str, ...], tuple[Counter, Histogram]] = {}
        self._gauges: dict[tuple[str, ...], Gauge] = {}  # in-flight children by labels
        self._bodies: dict[tuple[str, ...], Histogram] = {}  # body size children by labels
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

    def _completed(self, labels: tuple[str, ...]) -> tuple[Counter, Histogram]:
        children = self._children.get(labels)
        if children is None:
            children = self._children[labels] = (self._metrics.requests.labels(*labels),
                                                 self._metrics.duration.labels(*labels))
        return children

    def _in_flight(self, labels: tuple[str, ...]) -> Gauge:
        child = self._gauges.get(labels)
        if child is None:
            child = self._gauges[labels] = self._metrics.in_flight.labels(*labels)
        return child

    def _body(self, labels: tuple[str, ...]) -> Histogram:
        child = self._bodies.get(labels)
        if child is None:
            child = self._bodies[labels] = self._metrics.body.labels(*labels)
        return child

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

        in_flight = self._in_flight(labels)
        in_flight.inc()
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:
            status[0] = "499"  # the client went away (transcoding.http_limits cancels its request)
            raise
        finally:
            in_flight.dec()
            if state.get("model"):
                labels = (scope["method"], pattern, state["model"])
            length = next((value for key, value in scope.get("headers", ()) if key == b"content-length"), b"")
            if length.isdigit():
                self._body(labels).observe(int(length))
            requests, duration = self._completed(labels + (status[0],))
            requests.inc()
            duration.observe(time.perf_counter() - started)
