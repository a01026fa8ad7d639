"""The error tables: every ErrorCode maps to one gRPC status and one HTTP status (Triton's mapping,
``HttpCodeFromError`` in Triton's HTTP server), and unexpected errors are hidden as INTERNAL / 500."""

from __future__ import annotations

import json
import logging

import grpc
import pytest

from kserve_v2.grpc import status
from kserve_v2.protocol import errors
from kserve_v2.protocol.errors import ErrorCode
from kserve_v2.request.budget import MemoryBusy
from transcoding.http import status as http_status

EXPECTED = {
    ErrorCode.INVALID_ARGUMENT: ("INVALID_ARGUMENT", 400),
    ErrorCode.NOT_FOUND: ("NOT_FOUND", 404),
    ErrorCode.UNAVAILABLE: ("UNAVAILABLE", 503),
    ErrorCode.UNIMPLEMENTED: ("UNIMPLEMENTED", 501),
    ErrorCode.RESOURCE_EXHAUSTED: ("RESOURCE_EXHAUSTED", 413),
    ErrorCode.ALREADY_EXISTS: ("ALREADY_EXISTS", 400),
    ErrorCode.DEADLINE_EXCEEDED: ("DEADLINE_EXCEEDED", 504),
    ErrorCode.CANCELLED: ("CANCELLED", 499),
    ErrorCode.INTERNAL: ("INTERNAL", 500),
}
ERRORS = [errors.InvalidInput, errors.InputTooLong, errors.NotFound, errors.Unavailable, errors.NotLoaded,
          errors.Overloaded, errors.Unsupported, errors.AlreadyExists, errors.TooLarge, errors.Cancelled,
          errors.InternalError, MemoryBusy]


def test_tables_cover_every_code() -> None:
    assert set(status.TO_GRPC) == set(ErrorCode) == set(http_status.TO_HTTP)
    for code, (grpc_name, http) in EXPECTED.items():
        assert status.TO_GRPC[code].name == grpc_name
        assert http_status.TO_HTTP[code] == http


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_each_error_keeps_its_message(error: type[errors.ServerError]) -> None:
    grpc_code, message = status.describe(error("bad thing"))
    assert (grpc_code.name, message) == (EXPECTED[error.code][0], "bad thing")
    response = http_status.error_response(error("bad thing"))
    assert response.status_code == EXPECTED[error.code][1]
    assert json.loads(response.body) == {"error": "bad thing"}
    retry = error in (errors.Overloaded, errors.NotLoaded, MemoryBusy)
    assert ("retry-after" in response.headers) is retry


def test_unexpected_errors_are_hidden(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert status.describe(KeyError("secret/path")) == (grpc.StatusCode.INTERNAL, status.INTERNAL_MESSAGE)
        response = http_status.error_response(RuntimeError("secret/path"))
    assert response.status_code == 500 and b"secret" not in response.body
    assert "secret/path" in caplog.text  # logged once, with its traceback, for the operator
