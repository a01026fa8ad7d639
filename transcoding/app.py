"""The HTTP applications: every route of the HTTP port in one ASGI application (``build_app``),
and the metrics port's (``build_metrics_app``).

The HTTP port serves V2 and Triton's extensions (``transcoding.v2.rest``), SIE's semantic routes
(``transcoding.semantic.sie``), OpenAI's (``transcoding.semantic.embeddings``), the API's documentation
(``/docs``, ``/api-doc/openapi.json``), ``/metrics`` and the status page and socket. The infer
route, the hot one, is matched before Starlette's router walks its route table (``InferFirst``);
HTTP metrics wrap the whole application.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import swagger_ui_bundle
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from kserve_v2.service.inference_service import InferenceService
from transcoding.http.metrics import HttpMetrics, HttpMetricsMiddleware
from transcoding.http.routes import Handler, guarded
from transcoding.openapi import openapi_document
from transcoding.semantic.embeddings import openai_routes
from transcoding.semantic.rerank import rerank_routes
from transcoding.semantic.sie import sie_routes
from transcoding.status_page import status_page, status_socket
from transcoding.v2.rest import HEADER_LENGTH, V2Routes, v2_error

# response headers a browser script may read under CORS
EXPOSED_HEADERS = (HEADER_LENGTH, "X-Trace-ID", "X-Total-Time", "X-Queue-Time", "X-Tokenization-Time",
                   "X-Inference-Time", "X-Postprocessing-Time", "Retry-After")
# the infer routes' paths, as Starlette's router matches {model} and {version} (no slash in either)
_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
Exposition = Callable[[], Awaitable[CollectorRegistry]]  # the registry /metrics renders
Snapshot = Callable[[], Awaitable[dict[str, Any]]]  # the status object of /ws/status
# Swagger UI from the swagger-ui-bundle package's files: the page works with no network.
DOCS_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>kserve_v2 REST API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css"></head>
<body><div id="swagger-ui"></div><script src="/docs/assets/swagger-ui-bundle.js"></script>
<script>window.ui = SwaggerUIBundle({url: "/api-doc/openapi.json", dom_id: "#swagger-ui"});</script>
</body></html>
"""


def build_app(service: InferenceService, max_input_bytes: int, registry: CollectorRegistry | None = None,
              status: Snapshot | None = None, token_ids: str = "tiktoken", cors_origins: Sequence[str] = (),
              exposition: Exposition | None = None, header_forward: re.Pattern[str] | None = None) -> ASGIApp:
    """The ASGI application of every HTTP route: V2 (``V2Routes``), SIE (``transcoding.semantic.sie``),
    OpenAI (``transcoding.semantic.embeddings``), docs, metrics and status.

    Args:
        service: the one request path.
        max_input_bytes: largest request body, after decompression (413 above it).
        registry: the Prometheus registry to record HTTP metrics in, and to serve at /metrics
            unless ``exposition`` says otherwise; None when metrics are off.
        status: gives the status object (``kserve_v2.observability.status``) for /ws/status and the /status
            page (None: neither route).
        token_ids: how /v1/embeddings reads token-id input (``transcoding.semantic.token_ids``).
        cors_origins: origins allowed to call from a browser (Fetch standard CORS, answered by
            Starlette's ``CORSMiddleware``; ``*`` any); empty: no CORS headers and preflights get 405.
        exposition: gives the registry /metrics renders (every replica's, merged, with ``--workers``);
            None: ``registry``.
        header_forward: Triton's ``--http-header-forward-pattern`` (``V2Routes``); None: no header is forwarded.
    """
    v2 = V2Routes(service, max_input_bytes, header_forward)
    routes = [*v2.routes(), *docs_routes(openapi_document(metrics=registry is not None, status=status is not None)),
              *sie_routes(service, max_input_bytes), *openai_routes(service, max_input_bytes, token_ids),
              *rerank_routes(service, max_input_bytes)]
    if registry is not None:
        routes.append(Route("/metrics", metrics_endpoint(exposition or _fixed(registry)), methods=["GET"]))
    if status is not None:
        routes += [WebSocketRoute("/ws/status", status_socket(status)), Route("/status", status_page, methods=["GET"])]
    middleware = [Middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"], allow_headers=["*"],
                             expose_headers=list(EXPOSED_HEADERS))] if cors_origins else []
    app = Starlette(routes=routes, exception_handlers={HTTPException: _routing_error}, middleware=middleware)
    served = app if cors_origins else InferFirst(app, guarded(v2.infer, v2_error))  # with CORS, every request goes through it
    if registry is None:
        return served
    known = service.has_model if service is not None else lambda _: False  # (no service: route listings only)
    return HttpMetricsMiddleware(served, HttpMetrics(registry), app.routes, known)


async def _routing_error(request: Request, exc: Exception) -> Response:
    """Starlette's own HTTP errors in V2's envelope (an async handler: Starlette runs sync ones on a thread)."""
    return v2_error(request, exc)


def docs_routes(document: dict[str, Any]) -> list[BaseRoute]:
    """``/docs`` (Swagger UI from the swagger-ui-bundle package: no network) and ``/api-doc/openapi.json``."""

    async def docs(_: Request) -> Response:
        return HTMLResponse(DOCS_PAGE)

    async def openapi(_: Request) -> Response:
        return JSONResponse(document)

    return [Route("/docs", docs, methods=["GET"]), Route("/api-doc/openapi.json", openapi, methods=["GET"]),
            Mount("/docs/assets", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")]


class InferFirst:
    """``POST /v2/models/{model}[/versions/{version}]/infer`` straight to its handler; everything
    else through the router. The same route and handler the router has, without walking the
    route table per request (the infer route is the hot one).

    Attributes:
        app: the Starlette application; ``routes``: its routes.
    """

    def __init__(self, app: Starlette, infer: Handler) -> None:
        self.app = app
        self.routes = app.routes
        self._infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                model, version = match.groups()
                scope["path_params"] = {"model": model} if version is None else {"model": model, "version": version}
                response = await self._infer(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def metrics_endpoint(exposition: Exposition) -> Handler:
    """GET /metrics: the registry ``exposition`` gives, in OpenMetrics when ``Accept`` asks for
    ``application/openmetrics-text``, else in the Prometheus text format (prometheus-client's own
    content negotiation, ``choose_encoder``)."""

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(await exposition()), headers={"Content-Type": content_type})

    return metrics


def build_metrics_app(exposition: Exposition) -> Starlette:
    """The application of the metrics port: /metrics only, rendering the registry ``exposition`` gives."""
    return Starlette(routes=[Route("/metrics", metrics_endpoint(exposition), methods=["GET"])])


def _fixed(registry: CollectorRegistry) -> Exposition:
    async def exposition() -> CollectorRegistry:
        return registry

    return exposition
