"""Request bodies in (size limit, Content-Encoding) and response bodies out (Accept-Encoding), for every HTTP route."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from kserve_v2.errors import ErrorCode, InvalidInput, ServerError, TooLarge


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


def compressed(content: bytes | Sequence[bytes | memoryview], accept: str, headers: dict[str, str], media: str
               ) -> Response:
    """Compress with gzip or deflate when the client accepts it (Triton's response compression).

    ``content``: the body, or its parts in order; uncompressed parts are sent as they are, each
    from its own buffer (a tensor's bytes are not copied into one body).
    """
    accepted = {part.split(";")[0].strip().lower() for part in accept.split(",")} if accept else set()
    if accepted & {"gzip", "deflate"}:
        content = content if isinstance(content, bytes) else b"".join(content)
        if "gzip" in accepted:
            content, headers = gzip.compress(content, compresslevel=1), {**headers, "Content-Encoding": "gzip"}
        else:
            content, headers = zlib.compress(content, 1), {**headers, "Content-Encoding": "deflate"}
    if isinstance(content, bytes):
        return Response(content, media_type=media, headers=headers)
    if len(content) == 1:
        return Response(bytes(content[0]), media_type=media, headers=headers)
    return PartsResponse(content, media, headers)


class PartsResponse(Response):
    """A response whose body is sent as several parts (one ``http.response.body`` message each),
    with the Content-Length of their sum."""

    def __init__(self, parts: Sequence[bytes | memoryview], media: str, headers: dict[str, str]) -> None:
        super().__init__(None, media_type=media, headers={**headers, "Content-Length": str(sum(len(p) for p in parts))})
        self._parts = parts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        last = len(self._parts) - 1
        for index, part in enumerate(self._parts):
            await send({"type": "http.response.body", "body": part, "more_body": index < last})
