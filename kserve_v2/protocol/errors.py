"""Transport-neutral errors.

Every error the server reports is a ``ServerError`` carrying an ``ErrorCode``; the gRPC layer
(``kserve_v2.grpc.status``) maps each code to a ``grpc.StatusCode`` with one table, following
Triton's mapping (``src/grpc/grpc_utils.cc`` in triton-inference-server/server). Messages follow Triton's texts
where tritonclient users or Triton's examples check them. This module imports no transport.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class ErrorCode(enum.Enum):
    """The error classes of the V2 protocol, named after the gRPC codes they map to."""

    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    UNIMPLEMENTED = "unimplemented"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    ALREADY_EXISTS = "already_exists"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    INTERNAL = "internal"
    UNKNOWN = "unknown"


# seconds a client is asked to wait before retrying a request turned away for now (HTTP ``Retry-After``)
RETRY_AFTER_S = 1


class ServerError(Exception):
    """Base of every error reported to a client; ``str(err)`` is the client-visible message.

    Attributes:
        code: the error class, which the transports' tables map to a gRPC status and an HTTP code.
        retry_after: seconds after which the same request may succeed (HTTP ``Retry-After``), or
            None when retrying the same request will not help.
    """

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    retry_after: ClassVar[int | None] = None


class InvalidInput(ServerError):
    """Malformed request: shape, datatype, size, names, parameters (INVALID_ARGUMENT / 400)."""

    code = ErrorCode.INVALID_ARGUMENT


class InputTooLong(InvalidInput):
    """A text longer than the model's context under the ``error`` overflow policy (INVALID_ARGUMENT / 400;
    SIE's INPUT_TOO_LONG)."""


class NotFound(ServerError):
    """Unknown model or version (NOT_FOUND / 404)."""

    code = ErrorCode.NOT_FOUND


class Unavailable(ServerError):
    """Model not ready, control mode forbids the call, or server exiting (UNAVAILABLE / 503)."""

    code = ErrorCode.UNAVAILABLE


class NotLoaded(Unavailable):
    """A model in the repository with no READY version, asked for by a semantic route (UNAVAILABLE /
    503 with Retry-After; SIE's MODEL_NOT_LOADED)."""

    retry_after = RETRY_AFTER_S


class Overloaded(Unavailable):
    """A full request queue, or another capacity in use for now (UNAVAILABLE / 503 with Retry-After,
    as Triton answers a full queue; SIE's QUEUE_FULL)."""

    retry_after = RETRY_AFTER_S


class Unsupported(ServerError):
    """A feature this server does not provide (UNIMPLEMENTED / 501)."""

    code = ErrorCode.UNIMPLEMENTED


class AlreadyExists(ServerError):
    """A name that is already taken, e.g. a shared memory region (ALREADY_EXISTS / 400, Triton)."""

    code = ErrorCode.ALREADY_EXISTS


class TooLarge(ServerError):
    """A request over a configured size limit (RESOURCE_EXHAUSTED / 413)."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class Cancelled(ServerError):
    """Work stopped because every request waiting for it was cancelled (CANCELLED / 499)."""

    code = ErrorCode.CANCELLED


class Unknown(ServerError):
    """An error of no other class, as a python model reports it with ``TritonError.UNKNOWN``
    (UNKNOWN / 400, Triton)."""

    code = ErrorCode.UNKNOWN


class InternalError(ServerError):
    """Execution or load failure inside the server (INTERNAL / 500)."""

    code = ErrorCode.INTERNAL
