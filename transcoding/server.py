"""Serve the REST application with uvicorn inside the server's own event loop.

The process owns SIGTERM/SIGINT (``kserve_v2.app`` drains gRPC and HTTP together), so uvicorn's
own signal capture is switched off; ``stop`` asks uvicorn to finish in-flight requests and close.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # signals belong to the application, which calls stop()


class HttpServer:
    """uvicorn (httptools) serving one ASGI app on ``address:port``."""

    def __init__(self, app: ASGIApp, address: str, port: int, exit_timeout_secs: int) -> None:
        config = uvicorn.Config(app, host=address, port=port, log_level="warning", access_log=False,
                                lifespan="off", http="httptools", timeout_graceful_shutdown=exit_timeout_secs)
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind and start serving; returns the bound port.

        Raises:
            RuntimeError: the address could not be bound.
        """
        self._task = asyncio.get_running_loop().create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                raise RuntimeError("the HTTP server could not start (is the port in use?)")
            await asyncio.sleep(0.01)
        return self._server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting connections, let in-flight requests finish, close."""
        self._server.should_exit = True
        if self._task is not None:
            await self._task
