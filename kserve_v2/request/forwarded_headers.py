"""Triton's ``--grpc-header-forward-pattern`` and ``--http-header-forward-pattern``: request headers
(gRPC metadata, HTTP headers) whose name the pattern finds become string parameters of the
inference request, as Triton's front ends forward them (``ForwardHeadersAsParameters``: a partial
match, RE2's ``PartialMatch``, here Python's ``re.search``). Both transports call ``forwarded`` on the
request they decoded, before the one inference call.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kserve_v2.codec.messages import InferRequest, RequestHeader, parameter


def forwarded(request: InferRequest, headers: Iterable[tuple[str, str | bytes]], pattern: re.Pattern[str] | None
              ) -> InferRequest:
    """``request`` with each text header whose name ``pattern`` finds as a string parameter of that
    name (names as the transport gives them: gRPC metadata and HTTP/1 and HTTP/2 header names are
    lower case). A parameter the request itself carries keeps its value; binary metadata (``-bin``) is
    not forwarded. The request's header is copied, never changed: decoded headers may be shared."""
    if pattern is None:
        return request
    found = {name: value for name, value in headers
             if isinstance(value, str) and name not in request.parameters and pattern.search(name)}
    if not found:
        return request
    header = request.header
    parameters = {**{name: parameter(value) for name, value in found.items()}, **header.parameters}
    copy = RequestHeader(header.model_name, header.model_version, parameters, header.inputs, header.outputs)
    return InferRequest(copy, request.id, request.raw_input_contents)
