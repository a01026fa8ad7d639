"""Access control for the HTTP listener: restricted API groups and the semantic routes' bearer token.

A pure ASGI layer, added only when ``--http-restricted-api`` or ``--api-key`` is set (without them
no request does any work here).

- ``--http-restricted-api=<groups>:<key>=<value>``: a call to a path in a restricted group without
  the header ``<key>: <value>`` gets 403 ``{"error": "This API is restricted, expecting header
  '<key>'"}`` (Triton's http_server.cc answer). Paths map onto Triton's groups as its HTTP routes do.
- ``--api-key``: the semantic and OpenAI routes (``/v1/...``) need ``Authorization: Bearer <key>``,
  as the OpenAI SDK sends it; a missing or wrong token gets 401 with ``WWW-Authenticate: Bearer``
  and OpenAI's error body (``{"error": {"message", "type", "param", "code"}}``, OpenAI API reference, Errors).
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from kserve_v2.settings.restrictions import Restriction

_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
# (pattern, group), first match wins; paths that match none (docs, metrics, status) are never restricted.
_ROUTES = [(re.compile(pattern), group) for pattern, group in (
    (r"/|/v2/health/.*|/healthz|/readyz|" + _MODEL + "/ready", "health"),
    (_MODEL + "/(?:infer|generate|generate_stream)|/v1/(?:encode|score|extract)/.*|/v1/embeddings", "inference"),
    (_MODEL + "/config", "model-config"),
    (r"/v2/models/stats|" + _MODEL + "/stats", "statistics"),
    (_MODEL + "/trace/setting|/v2/trace/setting", "trace"),
    (r"/v2|" + _MODEL + "|/v1/models(?:/.*)?", "metadata"),
    (r"/v2/repository/.*", "model-repository"),
    (r"/v2/(?:system|cuda)sharedmemory/.*", "shared-memory"),
    (r"/v2/logging", "logging"),
)]


def api_group(path: str) -> str | None:
    """Triton's API group of an HTTP path, or None for a path outside every group."""
    for pattern, group in _ROUTES:
        if pattern.fullmatch(path):
            return group
    return None


class AccessMiddleware:
    """Checks restricted groups and the bearer token before the application sees a request."""

    def __init__(self, app: ASGIApp, restrictions: Mapping[str, Restriction], api_key: str) -> None:
        self._app = app
        self._restrictions = restrictions
        self._token = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS":  # CORS preflights carry no credentials
            return await self._app(scope, receive, send)
        path: str = scope["path"]
        headers = dict(scope["headers"])  # lower-case names (ASGI)
        group = api_group(path) if self._restrictions else None
        rule = self._restrictions.get(group) if group else None
        if rule is not None and headers.get(rule.header.encode()) != rule.value.encode():
            body: dict[str, object] = {"error": f"This API is restricted, expecting header '{rule.header}'"}
            return await json_reply(send, 403, body, {})
        if self._token is not None and path.startswith("/v1/") and not hmac.compare_digest(
                headers.get(b"authorization", b""), self._token):
            body = {"error": {"message": "Missing or invalid API key: send 'Authorization: Bearer <key>'",
                              "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
            return await json_reply(send, 401, body, {"www-authenticate": "Bearer"})
        await self._app(scope, receive, send)


async def json_reply(send: Send, status: int, body: object, headers: dict[str, str]) -> None:
    """A JSON response; the request body, if any, is not read (uvicorn discards it as it arrives)."""
    content = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})
