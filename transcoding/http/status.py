"""ErrorCode -> HTTP status: the one table for every HTTP route, and the error body.

Triton's mapping (``HttpCodeFromError`` in Triton's ``src/http_server.cc``), except where HTTP has
a more precise code: 413 for an oversized request, 499/504 for cancel/deadline.
Bodies are ``{"error": "<message>"}`` (V2 protocol).
"""

from __future__ import annotations

import logging
from typing import Final

from starlette.responses import JSONResponse

from kserve_v2.protocol.errors import ErrorCode, ServerError

log = logging.getLogger(__name__)

TO_HTTP: Final[dict[ErrorCode, int]] = {
    ErrorCode.INVALID_ARGUMENT: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNIMPLEMENTED: 501,
    ErrorCode.RESOURCE_EXHAUSTED: 413,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.CANCELLED: 499,
    ErrorCode.INTERNAL: 500,
    ErrorCode.UNKNOWN: 400,
}


def error_headers(err: BaseException) -> dict[str, str]:
    """Headers that go with an error: ``Retry-After`` when the error class has a ``retry_after``
    (a full queue or request memory pool, a model that is not loaded: SIE's MODEL_NOT_LOADED)."""
    retry_after = err.retry_after if isinstance(err, ServerError) else None
    return {} if retry_after is None else {"Retry-After": str(retry_after)}


def error_response(err: BaseException) -> JSONResponse:
    """The HTTP answer for any exception; unexpected ones are logged once and hidden as 500."""
    if isinstance(err, ServerError):
        log.info("HTTP request failed: %d: %s", TO_HTTP[err.code], err)
        return JSONResponse({"error": str(err)}, status_code=TO_HTTP[err.code], headers=error_headers(err))
    log.error("unexpected error while serving a request", exc_info=err)
    return JSONResponse({"error": "Internal server error"}, status_code=500)
