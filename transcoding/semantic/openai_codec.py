"""Bodies and errors of the OpenAI-shaped routes (``/v1/embeddings``, ``/v1/models``).

OpenAI's API answers JSON, so these routes do too; msgpack only when ``Accept`` asks for it
(SIE's clients). Errors are OpenAI's envelope ``{"error": {"message", "type", "param", "code"}}``
(OpenAI API reference, "Error codes"): ``invalid_request_error`` for 4xx, ``server_error`` for 5xx,
``model_not_found`` for an unknown model, ``context_length_exceeded`` for an over-long input; the
HTTP status comes from the one table in ``http.status``, as for every other route.
"""

from __future__ import annotations

import logging
from typing import Any

import msgpack
import msgpack_numpy
from starlette.requests import Request
from starlette.responses import Response

from kserve_v2.protocol.errors import InputTooLong, InvalidInput, NotFound, ServerError
from transcoding.http.json_io import json_text
from transcoding.http.status import TO_HTTP, error_headers
from transcoding.semantic.sie_codec import MSGPACK

log = logging.getLogger(__name__)


class InvalidField(InvalidInput):
    """A bad value of one request field, which OpenAI's envelope names in ``param`` (400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def wants_msgpack(request: Request) -> bool:
    """Whether ``Accept`` names msgpack (and not JSON): JSON is the default, as OpenAI answers."""
    accept = request.headers.get("accept", "")
    return MSGPACK in accept and "application/json" not in accept


def render(request: Request, content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``content`` as JSON, or as msgpack when the client asked for it."""
    if wants_msgpack(request):
        return Response(msgpack.packb(content, default=msgpack_numpy.encode), status, headers, MSGPACK)
    return Response(json_text(content), status, headers, "application/json")


def error_response(request: Request, err: BaseException, headers: dict[str, str] | None = None,
                   detail: bool = False) -> Response:
    """OpenAI's error envelope for any exception; unexpected ones are logged once and hidden as 500.

    ``detail``: the message also as a top-level ``detail`` string, the error body of Jina's
    reranker API (FastAPI's shape), which Jina's clients read on a failure; OpenAI's clients
    read ``error`` alone, so both kinds of client see the same message.
    """
    headers = dict(headers or {})
    if not isinstance(err, ServerError):
        log.error("unexpected error while serving a request", exc_info=err)
        error = {"message": "Internal server error", "type": "server_error", "param": None, "code": None}
        return render(request, _envelope(error, detail), 500, headers)
    status, code, param = TO_HTTP[err.code], None, getattr(err, "param", None)
    if isinstance(err, NotFound):
        code, param = "model_not_found", param or "model"
    elif isinstance(err, InputTooLong):
        code, param = "context_length_exceeded", param or "input"
    log.info("HTTP request failed: %d: %s", status, err)
    error = {"message": str(err), "type": "invalid_request_error" if status < 500 else "server_error",
             "param": param, "code": code}
    return render(request, _envelope(error, detail), status, {**headers, **error_headers(err)})


def _envelope(error: dict[str, Any], detail: bool) -> dict[str, Any]:
    return {"error": error, "detail": error["message"]} if detail else {"error": error}
