"""Request bodies in (size limit, Content-Encoding) and response bodies out (Accept-Encoding), for every HTTP route."""

from __future__ import annotations

import gzip
import zlib

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

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
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"request body of {declared} bytes is over the {limit}-byte limit (--http-max-input-size)")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"request body is over the {limit}-byte limit (--http-max-input-size)")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone("the connection closed before the request body was received") from None
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise InvalidInput(f"unsupported Content-Encoding '{encoding}': use gzip or deflate")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as err:
        raise InvalidInput(f"corrupt {encoding} body: {err}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise TooLarge(f"decompressed request body is over the {limit}-byte limit (--http-max-input-size)")
    return data


def compressed(content: bytes, accept: str, headers: dict[str, str], media: str) -> Response:
    """Compress with gzip or deflate when the client accepts it (Triton's response compression)."""
    accepted = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    if "gzip" in accepted:
        content, headers = gzip.compress(content, compresslevel=1), {**headers, "Content-Encoding": "gzip"}
    elif "deflate" in accepted:
        content, headers = zlib.compress(content, 1), {**headers, "Content-Encoding": "deflate"}
    return Response(content, media_type=media, headers=headers)
