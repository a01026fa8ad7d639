"""Serve the REST application with uvicorn inside the server's own event loop.

The process owns SIGTERM/SIGINT (``kserve_v2.app`` drains gRPC and HTTP together), so uvicorn's
own signal capture is switched off. ``drain`` keeps the listener open but answers every new
request with 503 + ``Retry-After`` (liveness still answers), while requests already received,
including those still uploading, run to the end; ``stop`` then closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from kserve_v2.host.ports import shared_socket
from kserve_v2.protocol.errors import RETRY_AFTER_S
from transcoding.http.access import json_reply
from transcoding.http.limits import ConnectionLimits, LimitedHttpToolsProtocol, protocol_class

# Paths that keep answering during the drain: the process is alive until it exits.
LIVENESS_PATHS = frozenset({"/", "/v2/health/live", "/healthz"})


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for HTTPS; ``root_cert`` with ``mutual`` makes client certificates mandatory."""

    server_cert: str
    server_key: str
    root_cert: str = ""
    mutual: bool = False


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # signals belong to the application, which calls stop()


class HttpServer:
    """uvicorn (httptools, with ``ConnectionLimits``) serving one ASGI app on ``address:port``.

    Args:
        keepalive_timeout_s: idle seconds before a keep-alive connection is closed.
        max_connections: connections (or requests in progress) beyond which requests get 503
            (uvicorn's ``limit_concurrency``).
        tls: serve HTTPS (mutual TLS when ``tls.mutual``); None: plain HTTP.
        reuse_port: listen on a socket bound with ``SO_REUSEPORT``, sharing the port with the other
            replicas of ``--workers`` (``kserve_v2.host.ports``).
    """

    def __init__(self, app: ASGIApp, address: str, port: int, exit_timeout_secs: int,
                 limits: ConnectionLimits | None = None, keepalive_timeout_s: float = 65.0,
                 max_connections: int | None = None, tls: TlsFiles | None = None, reuse_port: bool = False) -> None:
        self._app = app
        self._shared = (address, port) if reuse_port else None
        # no proxy_headers: uvicorn would wrap the app to rewrite the client address from X-Forwarded-*
        # headers, which nothing here reads (no access log), at a cost on every request
        config = uvicorn.Config(app, host=address, port=port, log_level="warning", access_log=False,
                                proxy_headers=False, lifespan="off", http=protocol_class(limits or ConnectionLimits()),
                                timeout_graceful_shutdown=exit_timeout_secs,
                                # uvicorn annotates int but schedules it with loop.call_later (float seconds)
                                timeout_keep_alive=keepalive_timeout_s,  # type: ignore[arg-type]
                                limit_concurrency=max_connections,
                                ssl_certfile=tls.server_cert if tls else None, ssl_keyfile=tls.server_key if tls else None,
                                ssl_ca_certs=(tls.root_cert or None) if tls else None,
                                ssl_cert_reqs=ssl.CERT_REQUIRED if tls and tls.mutual else ssl.CERT_NONE)
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind and start serving; returns the bound port.

        Raises:
            RuntimeError: the address could not be bound.
        """
        try:
            sockets = None if self._shared is None else [shared_socket(*self._shared)]
        except OSError as err:
            raise RuntimeError(f"the HTTP server could not bind {self._shared}: {err}") from err
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets))
        while not self._server.started:
            if self._task.done():
                raise RuntimeError("the HTTP server could not start (is the port in use?)")
            await asyncio.sleep(0.01)
        port: int = self._server.servers[0].sockets[0].getsockname()[1]  # (host, port) for IPv4 and IPv6
        return port

    def drain(self) -> None:
        """From now on new requests get 503 + Retry-After (liveness paths still answer); requests
        already received keep the application. Costs nothing per request before it is called."""
        draining = _DrainingApp(self._app)
        self._server.config.loaded_app = draining  # connections opened from now on
        for connection in self._server.server_state.connections:
            if isinstance(connection, LimitedHttpToolsProtocol):  # (a WebSocket has run its app already)
                connection.app = draining  # open keep-alive connections; running requests keep theirs

    def in_flight(self) -> int:
        """HTTP requests whose headers are in and whose response is not complete (uploading, running
        or sending); WebSocket sessions do not count (``stop`` closes them)."""
        return sum(1 for connection in self._server.server_state.connections
                   if isinstance(connection, LimitedHttpToolsProtocol) and connection.cycle is not None
                   and not connection.cycle.response_complete)

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting connections, let in-flight requests finish (within ``grace_s``, by default
        the exit timeout given at construction), close; requests still running then are cancelled."""
        if grace_s is not None:
            # uvicorn annotates int but waits with asyncio.wait_for (float seconds)
            self._server.config.timeout_graceful_shutdown = max(grace_s, 0.0)  # type: ignore[assignment]
        self._server.should_exit = True
        if self._task is not None:
            await self._task


class _DrainingApp:
    """The application while draining: liveness passes, every other request gets 503 + Retry-After
    and a closed connection, WebSockets are refused."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1012})  # 1012: service restart
        if scope["type"] != "http" or scope["path"] in LIVENESS_PATHS:
            return await self._app(scope, receive, send)
        await json_reply(send, 503, {"error": "Server exiting: it has stopped accepting new requests"},
                         {"retry-after": str(RETRY_AFTER_S), "connection": "close"})
