"""ErrorCode -> grpc.StatusCode: the one table (Triton's mapping: ``src/grpc/grpc_utils.cc`` in triton-inference-server/server)."""

from __future__ import annotations

import logging
from typing import Any, Final, NoReturn

import grpc

from kserve_v2.protocol.errors import ErrorCode, ServerError

log = logging.getLogger(__name__)

TO_GRPC: Final[dict[ErrorCode, grpc.StatusCode]] = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
}

INTERNAL_MESSAGE = "Internal server error"


def describe(err: BaseException) -> tuple[grpc.StatusCode, str]:
    """Status code and client-visible message for any exception.

    ``ServerError``s keep their message; anything else is a bug: it is logged once here with its
    traceback and reported as INTERNAL "Internal server error", never with internal details.
    """
    if isinstance(err, ServerError):
        log.info("gRPC request failed: %s: %s", TO_GRPC[err.code].name, err)
        return TO_GRPC[err.code], str(err)
    log.error("unexpected error while serving a request", exc_info=err)
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE


async def abort(context: grpc.aio.ServicerContext[Any, Any], err: BaseException) -> NoReturn:
    """End the RPC with the status ``describe`` gives."""
    code, message = describe(err)
    await context.abort(code, message)
