"""What every HTTP route family shares: one exception handler per error envelope.

A route family (V2 and Triton's extensions, SIE's semantic routes, OpenAI's routes) wraps each of
its handlers with ``guarded`` and its own ``ErrorEnvelope``: whatever a handler raises becomes that
family's error body, with the HTTP status of the one table in ``http.status``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

Handler = Callable[[Request], Awaitable[Response]]
# (request, what its handler raised) -> the family's error answer
ErrorEnvelope = Callable[[Request, Exception], Response]


def guarded(handler: Handler, envelope: ErrorEnvelope) -> Handler:
    """``handler`` with every exception it raises answered by ``envelope``."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as err:  # noqa: BLE001 - every failure becomes the family's envelope
            return envelope(request, err)

    return endpoint


def resolved_model(request: Request) -> str | None:
    """The model a route resolved (``request.state.model``, also HTTP metrics' label), else its path's."""
    model = request.scope.get("state", {}).get("model")
    return model if isinstance(model, str) and model else request.path_params.get("model")
