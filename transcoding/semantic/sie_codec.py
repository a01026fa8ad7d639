"""Bodies and errors of the semantic endpoints (SIE's HTTP API reference).

Requests are msgpack when ``Content-Type`` says so, JSON otherwise, and are checked against
``body_schemas``: ``fastjsonschema`` (the schema compiled to Python once) accepts a valid body in
microseconds, and a body it rejects is checked again by ``jsonschema``, whose best match names
the error (the two agree on validity: ``tests/unit/transcoding/semantic/test_schema_validators.py``). Responses are
msgpack unless ``Accept`` asks for JSON; arrays in msgpack travel as msgpack-numpy encodes them (a
map with nd/type/kind/shape/data), in JSON as lists. Errors are SIE's envelope
``{"detail": {"code", "message", "model"?}}``: the HTTP status comes from the one table in
``http.status``, the code from the error's class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import fastjsonschema
import msgpack
import msgpack_numpy
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from starlette.requests import Request
from starlette.responses import Response

from kserve_v2.protocol.errors import InputTooLong, InternalError, InvalidInput, NotFound, Overloaded, ServerError, Unavailable
from transcoding.http.body import read_body
from transcoding.http.json_io import json_text, load_json
from transcoding.http.status import TO_HTTP, error_headers

log = logging.getLogger(__name__)

MSGPACK = "application/msgpack"
_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack", "application/vnd.msgpack")
# error class -> SIE code, most specific first; anything else is INTERNAL_ERROR
_CODES: tuple[tuple[type[ServerError], str], ...] = (
    (InputTooLong, "INPUT_TOO_LONG"), (NotFound, "MODEL_NOT_FOUND"), (Overloaded, "QUEUE_FULL"),
    (Unavailable, "MODEL_NOT_LOADED"),
    (InternalError, "INFERENCE_ERROR"), (ServerError, "INVALID_INPUT"))
_MAX_MESSAGE = 300


async def read_request(request: Request, schema: dict[str, Any], limit: int, drop_nulls: bool = False) -> dict[str, Any]:
    """The body as a dict, checked against ``schema``; with ``drop_nulls``, top-level null values
    are dropped first (a null field is a missing one, as Cohere's API reads them).

    Raises:
        TooLarge: over ``limit`` bytes -> 413.
        InvalidInput: malformed JSON or msgpack, or a body the schema rejects -> 400 INVALID_INPUT.
    """
    body = await read_body(request, limit)
    if request.headers.get("content-type", "").split(";")[0].strip().lower() in _MSGPACK_TYPES:
        try:
            value = msgpack.unpackb(body, raw=False, strict_map_key=True)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as err:
            raise InvalidInput(f"malformed msgpack body ({type(err).__name__}: {err})"[:_MAX_MESSAGE]) from None
    else:
        value = load_json(body)
    if drop_nulls and isinstance(value, dict):
        value = {key: item for key, item in value.items() if item is not None}
    check_schema(schema, value)
    checked: dict[str, Any] = value  # the schemas' top level is an object
    return checked


def check_schema(schema: dict[str, Any], value: Any) -> None:
    """Check a parsed body against one of ``body_schemas``'s schemas (see the module docstring).

    Raises:
        InvalidInput: the body breaks the schema, naming where and why (jsonschema's best match) -> 400.
    """
    try:
        _compiled(schema)(value)
        return
    except fastjsonschema.JsonSchemaValueException:
        pass
    error = best_match(Draft202012Validator(schema).iter_errors(value))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "body"
        raise InvalidInput(f"invalid request at '{where}': {error.message}"[:_MAX_MESSAGE])


_COMPILED: dict[int, tuple[dict[str, Any], Callable[[Any], Any]]] = {}


def _compiled(schema: dict[str, Any]) -> Callable[[Any], Any]:
    """``schema`` compiled by fastjsonschema, once per schema object (they are module constants)."""
    entry = _COMPILED.get(id(schema))
    if entry is None or entry[0] is not schema:
        entry = _COMPILED[id(schema)] = (schema, fastjsonschema.compile(schema))
    return entry[1]


def wants_json(request: Request) -> bool:
    """Whether the client asked for JSON (``Accept: application/json``); msgpack is the default."""
    accept = request.headers.get("accept", "")
    return "application/json" in accept and MSGPACK not in accept


def render(request: Request, content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``content`` (dicts, lists, numpy arrays) as msgpack or JSON, as negotiated."""
    if wants_json(request):
        return Response(json_text(content), status, headers, "application/json")
    return Response(msgpack.packb(content, default=msgpack_numpy.encode), status, headers, MSGPACK)


def error_response(request: Request, err: BaseException, model: str | None = None) -> Response:
    """SIE's error envelope for any exception; unexpected ones are logged once and hidden as 500."""
    if not isinstance(err, ServerError):
        log.error("unexpected error while serving a request", exc_info=err)
        detail: dict[str, Any] = {"code": "INTERNAL_ERROR", "message": "Internal server error"}
        status = 500
    else:
        code = next(code for kind, code in _CODES if isinstance(err, kind))
        detail, status = {"code": code, "message": str(err)}, TO_HTTP[err.code]
        log.info("HTTP request failed: %d %s: %s", status, code, err)
    if model is not None:
        detail["model"] = model
    return render(request, {"detail": detail}, status, error_headers(err))
