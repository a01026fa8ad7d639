"""Request bodies in (size limit, Content-Encoding) and response bodies out (Accept-Encoding), for every HTTP route."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from kserve_v2.protocol.errors import ErrorCode, InvalidInput, ServerError, TooLarge


class ClientGone(ServerError):
    """The connection closed before the body was in: the client left, or a body timeout closed it (499)."""

    code = ErrorCode.CANCELLED


async def read_body(request: Request, limit: int) -> bytes:
    """The body, decompressed (Content-Encoding gzip or deflate), never more than ``limit`` bytes.

    Raises:
        TooLarge: over the limit before or after decompression -> 413.
        InvalidInput: corrupt compressed data or an unknown encoding -> 400.
        ClientGone: the connection closed while the body was read -> 499 (nobody reads it).
    """
    declared, encoding = header_values(request.scope, b"content-length", b"content-encoding")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"request body of {declared.decode()} bytes is over the {limit}-byte limit (--http-max-input-size)")
    chunks, size = [], 0
    receive = request.receive  # the ASGI messages themselves: no stream generator per request
    while True:
        message = await receive()
        if message["type"] != "http.request":  # http.disconnect
            raise ClientGone("the connection closed before the request body was received")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"request body is over the {limit}-byte limit (--http-max-input-size)")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    encoding = (encoding or b"identity").strip().lower()
    if encoding in (b"", b"identity"):
        return body
    if encoding not in (b"gzip", b"deflate"):
        raise InvalidInput(f"unsupported Content-Encoding '{encoding.decode('latin-1')}': use gzip or deflate")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == b"gzip" else zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as err:
        raise InvalidInput(f"corrupt {encoding.decode()} body: {err}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise TooLarge(f"decompressed request body is over the {limit}-byte limit (--http-max-input-size)")
    return data


def header_values(scope: Scope, *names: bytes) -> list[bytes | None]:
    """The first value of each named header (lower-case names, as ASGI gives them), or None."""
    found: list[bytes | None] = [None] * len(names)
    for key, value in scope["headers"]:
        if key in names:
            index = names.index(key)
            if found[index] is None:
                found[index] = value
    return found


def compressed(parts: Sequence[bytes | memoryview], accept: bytes | None, headers: list[tuple[bytes, bytes]],
               media: bytes) -> Response:
    """The body ``parts``, compressed with gzip or deflate when the client accepts it (Triton's
    response compression), else sent as they are, each from its own buffer (a tensor's bytes are not
    copied into one body). ``accept``: the Accept-Encoding header; ``headers``: further headers as
    ASGI sends them; ``media``: the Content-Type."""
    accepted = {part.split(b";")[0].strip().lower() for part in accept.split(b",")} if accept else set()
    headers.append((b"content-type", media))
    if accepted & {b"gzip", b"deflate"}:
        content = b"".join(parts)
        if b"gzip" in accepted:
            parts = [gzip.compress(content, compresslevel=1)]
            headers.append((b"content-encoding", b"gzip"))
        else:
            parts = [zlib.compress(content, 1)]
            headers.append((b"content-encoding", b"deflate"))
    return WireResponse(parts, headers)


class WireResponse(Response):
    """A response given as it goes on the wire: its headers as ASGI sends them (lower-case name,
    value), and its body in parts, one ``http.response.body`` message each (sent from their own
    buffers), with the Content-Length of their sum. Nothing else is worked out per response
    (Starlette's ``init_headers`` is not run)."""

    def __init__(self, parts: Sequence[bytes | memoryview], headers: list[tuple[bytes, bytes]],
                 status_code: int = 200) -> None:
        self.status_code = status_code
        self.background = None
        self.body = b""
        self._parts = parts
        length = 0
        for part in parts:
            length += len(part)
        headers.append((b"content-length", b"%d" % length))
        self.raw_headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        last = len(self._parts) - 1
        for index, part in enumerate(self._parts):
            await send({"type": "http.response.body", "body": part, "more_body": index < last})
